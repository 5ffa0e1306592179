"""the InfiniBand fabric as each reporting node's ibnetdiscover saw it last

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-07 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ib_fabrics",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("reported_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("switches", sa.Integer(), nullable=False),
        sa.Column("cas", sa.Integer(), nullable=False),
        sa.Column("links", sa.Integer(), nullable=False),
        sa.Column("fabric", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_ib_fabrics_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ib_fabrics")),
        sa.UniqueConstraint("node_id", name=op.f("uq_ib_fabrics_node_id")),
    )
    op.create_index(op.f("ix_ib_fabrics_reported_at"), "ib_fabrics", ["reported_at"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_ib_fabrics_reported_at"), table_name="ib_fabrics")
    op.drop_table("ib_fabrics")
