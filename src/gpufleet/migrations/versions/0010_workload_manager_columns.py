"""jobs run by an external workload manager (Slurm), and its word for each node

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-30 09:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("backend", sa.String(length=16), server_default="builtin", nullable=False))
        batch_op.add_column(sa.Column("external_id", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("partition", sa.String(length=64), nullable=True))
        batch_op.create_index(batch_op.f("ix_jobs_external_id"), ["external_id"], unique=False)
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("wlm_state", sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("wlm_state")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_jobs_external_id"))
        batch_op.drop_column("partition")
        batch_op.drop_column("external_id")
        batch_op.drop_column("backend")
