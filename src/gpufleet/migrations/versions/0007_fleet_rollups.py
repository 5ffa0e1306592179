"""fleet roll-ups, and a GPU summary per metric sample and roll-up

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-07 10:12:40.511204
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fleet_rollups",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("bucket", sa.Float(), nullable=False),
        sa.Column("values", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_fleet_rollups")),
    )
    with op.batch_alter_table("fleet_rollups", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_fleet_rollups_bucket"), ["bucket"], unique=True)
    for table in ("metric_samples", "metric_rollups"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("summary", sa.Text(), nullable=True))


def downgrade() -> None:
    for table in ("metric_samples", "metric_rollups"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column("summary")
    with op.batch_alter_table("fleet_rollups", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_fleet_rollups_bucket"))

    op.drop_table("fleet_rollups")
