"""software assets and advisories: package sets per content, each node's set, advisories, findings

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-30 15:35:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "advisories",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("key", sa.String(length=128), nullable=False),
        sa.Column("aliases", sa.Text(), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("source", sa.String(length=8), nullable=False),
        sa.Column("severity", sa.String(length=16), nullable=False),
        sa.Column("cvss_score", sa.Float(), nullable=True),
        sa.Column("cvss_vector", sa.String(length=256), nullable=True),
        sa.Column("published", sa.String(length=40), nullable=True),
        sa.Column("modified", sa.String(length=40), nullable=True),
        sa.Column("affected", sa.Text(), nullable=False),
        sa.Column("targets", sa.Text(), nullable=False),
        sa.Column("content_hash", sa.String(length=64), nullable=False),
        sa.Column("imported_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_advisories")),
    )
    op.create_index(op.f("ix_advisories_key"), "advisories", ["key"], unique=False)
    op.create_table(
        "software_sets",
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("packages", sa.LargeBinary(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("first_seen", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("digest", name=op.f("pk_software_sets")),
    )
    op.create_table(
        "findings",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("problem", sa.String(length=128), nullable=False),
        sa.Column("advisory_id", sa.String(length=128), nullable=False),
        sa.Column("also", sa.Text(), nullable=False),
        sa.Column("ecosystem", sa.String(length=32), nullable=False),
        sa.Column("package", sa.String(length=256), nullable=False),
        sa.Column("location", sa.String(length=256), nullable=False),
        sa.Column("installed", sa.String(length=256), nullable=False),
        sa.Column("fixed", sa.String(length=256), nullable=True),
        sa.Column("severity", sa.String(length=16), nullable=False),
        sa.Column("cvss_score", sa.Float(), nullable=True),
        sa.Column("notes", sa.Text(), nullable=False),
        sa.Column("signature", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("status_by", sa.String(length=128), nullable=True),
        sa.Column("status_reason", sa.String(length=1024), nullable=True),
        sa.Column("status_at", sa.Float(), nullable=True),
        sa.Column("first_seen", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"], name=op.f("fk_findings_node_id_nodes"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_findings")),
        sa.UniqueConstraint("node_id", "problem", "ecosystem", "package", "location", name=op.f("uq_findings_node_id")),
    )
    op.create_index(op.f("ix_findings_problem"), "findings", ["problem"], unique=False)
    op.create_index("ix_findings_status_severity", "findings", ["status", "severity"], unique=False)
    op.create_table(
        "node_software",
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("distro_ecosystem", sa.String(length=32), nullable=True),
        sa.Column("distro_release", sa.String(length=32), nullable=True),
        sa.Column("kernel", sa.String(length=128), nullable=True),
        sa.Column("reported_at", sa.Float(), nullable=False),
        sa.Column("changed_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["digest"], ["software_sets.digest"], name=op.f("fk_node_software_digest_software_sets")
        ),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_node_software_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("node_id", name=op.f("pk_node_software")),
    )
    op.create_index(op.f("ix_node_software_digest"), "node_software", ["digest"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_node_software_digest"), table_name="node_software")
    op.drop_table("node_software")
    op.drop_index("ix_findings_status_severity", table_name="findings")
    op.drop_index(op.f("ix_findings_problem"), table_name="findings")
    op.drop_table("findings")
    op.drop_table("software_sets")
    op.drop_index(op.f("ix_advisories_key"), table_name="advisories")
    op.drop_table("advisories")
