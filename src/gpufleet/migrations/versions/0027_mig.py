"""MIG: each GPU's MIG devices as reported, a job's MIG profile, and layouts asked of the agents

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-06 23:50:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("mig_sent_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("mig_answered", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("mig_errors", sa.JSON(), nullable=False, server_default="{}"))
    with op.batch_alter_table("gpus") as batch:
        batch.add_column(sa.Column("mig", sa.JSON(), nullable=False, server_default="[]"))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("gpu_profile", sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("gpu_profile")
    with op.batch_alter_table("gpus") as batch:
        batch.drop_column("mig")
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("mig_errors")
        batch.drop_column("mig_answered")
        batch.drop_column("mig_sent_at")
