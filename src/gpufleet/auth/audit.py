"""The audit log: who did what, to what, from where, with what result. Append-only.

Records are written by the API's audit middleware for every mutating request and every login
attempt; there is no way to change or delete one through the API.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Integer, String, func, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from gpufleet.core.clock import Clock, to_datetime
from gpufleet.core.db import Base, UTCDateTime

MAX_LISTED = 10_000


class AuditRecord(Base):
    __tablename__ = "audit_records"

    id: Mapped[int] = mapped_column(primary_key=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    actor: Mapped[str] = mapped_column(String(160), index=True)  # "token:bootstrap", "node:gpu001", "anonymous"
    action: Mapped[str] = mapped_column(String(128))  # e.g. "nodes.add", "agent.join", "web.login"
    target: Mapped[str] = mapped_column(String(512))
    source: Mapped[str] = mapped_column(String(64))  # client address
    result: Mapped[int] = mapped_column(Integer)  # the HTTP status the request ended with


def record(
    session: Session, clock: Clock, *, actor: str, action: str, target: str, source: str, result: int
) -> AuditRecord:
    row = AuditRecord(
        at=to_datetime(clock.now()),
        actor=actor[:160],
        action=action[:128],
        target=target[:512],
        source=source[:64],
        result=result,
    )
    session.add(row)
    return row


def list_records(
    session: Session,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    actor: str | None = None,
    action: str | None = None,
    results: tuple[int, int] | None = None,
    offset: int = 0,
    limit: int = 1000,
) -> list[AuditRecord]:
    """Newest first: records in [since, until], by exactly `actor`, whose action contains `action`
    (any case), whose result (HTTP status) is within `results`, after skipping `offset` of them."""
    query = (
        select(AuditRecord)
        .order_by(AuditRecord.at.desc(), AuditRecord.id.desc())
        .offset(offset)
        .limit(min(limit, MAX_LISTED))
    )
    if since is not None:
        query = query.where(AuditRecord.at >= since)
    if until is not None:
        query = query.where(AuditRecord.at <= until)
    if actor is not None:
        query = query.where(AuditRecord.actor == actor)
    if action:
        query = query.where(func.lower(AuditRecord.action).contains(action.lower(), autoescape=True))
    if results is not None:
        query = query.where(AuditRecord.result.between(*results))
    return list(session.scalars(query))
