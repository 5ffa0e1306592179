"""models and datasets (artifacts), what each node caches, inference services and their replicas

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-01 02:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "artifacts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("version", sa.String(length=32), nullable=False),
        sa.Column("framework", sa.String(length=32), nullable=True),
        sa.Column("format", sa.String(length=32), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("licence", sa.String(length=64), nullable=False),
        sa.Column("source", sa.String(length=512), nullable=False),
        sa.Column("location", sa.String(length=1024), nullable=False),
        sa.Column("project", sa.String(length=63), nullable=True),
        sa.Column("shared_with", sa.JSON(), nullable=False),
        sa.Column("description", sa.String(length=512), nullable=False),
        sa.Column("created_by", sa.String(length=160), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_artifacts")),
        sa.UniqueConstraint("kind", "name", "version", name=op.f("uq_artifacts_kind")),
    )
    op.create_index(op.f("ix_artifacts_sha256"), "artifacts", ["sha256"])
    op.create_index(op.f("ix_artifacts_project"), "artifacts", ["project"])
    op.create_table(
        "node_artifacts",
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("copied_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("uses", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_node_artifacts_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("node_id", "sha256", name=op.f("pk_node_artifacts")),
    )
    op.create_index(op.f("ix_node_artifacts_sha256"), "node_artifacts", ["sha256"])
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("artifacts", sa.JSON(), nullable=False, server_default="[]"))
    op.create_table(
        "inference_services",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("project", sa.String(length=63), nullable=True),
        sa.Column("user", sa.String(length=32), nullable=False),
        sa.Column("created_by", sa.String(length=160), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("replicas", sa.Integer(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("health_path", sa.String(length=256), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("restarts", sa.Integer(), nullable=False),
        sa.Column("crashes", sa.Integer(), nullable=False),
        sa.Column("retry_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("message", sa.String(length=512), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_inference_services")),
        sa.UniqueConstraint("name", name=op.f("uq_inference_services_name")),
    )
    op.create_index(op.f("ix_inference_services_project"), "inference_services", ["project"])
    op.create_table(
        "service_replicas",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("service_id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("port", sa.Integer(), nullable=False),
        sa.Column("address", sa.String(length=300), nullable=True),
        sa.Column("healthy", sa.Boolean(), nullable=False),
        sa.Column("ever_healthy", sa.Boolean(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("checked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["service_id"],
            ["inference_services.id"],
            name=op.f("fk_service_replicas_service_id_inference_services"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_service_replicas_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_service_replicas")),
        sa.UniqueConstraint("job_id", name=op.f("uq_service_replicas_job_id")),
    )
    op.create_index(op.f("ix_service_replicas_service_id"), "service_replicas", ["service_id"])
    # CPU-only environments: no CUDA, so no NVIDIA driver needed.
    with op.batch_alter_table("environments") as batch:
        batch.alter_column("cuda", existing_type=sa.String(length=16), nullable=True)
        batch.alter_column("min_driver", existing_type=sa.String(length=32), nullable=True)


def downgrade() -> None:
    op.execute("DELETE FROM environments WHERE cuda IS NULL OR min_driver IS NULL")
    with op.batch_alter_table("environments") as batch:
        batch.alter_column("min_driver", existing_type=sa.String(length=32), nullable=False)
        batch.alter_column("cuda", existing_type=sa.String(length=16), nullable=False)
    op.drop_table("service_replicas")
    op.drop_table("inference_services")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("artifacts")
    op.drop_table("node_artifacts")
    op.drop_table("artifacts")
