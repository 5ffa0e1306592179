"""token roles

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 23:49:06.422207
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "role",
                sa.Enum("admin", "operator", "member", "viewer", "node", name="role", native_enum=False, length=16),
                nullable=False,
                server_default="admin",
            )
        )
    # Tokens from before roles were all full-access admin tokens, or node credentials.
    op.execute("UPDATE api_tokens SET role = 'node' WHERE kind = 'node'")


def downgrade() -> None:
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.drop_column("role")
