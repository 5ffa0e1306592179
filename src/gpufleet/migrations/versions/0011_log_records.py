"""log records: every line the agents read, their events, and a full-text index on both backends

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-30 14:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "log_records",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("source", sa.String(length=128), nullable=False),
        sa.Column("line", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=True),
        sa.Column("code", sa.Integer(), nullable=True),
        sa.Column("severity", sa.String(length=16), nullable=True),
        sa.Column("action", sa.String(length=16), nullable=True),
        sa.Column("pci_bus", sa.String(length=16), nullable=True),
        sa.Column("device", sa.String(length=64), nullable=True),
        sa.Column("gpu", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_log_records_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_log_records")),
    )
    op.create_index("ix_log_records_node_ts", "log_records", ["node_id", "ts"], unique=False)
    op.create_index("ix_log_records_severity_ts", "log_records", ["severity", "ts"], unique=False)
    op.create_index(op.f("ix_log_records_ts"), "log_records", ["ts"], unique=False)
    op.create_index(op.f("ix_log_records_kind"), "log_records", ["kind"], unique=False)
    if op.get_bind().dialect.name == "sqlite":
        # FTS5 over the `line` column, its content read from log_records (no second copy of the text).
        op.execute("CREATE VIRTUAL TABLE log_records_fts USING fts5(line, content='log_records', content_rowid='id')")
        op.execute(
            "CREATE TRIGGER log_records_ai AFTER INSERT ON log_records BEGIN "
            "INSERT INTO log_records_fts(rowid, line) VALUES (new.id, new.line); END"
        )
        op.execute(
            "CREATE TRIGGER log_records_ad AFTER DELETE ON log_records BEGIN "
            "INSERT INTO log_records_fts(log_records_fts, rowid, line) VALUES ('delete', old.id, old.line); END"
        )
    else:
        op.execute("CREATE INDEX ix_log_records_line_fts ON log_records USING gin (to_tsvector('simple', line))")


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute("DROP TRIGGER log_records_ad")
        op.execute("DROP TRIGGER log_records_ai")
        op.execute("DROP TABLE log_records_fts")
    else:
        op.execute("DROP INDEX ix_log_records_line_fts")
    op.drop_index(op.f("ix_log_records_kind"), table_name="log_records")
    op.drop_index(op.f("ix_log_records_ts"), table_name="log_records")
    op.drop_index("ix_log_records_severity_ts", table_name="log_records")
    op.drop_index("ix_log_records_node_ts", table_name="log_records")
    op.drop_table("log_records")
