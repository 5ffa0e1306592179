"""directory users: where each user comes from, their home, memberships a directory gave, sync status

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-06 05:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("users") as batch:
        batch.add_column(sa.Column("home", sa.String(length=256), nullable=True))
        batch.add_column(sa.Column("source", sa.String(length=16), server_default="local", nullable=False))
        batch.add_column(sa.Column("source_id", sa.String(length=512), nullable=True))
        batch.add_column(sa.Column("synced_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("project_members") as batch:
        batch.add_column(sa.Column("from_directory", sa.Boolean(), server_default=sa.false(), nullable=False))
    op.create_table(
        "directory_syncs",
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("attempted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("succeeded_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("users", sa.Integer(), nullable=False),
        sa.Column("changed", sa.Integer(), nullable=False),
        sa.Column("problems", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("source", name=op.f("pk_directory_syncs")),
    )


def downgrade() -> None:
    op.drop_table("directory_syncs")
    with op.batch_alter_table("project_members") as batch:
        batch.drop_column("from_directory")
    with op.batch_alter_table("users") as batch:
        batch.drop_column("synced_at")
        batch.drop_column("source_id")
        batch.drop_column("source")
        batch.drop_column("home")
