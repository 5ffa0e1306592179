"""networks and node interfaces: addresses nodes are given, MACs, and what network boot serves

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-30 16:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "networks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("cidr", sa.String(length=64), nullable=False),
        sa.Column("range_start", sa.String(length=64), nullable=False),
        sa.Column("range_end", sa.String(length=64), nullable=False),
        sa.Column("gateway", sa.String(length=64), nullable=True),
        sa.Column("domain", sa.String(length=253), nullable=True),
        sa.Column("boot_server", sa.String(length=64), nullable=True),
        sa.Column("boot_file", sa.String(length=256), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_networks")),
        sa.UniqueConstraint("name", name=op.f("uq_networks_name")),
    )
    op.create_table(
        "interfaces",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("network_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("address", sa.String(length=64), nullable=False),
        sa.Column("address_int", sa.BigInteger(), nullable=False),
        sa.Column("mac", sa.String(length=17), nullable=True),
        sa.ForeignKeyConstraint(
            ["network_id"], ["networks.id"], name=op.f("fk_interfaces_network_id_networks"), ondelete="RESTRICT"
        ),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_interfaces_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_interfaces")),
        sa.UniqueConstraint("mac", name=op.f("uq_interfaces_mac")),
        sa.UniqueConstraint("network_id", "address", name=op.f("uq_interfaces_network_id")),
        sa.UniqueConstraint("node_id", "network_id", name=op.f("uq_interfaces_node_id")),
    )
    op.create_index(op.f("ix_interfaces_node_id"), "interfaces", ["node_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_interfaces_node_id"), table_name="interfaces")
    op.drop_table("interfaces")
    op.drop_table("networks")
