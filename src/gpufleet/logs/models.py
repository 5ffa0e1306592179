"""Log records kept at the head: every line the agents read, with its classification when it is an event.

One row per line. Text search uses the database's own index: SQLite's FTS5 (an external-content table
kept by triggers) and PostgreSQL's full-text search (a GIN index on the line's tsvector); both are made
by migration 0011, beside this table. Times are Unix seconds.
"""

from __future__ import annotations

from sqlalchemy import Float, ForeignKey, Index, Integer, LargeBinary, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from gpufleet.core.db import Base

FTS_TABLE = "log_records_fts"  # SQLite
FTS_INDEX = "ix_log_records_line_fts"  # PostgreSQL


class LogRecord(Base):
    __tablename__ = "log_records"
    __table_args__ = (
        Index("ix_log_records_node_ts", "node_id", "ts"),
        Index("ix_log_records_severity_ts", "severity", "ts"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    ts: Mapped[float] = mapped_column(Float, index=True)  # the line's own time, else when it was read
    source: Mapped[str] = mapped_column(String(128))
    line: Mapped[str] = mapped_column(Text)
    kind: Mapped[str | None] = mapped_column(String(32), index=True)  # None: an ordinary line
    code: Mapped[int | None] = mapped_column(Integer)
    severity: Mapped[str | None] = mapped_column(String(16))
    action: Mapped[str | None] = mapped_column(String(16))
    pci_bus: Mapped[str | None] = mapped_column(String(16))
    device: Mapped[str | None] = mapped_column(String(64))
    gpu: Mapped[int | None] = mapped_column(Integer)


class LogTemplate(Base):
    """A template mined from a node category's lines (see `templates`): when it was first and last seen."""

    __tablename__ = "log_templates"
    __table_args__ = (UniqueConstraint("category", "template_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    category: Mapped[str] = mapped_column(String(64))  # "" for nodes without a category
    template_id: Mapped[int] = mapped_column(Integer)  # drain3's cluster id within the category
    template: Mapped[str] = mapped_column(Text)
    first_seen: Mapped[float] = mapped_column(Float)
    first_node_id: Mapped[int | None] = mapped_column(ForeignKey("nodes.id", ondelete="SET NULL"))
    last_seen: Mapped[float] = mapped_column(Float)
    count: Mapped[int] = mapped_column(Integer)
    learned: Mapped[bool] = mapped_column(default=False)  # first seen while the category was learning


class LogMiner(Base):
    """A category's drain3 state and template rates, and how far the miner has read `log_records`."""

    __tablename__ = "log_miners"

    category: Mapped[str] = mapped_column(String(64), primary_key=True)
    started_at: Mapped[float] = mapped_column(Float)  # learning lasts log_template_learning_s from here
    cursor: Mapped[int] = mapped_column(Integer)  # the last log_records.id mined
    state: Mapped[bytes] = mapped_column(LargeBinary)
    rates: Mapped[str] = mapped_column(Text)
