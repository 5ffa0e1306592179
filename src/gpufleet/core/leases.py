"""A leadership lease in the database, so that of several head replicas exactly one runs the singleton loops.

The holder renews the lease well before it expires; a replica that finds it expired takes it. The
compare-and-set is one UPDATE with the old holder and expiry in its WHERE clause, so two replicas
racing for it cannot both win on either SQLite or PostgreSQL.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import String, delete, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, Session, mapped_column

from gpufleet.core.clock import to_datetime
from gpufleet.core.db import Base, UTCDateTime


class Lease(Base):
    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(128))
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())


def try_acquire(session: Session, name: str, holder: str, now: float, ttl_s: float) -> bool:
    """Take or renew the lease `name` for `holder`; True if `holder` holds it afterwards."""
    expires = to_datetime(now + ttl_s)
    result = session.execute(
        update(Lease)
        .where(Lease.name == name, or_(Lease.holder == holder, Lease.expires_at < to_datetime(now)))
        .values(holder=holder, expires_at=expires)
    )
    if result.rowcount == 1:  # type: ignore[attr-defined]
        return True
    if session.scalar(select(Lease.name).where(Lease.name == name)) is not None:
        return False
    try:
        with session.begin_nested():
            session.execute(insert(Lease).values(name=name, holder=holder, expires_at=expires))
    except IntegrityError:
        return False  # another replica inserted it first
    return True


def release(session: Session, name: str, holder: str) -> None:
    """Give the lease up on clean shutdown, so a standby takes over at once."""
    session.execute(delete(Lease).where(Lease.name == name, Lease.holder == holder))


def holder_of(session: Session, name: str, now: float) -> str | None:
    lease = session.get(Lease, name)
    if lease is None or lease.expires_at < to_datetime(now):
        return None
    return lease.holder
