"""job arrays: each task's array job id (indexed), task id and the array's throttle

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-01 05:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("array_job_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("array_task_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("array_throttle", sa.Integer(), nullable=True))
        batch.create_index(batch.f("ix_jobs_array_job_id"), ["array_job_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index(batch.f("ix_jobs_array_job_id"))
        batch.drop_column("array_throttle")
        batch.drop_column("array_task_id")
        batch.drop_column("array_job_id")
