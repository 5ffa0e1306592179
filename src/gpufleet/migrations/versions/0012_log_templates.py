"""log templates: what drain3 mined per node category, and each category's miner state and cursor

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-30 15:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "log_templates",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("category", sa.String(length=64), nullable=False),
        sa.Column("template_id", sa.Integer(), nullable=False),
        sa.Column("template", sa.Text(), nullable=False),
        sa.Column("first_seen", sa.Float(), nullable=False),
        sa.Column("first_node_id", sa.Integer(), nullable=True),
        sa.Column("last_seen", sa.Float(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("learned", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["first_node_id"], ["nodes.id"], name=op.f("fk_log_templates_first_node_id_nodes"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_log_templates")),
        sa.UniqueConstraint("category", "template_id", name=op.f("uq_log_templates_category")),
    )
    op.create_table(
        "log_miners",
        sa.Column("category", sa.String(length=64), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("cursor", sa.Integer(), nullable=False),
        sa.Column("state", sa.LargeBinary(), nullable=False),
        sa.Column("rates", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("category", name=op.f("pk_log_miners")),
    )


def downgrade() -> None:
    op.drop_table("log_miners")
    op.drop_table("log_templates")
