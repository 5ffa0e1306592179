"""BMCs, their encrypted credentials and the power state they report

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-30 18:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "bmcs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("protocol", sa.String(length=16), nullable=False),
        sa.Column("address", sa.String(length=512), nullable=False),
        sa.Column("port", sa.Integer(), nullable=True),
        sa.Column("system_id", sa.String(length=256), nullable=True),
        sa.Column("verify_tls", sa.Boolean(), nullable=False),
        sa.Column("username", sa.String(length=64), nullable=False),
        sa.Column("password_sealed", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("power_state", sa.String(length=16), nullable=True),
        sa.Column("power_read_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.String(length=512), nullable=True),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"], name=op.f("fk_bmcs_node_id_nodes"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_bmcs")),
        sa.UniqueConstraint("node_id", name=op.f("uq_bmcs_node_id")),
    )


def downgrade() -> None:
    op.drop_table("bmcs")
