"""Networks nodes boot and talk on, and each node's interface on them (address, MAC)."""

from __future__ import annotations

from sqlalchemy import BigInteger, ForeignKey, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from gpufleet.core.db import Base


class Network(Base):
    __tablename__ = "networks"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    cidr: Mapped[str] = mapped_column(String(64))  # 10.141.0.0/16
    range_start: Mapped[str] = mapped_column(String(64))  # the addresses gpufleet hands nodes, inclusive
    range_end: Mapped[str] = mapped_column(String(64))
    gateway: Mapped[str | None] = mapped_column(String(64))
    domain: Mapped[str | None] = mapped_column(String(253))
    boot_server: Mapped[str | None] = mapped_column(String(64))  # the TFTP/iPXE server (the head)
    boot_file: Mapped[str | None] = mapped_column(String(256))  # what PXE clients fetch first


class Interface(Base):
    """A node's interface on a network: its address (never shared on the network) and MAC."""

    __tablename__ = "interfaces"
    __table_args__ = (
        UniqueConstraint("network_id", "address"),
        UniqueConstraint("node_id", "network_id"),
        UniqueConstraint("mac"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), index=True)
    network_id: Mapped[int] = mapped_column(ForeignKey("networks.id", ondelete="RESTRICT"))
    name: Mapped[str] = mapped_column(String(32), default="boot")  # eth0, ens1f0, ...
    address: Mapped[str] = mapped_column(String(64))
    address_int: Mapped[int] = mapped_column(BigInteger)  # for ordering and finding the next free one
    mac: Mapped[str | None] = mapped_column(String(17))  # aa:bb:cc:dd:ee:ff, lower case
