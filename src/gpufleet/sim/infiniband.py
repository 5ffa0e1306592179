"""Simulated InfiniBand ports: an `IbSource` answering with the text the kernel's sysfs files hold.

The agent's real `IbCollector` reads them, parsing included. A healthy port reads like the ports of
a real H100 node (tests/fixtures/infiniband/ib-sysfs-h100-snapshot.csv): "4: ACTIVE", "5: LinkUp",
"400 Gb/sec (4X NDR)". `ib-down` takes one port down the way a pulled cable or a dead switch port
does: "1: DOWN", "2: Polling", the rate falling back to 40 Gb/s (as ibstat showed for the down ports
in ibstat.47.0.some.down.0) and `link_downed` counting one more.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufleet.core.errors import InvalidInput

_UP = ("4: ACTIVE\n", "5: LinkUp\n", "400 Gb/sec (4X NDR)\n")
_DOWN = ("1: DOWN\n", "2: Polling\n", "40 Gb/sec (4X QDR)\n")
MAX_SIMULATED_PORTS = 16


@dataclass(slots=True)
class _Port:
    device: str
    number: int
    down: bool = False
    counters: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            ("link_downed", "symbol_error", "link_error_recovery", "port_rcv_errors", "port_xmit_discards"), 0
        )
    )


class SimulatedInfiniband:
    """`ports` single-port adapters, mlx5_0 upwards, as on an HGX node's compute fabric.

    Raises ValueError for a port count outside 0..MAX_SIMULATED_PORTS.
    """

    def __init__(self, ports: int = 4) -> None:
        if not 0 <= ports <= MAX_SIMULATED_PORTS:
            raise ValueError(f"ports must be between 0 and {MAX_SIMULATED_PORTS}, not {ports}")
        self._ports = [_Port(f"mlx5_{i}", 1) for i in range(ports)]
        self._by_key = {(p.device, p.number): p for p in self._ports}

    # IbSource

    def ports(self) -> list[tuple[str, int]]:
        """(device, port) of every simulated port."""
        return [(p.device, p.number) for p in self._ports]

    def read(self, device: str, port: int, attribute: str) -> str | None:
        """The file's text as the kernel writes it; None for a file the simulator does not have."""
        found = self._by_key.get((device, port))
        if found is None:
            return None
        state, phys_state, rate = _DOWN if found.down else _UP
        if attribute == "state":
            return state
        if attribute == "phys_state":
            return phys_state
        if attribute == "rate":
            return rate
        counter = attribute.removeprefix("counters/")
        return f"{found.counters[counter]}\n" if counter in found.counters else None

    # Faults

    def inject(self, kind: str, port: int | None = None) -> str:
        """`ib-down`: take port number `port` in the list (default the first) down. Raises InvalidInput for
        another kind, a port the node does not have, or one already down."""
        if kind != "ib-down":
            raise InvalidInput(f"the simulated InfiniBand ports have no fault {kind!r}")
        position = 0 if port is None else port
        if not 0 <= position < len(self._ports):
            raise InvalidInput(f"this node has no InfiniBand port {position} (it has {len(self._ports)})")
        target = self._ports[position]
        if target.down:
            raise InvalidInput(f"{target.device} port {target.number} is already down")
        target.down = True
        target.counters["link_downed"] += 1
        return f"{target.device} port {target.number} is down (Polling)"

    def heal(self) -> str:
        """Bring every port back up; counters keep counting."""
        down = [p for p in self._ports if p.down]
        for p in down:
            p.down = False
        return f"{len(down)} InfiniBand port(s) up again"
