"""Storing and searching log records (the head's side; the agents classify, see `classify`).

`search` filters by node, time range, severity (at least), kind and text. Text goes to the database's
full-text index: FTS5 on SQLite (every word must appear; each is quoted, so a user's `"`, `*` or `NEAR`
is a word, not syntax) and `plainto_tsquery` on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from sqlalchemy import delete, func, insert, select, text
from sqlalchemy.orm import Session

from gpufleet.inventory.models import Gpu, Node
from gpufleet.logs.models import LogRecord, LogTemplate

SEVERITIES = ("info", "warning", "critical")


class Found(NamedTuple):
    record: LogRecord
    node: str
    gpu_uuid: str | None


_FTS5_MATCH = "SELECT rowid FROM log_records_fts WHERE log_records_fts MATCH :q"  # models.FTS_TABLE
MAX_RESULTS = 5000


def write_records(session: Session, rows: Sequence[dict[str, Any]]) -> None:
    """Insert in one executemany (rows of nodes removed meanwhile are the caller's to filter)."""
    if rows:
        session.execute(insert(LogRecord), list(rows))


def prune(session: Session, before: float) -> None:
    """Lines older than `before`, and templates last seen before it (drain3 may still hold them: seen
    again, they get a fresh row, counted from then)."""
    session.execute(delete(LogRecord).where(LogRecord.ts < before))
    session.execute(delete(LogTemplate).where(LogTemplate.last_seen < before))


def _fts5_query(words: str) -> str:
    return " ".join('"' + word.replace('"', '""') + '"' for word in words.split())


def search(
    session: Session,
    *,
    node: str | None = None,
    since: float | None = None,
    until: float | None = None,
    min_severity: str | None = None,
    kind: str | None = None,
    events_only: bool = False,
    text_query: str | None = None,
    limit: int = 500,
) -> list[Found]:
    """Newest first. Raises ValueError for an unknown severity."""
    # The GPU's UUID from the inventory: the agent named the GPU by index, from its PCI address.
    query = (
        select(LogRecord, Node.name, Gpu.uuid)
        .join(Node, Node.id == LogRecord.node_id)
        .outerjoin(Gpu, (Gpu.node_id == LogRecord.node_id) & (Gpu.index == LogRecord.gpu))
    )
    if node is not None:
        query = query.where(Node.name == node)
    if since is not None:
        query = query.where(LogRecord.ts >= since)
    if until is not None:
        query = query.where(LogRecord.ts < until)
    if min_severity is not None:
        if min_severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {', '.join(SEVERITIES)}")
        query = query.where(LogRecord.severity.in_(SEVERITIES[SEVERITIES.index(min_severity) :]))
    if kind is not None:
        query = query.where(LogRecord.kind == kind)
    elif events_only:
        query = query.where(LogRecord.kind.is_not(None))
    if text_query and text_query.split():
        if session.get_bind().dialect.name == "sqlite":
            matching = text(_FTS5_MATCH).bindparams(q=_fts5_query(text_query))
            query = query.where(LogRecord.id.in_(matching.columns(rowid=LogRecord.id.type)))
        else:
            query = query.where(
                func.to_tsvector("simple", LogRecord.line).op("@@")(func.plainto_tsquery("simple", text_query))
            )
    query = query.order_by(LogRecord.ts.desc(), LogRecord.id.desc()).limit(min(limit, MAX_RESULTS))
    return [Found(record, name, uuid) for record, name, uuid in session.execute(query).all()]
