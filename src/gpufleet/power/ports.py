"""What gpufleet needs of a BMC, whatever speaks to it (Redfish over HTTPS, IPMI over RMCP+).

Every failure of a BMC client is one `BmcError`: a bulk action records it as that node's failure and
goes on with the others. The protocol is synchronous on purpose: a bulk action runs each node on a
worker thread of its task (`tasks.runner.TaskContext.fan_out`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol

from gpufleet.core.errors import Unavailable

PROTOCOLS = ("redfish", "ipmi")
IPMI_PORT = 623


class PowerState(enum.StrEnum):
    ON = "on"
    OFF = "off"
    UNKNOWN = "unknown"  # powering on or off, paused, or a state the BMC does not name


class BmcError(Unavailable):
    """The BMC did not answer, refused the credentials, or refused or failed the request."""


@dataclass(frozen=True)
class BmcTarget:
    """How to reach one BMC, with its password in the clear: built just before use, never stored."""

    protocol: str
    address: str
    username: str
    password: str = field(repr=False)
    port: int | None = None
    system_id: str | None = None
    verify_tls: bool = True


class BmcClient(Protocol):
    """One BMC. Actions return once the BMC accepted them; the state changes later (poll `power_state`)."""

    def power_state(self) -> PowerState: ...

    def power_on(self) -> None: ...

    def power_off(self) -> None:
        """Off now (no graceful shutdown of the OS)."""
        ...

    def power_cycle(self) -> None:
        """Off, then on again."""
        ...

    def reset(self) -> None:
        """A hard reset (warm reboot) without taking power away."""
        ...
