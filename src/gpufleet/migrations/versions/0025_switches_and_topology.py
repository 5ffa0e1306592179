"""switches over SNMP, their ports, and the LLDP neighbours nodes see

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-06 18:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "switches",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("address", sa.String(length=255), nullable=False),
        sa.Column("port", sa.Integer(), nullable=False),
        sa.Column("snmp_version", sa.String(length=4), nullable=False),
        sa.Column("v3_user", sa.String(length=64), nullable=True),
        sa.Column("v3_auth_protocol", sa.String(length=16), nullable=True),
        sa.Column("v3_priv_protocol", sa.String(length=16), nullable=True),
        sa.Column("secrets_sealed", sa.Text(), nullable=False),
        sa.Column("expected_speed_mbps", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("sys_name", sa.String(length=255), nullable=True),
        sa.Column("sys_descr", sa.String(length=512), nullable=True),
        sa.Column("uptime_s", sa.Float(), nullable=True),
        sa.Column("sensors", sa.JSON(), nullable=False),
        sa.Column("polled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.String(length=512), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_switches")),
        sa.UniqueConstraint("name", name=op.f("uq_switches_name")),
    )
    op.create_table(
        "switch_ports",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("switch_id", sa.Integer(), nullable=False),
        sa.Column("if_index", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("alias", sa.String(length=256), nullable=False),
        sa.Column("admin_up", sa.Boolean(), nullable=False),
        sa.Column("oper_up", sa.Boolean(), nullable=False),
        sa.Column("oper_status", sa.String(length=32), nullable=False),
        sa.Column("speed_mbps", sa.Integer(), nullable=True),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("counters", sa.JSON(), nullable=False),
        sa.Column("rates", sa.JSON(), nullable=False),
        sa.Column("neighbor_system", sa.String(length=255), nullable=True),
        sa.Column("neighbor_port", sa.String(length=255), nullable=True),
        sa.Column("neighbor_chassis", sa.String(length=255), nullable=True),
        sa.Column("node_id", sa.Integer(), nullable=True),
        sa.Column("node_interface", sa.String(length=64), nullable=True),
        sa.ForeignKeyConstraint(
            ["switch_id"], ["switches.id"], name=op.f("fk_switch_ports_switch_id_switches"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_switch_ports_node_id_nodes"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_switch_ports")),
        sa.UniqueConstraint("switch_id", "if_index", name=op.f("uq_switch_ports_switch_id")),
    )
    op.create_index(op.f("ix_switch_ports_switch_id"), "switch_ports", ["switch_id"], unique=False)
    op.create_table(
        "node_neighbors",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("interface", sa.String(length=64), nullable=False),
        sa.Column("chassis_id", sa.String(length=255), nullable=True),
        sa.Column("system_name", sa.String(length=255), nullable=True),
        sa.Column("port_id", sa.String(length=255), nullable=True),
        sa.Column("port_description", sa.String(length=255), nullable=True),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_node_neighbors_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_node_neighbors")),
    )
    op.create_index(op.f("ix_node_neighbors_node_id"), "node_neighbors", ["node_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_node_neighbors_node_id"), table_name="node_neighbors")
    op.drop_table("node_neighbors")
    op.drop_index(op.f("ix_switch_ports_switch_id"), table_name="switch_ports")
    op.drop_table("switch_ports")
    op.drop_table("switches")
