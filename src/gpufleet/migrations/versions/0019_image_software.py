"""what each software image holds, and the advisories that affect it

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-30 19:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "image_software",
        sa.Column("image", sa.String(length=128), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("distro_ecosystem", sa.String(length=32), nullable=True),
        sa.Column("distro_release", sa.String(length=32), nullable=True),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("changed_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["digest"], ["software_sets.digest"], name=op.f("fk_image_software_digest_software_sets")
        ),
        sa.PrimaryKeyConstraint("image", name=op.f("pk_image_software")),
    )
    op.create_index(op.f("ix_image_software_digest"), "image_software", ["digest"], unique=False)
    op.create_table(
        "image_findings",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("image", sa.String(length=128), nullable=False),
        sa.Column("problem", sa.String(length=128), nullable=False),
        sa.Column("advisory_id", sa.String(length=128), nullable=False),
        sa.Column("ecosystem", sa.String(length=32), nullable=False),
        sa.Column("package", sa.String(length=256), nullable=False),
        sa.Column("location", sa.String(length=256), nullable=False),
        sa.Column("installed", sa.String(length=256), nullable=False),
        sa.Column("fixed", sa.String(length=256), nullable=True),
        sa.Column("severity", sa.String(length=16), nullable=False),
        sa.Column("cvss_score", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_image_findings")),
        sa.UniqueConstraint(
            "image", "problem", "ecosystem", "package", "location", name=op.f("uq_image_findings_image")
        ),
    )
    op.create_index(op.f("ix_image_findings_problem"), "image_findings", ["problem"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_image_findings_problem"), table_name="image_findings")
    op.drop_table("image_findings")
    op.drop_index(op.f("ix_image_software_digest"), table_name="image_software")
    op.drop_table("image_software")
