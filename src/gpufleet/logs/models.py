"""Log records kept at the head: every line the agents read, with its classification when it is an event.

One row per line. Text search uses the database's own index: SQLite's FTS5 (an external-content table
kept by triggers) and PostgreSQL's full-text search (a GIN index on the line's tsvector); both are made
by migration 0011, beside this table. Times are Unix seconds.
"""

from __future__ import annotations

from sqlalchemy import Float, ForeignKey, Index, Integer, String, Text
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
