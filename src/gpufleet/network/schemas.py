"""API shapes for switches and topology. Secrets (the v2c community, the v3 keys) are write-only: `SwitchIn`
takes them, nothing returns them."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, StringConstraints, model_validator

from gpufleet.protocol.topology import IbCa, IbLink

SwitchName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")]
Address = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9.:_-]{1,255}$")]  # a host name, IPv4 or IPv6
AuthProtocol = Literal["md5", "sha", "sha256", "sha512"]
PrivProtocol = Literal["des", "aes", "aes256"]


class SwitchIn(BaseModel):
    """A switch to poll: where, and with which SNMP credential (v2c community, or v3 user and keys)."""

    model_config = ConfigDict(extra="forbid")

    name: SwitchName
    address: Address
    port: int = Field(161, ge=1, le=65535)
    version: Literal["2c", "3"] = "2c"
    community: SecretStr | None = Field(None, min_length=1, max_length=128, description="v2c; stored encrypted")
    v3_user: str | None = Field(None, min_length=1, max_length=64)
    v3_auth_protocol: AuthProtocol | None = None
    v3_auth_key: SecretStr | None = Field(None, min_length=8, max_length=128, description="stored encrypted")
    v3_priv_protocol: PrivProtocol | None = None
    v3_priv_key: SecretStr | None = Field(None, min_length=8, max_length=128, description="stored encrypted")
    expected_speed_mbps: int | None = Field(
        None, ge=1, le=10_000_000, description="a port with a node behind it running slower than this is reported"
    )

    @model_validator(mode="after")
    def _one_credential(self) -> SwitchIn:
        v3 = (self.v3_user, self.v3_auth_protocol, self.v3_auth_key, self.v3_priv_protocol, self.v3_priv_key)
        if self.version == "2c":
            if self.community is None:
                raise ValueError("SNMP v2c needs a community")
            if any(v is not None for v in v3):
                raise ValueError("v3 user, protocols and keys are for version 3, not 2c")
            return self
        if self.community is not None:
            raise ValueError("a community is for SNMP v2c; version 3 takes a user and keys")
        if self.v3_user is None:
            raise ValueError("SNMP v3 needs a user")
        if (self.v3_auth_protocol is None) != (self.v3_auth_key is None):
            raise ValueError("an authentication protocol and its key go together")
        if (self.v3_priv_protocol is None) != (self.v3_priv_key is None):
            raise ValueError("a privacy protocol and its key go together")
        if self.v3_priv_protocol is not None and self.v3_auth_protocol is None:
            raise ValueError("privacy (encryption) needs authentication too")
        return self


class PortOut(BaseModel):
    """One switch port: its state, speed and last rates, and who is plugged in."""

    if_index: int
    name: str
    alias: str
    admin_up: bool
    oper_up: bool
    oper_status: str
    speed_mbps: int | None
    changed_at: datetime | None
    rates: dict[str, float]
    neighbor_system: str | None
    neighbor_port: str | None
    node: str | None
    node_interface: str | None
    node_state: str | None
    node_health: str | None


class SwitchOut(BaseModel):
    """A switch as the API shows it: everything but its secrets."""

    name: str
    address: str
    port: int
    version: str
    v3_user: str | None
    v3_auth_protocol: str | None
    v3_priv_protocol: str | None
    expected_speed_mbps: int | None
    sys_name: str | None
    sys_descr: str | None
    uptime_s: float | None
    polled_at: datetime | None
    last_error: str | None
    ports_total: int
    ports_up: int
    nodes: int  # nodes found behind its ports
    sensors: list[dict[str, Any]]


class SwitchDetail(SwitchOut):
    ports: list[PortOut]


class NodeLinkOut(BaseModel):
    """Where one of a node's ports is plugged: the switch and its port, as the switch's LLDP and/or the
    node's own lldpd say (`seen_by`), or as the InfiniBand fabric's ibnetdiscover says: then the interface
    is the HCA and its port ("mlx5_0/1"), the switch its NodeDescription, `switch_guid` its node GUID and
    `rate` the link's width and speed ("4xHDR")."""

    interface: str | None
    switch: str | None
    switch_port: str | None
    system_name: str | None
    port_id: str | None
    seen_by: list[Literal["switch", "node", "ibnetdiscover"]]
    switch_guid: str | None = None
    rate: str | None = None


class IbPeerOut(BaseModel):
    """What is on the other end of an InfiniBand switch port: a channel adapter (its host, the node of that
    name where there is one, its device and port) or another switch (its description and port)."""

    guid: str
    port: int
    kind: Literal["switch", "ca", "router"]
    description: str
    host: str | None = None
    device: str | None = None
    node: str | None = None  # the registered node whose name or host name is `host`


class IbPortOut(BaseModel):
    number: int
    peer: IbPeerOut
    width: int | None
    speed: str | None
    rate_gbps: float | None


class IbSwitchOut(BaseModel):
    guid: str
    description: str
    lid: int | None
    port_count: int
    ports: list[IbPortOut]  # the cabled ones, by number


class FabricReporterOut(BaseModel):
    """One node that reports the fabric, and what it reported last."""

    node: str
    digest: str
    reported_at: datetime
    changed_at: datetime
    switches: int
    cas: int
    links: int


class FabricOut(BaseModel):
    """The InfiniBand fabric as the newest report has it (`reported_by` and `reported_at`; all None and
    empty before any node reported one), its switches with each cabled port, and every reporting node."""

    reported_by: str | None
    reported_at: datetime | None
    digest: str | None
    switches: list[IbSwitchOut]
    cas: list[IbCa]
    links: list[IbLink]
    reporters: list[FabricReporterOut]
