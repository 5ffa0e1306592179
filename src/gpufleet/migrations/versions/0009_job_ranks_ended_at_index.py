"""an index on job ranks' end

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30 07:48:17.173562
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job_ranks", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_job_ranks_ended_at"), ["ended_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("job_ranks", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_ranks_ended_at"))
