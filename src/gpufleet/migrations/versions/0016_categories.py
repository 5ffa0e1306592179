"""categories with inherited settings (defaults < category < node)

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-30 18:30:00

Nodes keep naming their category in `nodes.category`; every distinct name already there gets a
`categories` row with no settings, so each existing node's category exists and its settings are the
defaults, as they were.
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    categories = op.create_table(
        "categories",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("description", sa.String(length=512), nullable=False),
        sa.Column("settings", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_categories")),
        sa.UniqueConstraint("name", name=op.f("uq_categories_name")),
    )
    with op.batch_alter_table("nodes") as batch_op:
        batch_op.add_column(sa.Column("settings", sa.JSON(), nullable=False, server_default="{}"))
    nodes = sa.table("nodes", sa.column("category", sa.String()))
    names = op.get_bind().execute(sa.select(nodes.c.category).where(nodes.c.category.is_not(None)).distinct())
    now = datetime.now(UTC)
    rows = [
        {"name": name, "description": "", "settings": {}, "created_at": now, "updated_at": now} for (name,) in names
    ]
    if rows:
        op.bulk_insert(categories, sorted(rows, key=lambda r: r["name"]))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch_op:
        batch_op.drop_column("settings")
    op.drop_table("categories")
