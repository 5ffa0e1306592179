"""Burn-in groups: how many nodes a multi-node step measures together (2: pairs, as before)

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-08 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("burnin_steps") as batch:
        batch.add_column(sa.Column("group_size", sa.Integer(), nullable=False, server_default="2"))
    # Every multi-node step so far ran in pairs; a single-node step measures one node.
    op.execute("UPDATE burnin_steps SET group_size = 1 WHERE kind NOT IN ('allreduce', 'network')")


def downgrade() -> None:
    with op.batch_alter_table("burnin_steps") as batch:
        batch.drop_column("group_size")
