"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-29 22:07:45.533515
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leases",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("holder", sa.String(length=128), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_leases")),
    )
    op.create_table(
        "nodes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column(
            "state",
            sa.Enum("new", "up", "down", name="nodestate", native_enum=False, length=16),
            nullable=False,
        ),
        sa.Column("state_since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("category", sa.String(length=64), nullable=True),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=True),
        sa.Column("heartbeat_interval_s", sa.Float(), nullable=True),
        sa.Column("hostname", sa.String(length=253), nullable=True),
        sa.Column("cpus", sa.Integer(), nullable=True),
        sa.Column("cpu_model", sa.String(length=256), nullable=True),
        sa.Column("memory_total_mib", sa.Integer(), nullable=True),
        sa.Column("os_name", sa.String(length=256), nullable=True),
        sa.Column("kernel", sa.String(length=256), nullable=True),
        sa.Column("arch", sa.String(length=64), nullable=True),
        sa.Column("agent_version", sa.String(length=64), nullable=True),
        sa.Column("gpu_source", sa.String(length=16), nullable=True),
        sa.Column("inventory_fingerprint", sa.String(length=64), nullable=True),
        sa.Column("inventory_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_nodes")),
        sa.UniqueConstraint("name", name=op.f("uq_nodes_name")),
    )
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_nodes_state"), ["state"], unique=False)

    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column(
            "kind",
            sa.Enum("admin", "join", "node", name="tokenkind", native_enum=False, length=16),
            nullable=False,
        ),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("max_uses", sa.Integer(), nullable=True),
        sa.Column("uses", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_api_tokens_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_api_tokens_token_hash")),
    )
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_api_tokens_node_id"), ["node_id"], unique=False)

    op.create_table(
        "gpus",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("uuid", sa.String(length=96), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("serial", sa.String(length=256), nullable=True),
        sa.Column("pci_bus_id", sa.String(length=32), nullable=False),
        sa.Column("memory_total_mib", sa.Integer(), nullable=False),
        sa.Column("driver_version", sa.String(length=256), nullable=True),
        sa.Column("cuda_version", sa.String(length=256), nullable=True),
        sa.Column("vbios_version", sa.String(length=256), nullable=True),
        sa.Column("mig_mode", sa.String(length=16), nullable=True),
        sa.Column("ecc_mode", sa.String(length=16), nullable=True),
        sa.Column("compute_capability", sa.String(length=256), nullable=True),
        sa.Column("power_limit_w", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"], name=op.f("fk_gpus_node_id_nodes"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpus")),
        sa.UniqueConstraint("node_id", "index", name=op.f("uq_gpus_node_id")),
    )
    with op.batch_alter_table("gpus", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_gpus_node_id"), ["node_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_gpus_uuid"), ["uuid"], unique=False)

    op.create_table(
        "node_transitions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "from_state",
            sa.Enum("new", "up", "down", name="nodestate", native_enum=False, length=16),
            nullable=False,
        ),
        sa.Column(
            "to_state",
            sa.Enum("new", "up", "down", name="nodestate", native_enum=False, length=16),
            nullable=False,
        ),
        sa.Column("reason", sa.String(length=512), nullable=False),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_node_transitions_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_node_transitions")),
    )
    with op.batch_alter_table("node_transitions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_node_transitions_at"), ["at"], unique=False)
        batch_op.create_index(batch_op.f("ix_node_transitions_node_id"), ["node_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("node_transitions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_node_transitions_node_id"))
        batch_op.drop_index(batch_op.f("ix_node_transitions_at"))

    op.drop_table("node_transitions")
    with op.batch_alter_table("gpus", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_gpus_uuid"))
        batch_op.drop_index(batch_op.f("ix_gpus_node_id"))

    op.drop_table("gpus")
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_api_tokens_node_id"))

    op.drop_table("api_tokens")
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_nodes_state"))

    op.drop_table("nodes")
    op.drop_table("leases")
