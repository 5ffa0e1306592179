"""runtime environments, and the environment and driver each job needs

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-30 23:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "environments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("version", sa.String(length=32), nullable=False),
        sa.Column("image", sa.String(length=512), nullable=True),
        sa.Column("python_prefix", sa.String(length=1024), nullable=True),
        sa.Column("cuda", sa.String(length=16), nullable=False),
        sa.Column("pytorch", sa.String(length=32), nullable=True),
        sa.Column("cudnn", sa.String(length=32), nullable=True),
        sa.Column("nccl", sa.String(length=32), nullable=True),
        sa.Column("min_driver", sa.String(length=32), nullable=False),
        sa.Column("driver_given", sa.Boolean(), nullable=False),
        sa.Column("description", sa.String(length=512), nullable=False),
        sa.Column("created_by", sa.String(length=160), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_environments")),
        sa.UniqueConstraint("name", "version", name=op.f("uq_environments_name")),
    )
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("environment", sa.String(length=160), nullable=True))
        batch.add_column(sa.Column("min_driver", sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("min_driver")
        batch.drop_column("environment")
    op.drop_table("environments")
