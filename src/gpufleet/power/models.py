"""The `bmcs` table: how to reach each node's BMC, its credentials sealed, and the power state it last reported."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from gpufleet.core.db import Base, UTCDateTime


class Bmc(Base):
    """One node's baseboard management controller. The password is stored only sealed
    (`core.credentials`: Fernet with the head's key file), never in the clear, and never returned."""

    __tablename__ = "bmcs"

    id: Mapped[int] = mapped_column(primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), unique=True)
    protocol: Mapped[str] = mapped_column(String(16))  # redfish | ipmi
    # Redfish: the BMC's base URL (https://10.140.0.12); IPMI: its host name or address.
    address: Mapped[str] = mapped_column(String(512))
    port: Mapped[int | None] = mapped_column(Integer, default=None)  # IPMI's UDP port (623 when None)
    # Redfish: the ComputerSystem's id under /redfish/v1/Systems; None: the BMC's only system.
    system_id: Mapped[str | None] = mapped_column(String(256), default=None)
    verify_tls: Mapped[bool] = mapped_column(Boolean, default=True)
    username: Mapped[str] = mapped_column(String(64))
    password_sealed: Mapped[str] = mapped_column(Text)  # a Fernet token: encrypted and authenticated
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # What the BMC said last (on, off, unknown) and when; the last error reading or acting on it.
    power_state: Mapped[str | None] = mapped_column(String(16), default=None)
    power_read_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    last_error: Mapped[str | None] = mapped_column(String(512), default=None)
