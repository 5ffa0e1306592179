"""What the head remembers of each directory source's last sync, for the admin's view."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from gpufleet.core.db import Base, UTCDateTime


class DirectorySync(Base):
    """One row per source ("ldap", "oidc"): when it was last read, what that changed, and what could not be
    mapped (a group naming a missing project, a directory user whose name or uid a local user holds)."""

    __tablename__ = "directory_syncs"

    source: Mapped[str] = mapped_column(String(16), primary_key=True)
    attempted_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    succeeded_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    error: Mapped[str] = mapped_column(Text, default="")  # why the last attempt failed; empty after a success
    users: Mapped[int] = mapped_column(Integer, default=0)  # directory users the last success saw
    changed: Mapped[int] = mapped_column(Integer, default=0)  # users it created, changed or disabled
    problems: Mapped[list[str]] = mapped_column(JSON, default=list)
