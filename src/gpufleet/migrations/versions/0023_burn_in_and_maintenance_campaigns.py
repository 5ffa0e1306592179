"""burn-in runs and their steps, maintenance campaigns and their nodes, and nodes.hold

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-05 21:59:17.089059
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table(
        "campaigns",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("actions", sa.JSON(), nullable=False),
        sa.Column("policy", sa.JSON(), nullable=False),
        sa.Column("selector", sa.JSON(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("reason", sa.String(length=1024), nullable=False),
        sa.Column("created_by", sa.String(length=160), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_campaigns")),
        sa.UniqueConstraint("name", name=op.f("uq_campaigns_name")),
    )
    with op.batch_alter_table("campaigns", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_campaigns_state"), ["state"], unique=False)

    op.create_table(
        "burnins",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=True),
        sa.Column("node", sa.String(length=64), nullable=False),
        sa.Column("profile", sa.String(length=64), nullable=False),
        sa.Column("batch", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.String(length=1024), nullable=False),
        sa.Column("gpu_model", sa.String(length=128), nullable=True),
        sa.Column("resume_on_pass", sa.Boolean(), nullable=False),
        sa.Column("campaign_id", sa.Integer(), nullable=True),
        sa.Column("requested_by", sa.String(length=160), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"], name=op.f("fk_burnins_node_id_nodes"), ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_burnins")),
    )
    with op.batch_alter_table("burnins", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_burnins_batch"), ["batch"], unique=False)
        batch_op.create_index(batch_op.f("ix_burnins_campaign_id"), ["campaign_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_burnins_created_at"), ["created_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_burnins_node"), ["node"], unique=False)
        batch_op.create_index(batch_op.f("ix_burnins_node_id"), ["node_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_burnins_state"), ["state"], unique=False)

    op.create_table(
        "campaign_nodes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("campaign_id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=True),
        sa.Column("node", sa.String(length=64), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("canary", sa.Boolean(), nullable=False),
        sa.Column("phase", sa.String(length=16), nullable=False),
        sa.Column("action", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=True),
        sa.Column("burnin_id", sa.Integer(), nullable=True),
        sa.Column("drained_here", sa.Boolean(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("waiting_since", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["campaign_id"], ["campaigns.id"], name=op.f("fk_campaign_nodes_campaign_id_campaigns"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_campaign_nodes_node_id_nodes"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_campaign_nodes")),
        sa.UniqueConstraint("campaign_id", "node", name=op.f("uq_campaign_nodes_campaign_id")),
    )
    with op.batch_alter_table("campaign_nodes", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_campaign_nodes_campaign_id"), ["campaign_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_campaign_nodes_node_id"), ["node_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_campaign_nodes_phase"), ["phase"], unique=False)

    op.create_table(
        "burnin_steps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("burnin_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("argv", sa.JSON(), nullable=False),
        sa.Column("time_limit_s", sa.Float(), nullable=False),
        sa.Column("thresholds", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("partner", sa.String(length=64), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("unit", sa.String(length=16), nullable=False),
        sa.Column("threshold", sa.Float(), nullable=True),
        sa.Column("better", sa.String(length=8), nullable=False),
        sa.Column("detail", sa.String(length=1024), nullable=False),
        sa.Column("evidence", sa.JSON(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["burnin_id"], ["burnins.id"], name=op.f("fk_burnin_steps_burnin_id_burnins"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_burnin_steps")),
        sa.UniqueConstraint("burnin_id", "name", name=op.f("uq_burnin_steps_burnin_id")),
    )
    with op.batch_alter_table("burnin_steps", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_burnin_steps_burnin_id"), ["burnin_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_burnin_steps_job_id"), ["job_id"], unique=False)

    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("hold", sa.String(length=32), nullable=True))
        batch_op.create_index(batch_op.f("ix_nodes_hold"), ["hold"], unique=False)


def downgrade() -> None:

    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_nodes_hold"))
        batch_op.drop_column("hold")
    with op.batch_alter_table("burnin_steps", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_burnin_steps_job_id"))
        batch_op.drop_index(batch_op.f("ix_burnin_steps_burnin_id"))

    op.drop_table("burnin_steps")
    with op.batch_alter_table("campaign_nodes", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_campaign_nodes_phase"))
        batch_op.drop_index(batch_op.f("ix_campaign_nodes_node_id"))
        batch_op.drop_index(batch_op.f("ix_campaign_nodes_campaign_id"))

    op.drop_table("campaign_nodes")
    with op.batch_alter_table("burnins", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_burnins_state"))
        batch_op.drop_index(batch_op.f("ix_burnins_node_id"))
        batch_op.drop_index(batch_op.f("ix_burnins_node"))
        batch_op.drop_index(batch_op.f("ix_burnins_created_at"))
        batch_op.drop_index(batch_op.f("ix_burnins_campaign_id"))
        batch_op.drop_index(batch_op.f("ix_burnins_batch"))

    op.drop_table("burnins")
    with op.batch_alter_table("campaigns", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_campaigns_state"))

    op.drop_table("campaigns")
