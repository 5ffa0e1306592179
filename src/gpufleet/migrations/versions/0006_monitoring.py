"""monitoring

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30 00:48:21.733880
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "alert_rules",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("metric", sa.String(length=64), nullable=False),
        sa.Column("entity_kind", sa.String(length=8), nullable=False),
        sa.Column("op", sa.String(length=2), nullable=False),
        sa.Column("threshold", sa.Float(), nullable=False),
        sa.Column("for_s", sa.Float(), nullable=False),
        sa.Column("severity", sa.String(length=16), nullable=False),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_rules")),
        sa.UniqueConstraint("name", name=op.f("uq_alert_rules_name")),
    )
    op.create_table(
        "health_policies",
        sa.Column("category", sa.String(length=64), nullable=False),
        sa.Column("policy", sa.JSON(), nullable=False),
        sa.Column("updated_by", sa.String(length=128), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("category", name=op.f("pk_health_policies")),
    )
    op.create_table(
        "alert_receivers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_receivers")),
        sa.UniqueConstraint("name", name=op.f("uq_alert_receivers_name")),
    )
    op.create_table(
        "silences",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("rule", sa.String(length=64), nullable=True),
        sa.Column("node_name", sa.String(length=64), nullable=True),
        sa.Column("author", sa.String(length=128), nullable=False),
        sa.Column("comment", sa.String(length=512), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_silences")),
    )
    with op.batch_alter_table("silences", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_silences_expires_at"), ["expires_at"], unique=False)

    op.create_table(
        "alerts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("rule", sa.String(length=64), nullable=False),
        sa.Column("severity", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=True),
        sa.Column("node_name", sa.String(length=64), nullable=False),
        sa.Column("gpu", sa.Integer(), nullable=True),
        sa.Column("summary", sa.String(length=512), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("starts_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ends_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("acked_by", sa.String(length=128), nullable=True),
        sa.Column("acked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("silenced", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"], name=op.f("fk_alerts_node_id_nodes"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alerts")),
    )
    with op.batch_alter_table("alerts", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_alerts_fingerprint"), ["fingerprint"], unique=False)
        batch_op.create_index(batch_op.f("ix_alerts_node_id"), ["node_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_alerts_status"), ["status"], unique=False)

    op.create_table(
        "metric_rollups",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("bucket", sa.Float(), nullable=False),
        sa.Column("values", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_metric_rollups_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_metric_rollups")),
    )
    with op.batch_alter_table("metric_rollups", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_metric_rollups_bucket"), ["bucket"], unique=False)
        batch_op.create_index("ix_metric_rollups_node_bucket", ["node_id", "bucket"], unique=False)

    op.create_table(
        "metric_samples",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("values", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_metric_samples_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_metric_samples")),
    )
    with op.batch_alter_table("metric_samples", schema=None) as batch_op:
        batch_op.create_index("ix_metric_samples_node_ts", ["node_id", "ts"], unique=False)
        batch_op.create_index(batch_op.f("ix_metric_samples_ts"), ["ts"], unique=False)

    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("expected_gpus", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("health", sa.String(length=16), nullable=False, server_default="unknown"))
        batch_op.add_column(sa.Column("health_reasons", sa.JSON(), nullable=False, server_default="[]"))
        batch_op.add_column(sa.Column("health_since", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("drained_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("drain_reason", sa.String(length=512), nullable=True))
        batch_op.add_column(sa.Column("drained_by", sa.String(length=128), nullable=True))


def downgrade() -> None:
    op.drop_table("health_policies")
    op.drop_table("alert_rules")
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("drained_by")
        batch_op.drop_column("drain_reason")
        batch_op.drop_column("drained_at")
        batch_op.drop_column("health_since")
        batch_op.drop_column("health_reasons")
        batch_op.drop_column("health")
        batch_op.drop_column("expected_gpus")

    with op.batch_alter_table("metric_samples", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_metric_samples_ts"))
        batch_op.drop_index("ix_metric_samples_node_ts")

    op.drop_table("metric_samples")
    with op.batch_alter_table("metric_rollups", schema=None) as batch_op:
        batch_op.drop_index("ix_metric_rollups_node_bucket")
        batch_op.drop_index(batch_op.f("ix_metric_rollups_bucket"))

    op.drop_table("metric_rollups")
    with op.batch_alter_table("alerts", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_alerts_status"))
        batch_op.drop_index(batch_op.f("ix_alerts_node_id"))
        batch_op.drop_index(batch_op.f("ix_alerts_fingerprint"))

    op.drop_table("alerts")
    with op.batch_alter_table("silences", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_silences_expires_at"))

    op.drop_table("silences")
    op.drop_table("alert_receivers")
