"""users

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29 23:52:38.515577
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("username", sa.String(length=32), nullable=False),
        sa.Column("full_name", sa.String(length=128), nullable=False),
        sa.Column(
            "role",
            sa.Enum("admin", "operator", "member", "viewer", "node", name="role", native_enum=False, length=16),
            nullable=False,
        ),
        sa.Column("password_hash", sa.String(length=256), nullable=True),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("uid", sa.Integer(), nullable=False),
        sa.Column("gid", sa.Integer(), nullable=False),
        sa.Column("shell", sa.String(length=128), nullable=False),
        sa.Column("ssh_keys", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_users")),
        sa.UniqueConstraint("uid", name=op.f("uq_users_uid")),
        sa.UniqueConstraint("username", name=op.f("uq_users_username")),
    )
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.add_column(sa.Column("user_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("scope", sa.String(length=8), nullable=False, server_default="write"))
        batch_op.create_index(batch_op.f("ix_api_tokens_user_id"), ["user_id"], unique=False)
        batch_op.create_foreign_key(
            batch_op.f("fk_api_tokens_user_id_users"), "users", ["user_id"], ["id"], ondelete="CASCADE"
        )


def downgrade() -> None:
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("fk_api_tokens_user_id_users"), type_="foreignkey")
        batch_op.drop_index(batch_op.f("ix_api_tokens_user_id"))
        batch_op.drop_column("scope")
        batch_op.drop_column("user_id")

    op.drop_table("users")
