"""This node's LLDP neighbours, from lldpd: `lldpctl -f json`, parsed into `LinkNeighbor`s.

lldpctl's JSON changes shape with what it describes. One interface is an object, several a list of
one-key objects; a port with two neighbours appears twice in that list under the same name. A chassis is
keyed by its system name, or is the bare object when the neighbour sends none. A value is a string, a list
where there are several (two management addresses), an object with `type` and `value` for IDs. lldpd 0.9
put `ttl` under the chassis, 1.0 under the port; `-f json0` (and Cumulus's `net show lldp json`) wraps
every value in a list of `{"value": ...}` and names interfaces in a `name` key. All of these are read.

Running it: an argument list, a timeout, lldpctl looked for in the sbin directories too. A node without
lldpd (no lldpctl, or no lldpd socket to talk to) has no neighbours to report, which is not an error: the
reason is logged once, and again only when it changes, so a node without lldpd logs one line, not one
per inventory pass.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pydantic import ValidationError

from gpufleet.protocol.topology import (
    ADDRESS_MAX,
    INTERFACE_MAX,
    LLDP_TEXT_MAX,
    MAX_MANAGEMENT_ADDRESSES,
    MAX_NEIGHBORS,
    LinkNeighbor,
    LinkProtocol,
)

log = logging.getLogger(__name__)

PROGRAM = "lldpctl"
TIMEOUT_S = 5.0
SBIN_DIRS = ("/usr/local/sbin", "/usr/sbin", "/sbin")
# How a runner is called: (argument list, timeout in seconds) -> the finished process.
Runner = Callable[[Sequence[str], float], subprocess.CompletedProcess[bytes]]

_PROTOCOLS: dict[str, LinkProtocol] = {
    "lldp": "lldp",
    "cdpv1": "cdp",
    "cdpv2": "cdp",
    "cdp": "cdp",
    "edp": "edp",
    "fdp": "fdp",
    "sonmp": "sonmp",
}
# The keys of a chassis object itself (not a chassis keyed by its system name).
_CHASSIS_KEYS = frozenset({"id", "name", "descr", "ttl", "mgmt-ip", "mgmt-iface", "capability"})
# The time lldpctl's log lines start with: "2026-12-06T17:38:55 [WARN/control] unable to connect ...".
_LOG_STAMP = re.compile(r"^\d{4}-\d\d-\d\dT[\d:]+\s+")


class LldpParseError(ValueError):
    """lldpctl's output is not JSON, or not the shape lldpctl writes."""


def parse_lldpctl_json(text: str) -> list[LinkNeighbor]:
    """The neighbours in `lldpctl -f json` (or `-f json0`) output, sorted by local interface, chassis and
    port, duplicates dropped, at most MAX_NEIGHBORS. Values are cut to the protocol's bounds; a neighbour
    that names neither its chassis, its system nor its port is left out.

    Raises LldpParseError where the text is not JSON or has no top-level "lldp".
    """
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise LldpParseError(f"not JSON: {exc}") from None
    if not isinstance(document, dict) or "lldp" not in document:
        raise LldpParseError('no top-level "lldp" object')
    root = _first(document["lldp"])
    if root is None:
        return []
    if not isinstance(root, dict):
        raise LldpParseError('"lldp" is neither an object nor a list of one')
    found: dict[str, LinkNeighbor] = {}
    for interface, body in _interfaces(root.get("interface")):
        neighbor = _neighbor(interface, body)
        if neighbor is not None:
            found.setdefault(neighbor.model_dump_json(), neighbor)
    ordered = sorted(found.values(), key=_order)
    return ordered[:MAX_NEIGHBORS]


def _order(n: LinkNeighbor) -> tuple[str, ...]:
    return (n.local_interface, n.chassis_id or "", n.port_id or "", n.system_name or "", n.port_description or "")


def _first(value: Any) -> Any:
    """json0 wraps single values in a list: the first element of a list, or the value itself."""
    if isinstance(value, list):
        return value[0] if value else None
    return value


def _interfaces(value: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """(interface name, its neighbour's object) for every entry, whatever the nesting."""
    if isinstance(value, list):
        for item in value:
            yield from _interfaces(item)
    elif isinstance(value, dict):
        name = value.get("name")
        if isinstance(name, str) and ("chassis" in value or "port" in value or "via" in value):
            yield name, value  # json0: the interface's name is a key of its own object
            return
        for key, body in value.items():
            for item in body if isinstance(body, list) else [body]:
                if isinstance(item, dict):
                    yield str(key), item


def _text(value: Any) -> str | None:
    """A string value: as written, or json0's [{"value": ...}], or an object's "value"."""
    value = _first(value)
    if isinstance(value, dict):
        value = value.get("value")
    if isinstance(value, bool) or value is None:
        return None
    return str(value) if isinstance(value, str | int | float) else None


def _texts(value: Any) -> list[str]:
    """Every string of a value that is one string, a list of them, or json0's list of {"value": ...}."""
    items = value if isinstance(value, list) else [value]
    return [text for text in (_text(item) for item in items) if text is not None]


def _ident(value: Any) -> tuple[str | None, str | None]:
    """(type, value) of an ID: {"type": "mac", "value": ...}, json0's list of one, or a bare string."""
    value = _first(value)
    if isinstance(value, dict):
        kind = value.get("type")
        return (str(kind) if isinstance(kind, str) else None), _text(value.get("value"))
    return None, _text(value)


def _looks_like_id(value: Any) -> bool:
    value = _first(value)
    return isinstance(value, str) or (isinstance(value, dict) and ("value" in value or "type" in value))


def _chassis(value: Any) -> tuple[str | None, dict[str, Any]]:
    """(system name, the chassis object): a chassis keyed by its system name, a bare chassis (the neighbour
    sent no name), or json0's list holding one with a "name" inside."""
    value = _first(value)
    if not isinstance(value, dict) or not value:
        return None, {}
    if _looks_like_id(value.get("id")) or set(value) <= _CHASSIS_KEYS:
        return _text(value.get("name")), value
    for name, body in value.items():
        if isinstance(body, dict):
            return str(name), body
    return None, {}


def _clip(value: str | None, size: int = LLDP_TEXT_MAX) -> str | None:
    if value is None:
        return None
    value = value.strip()
    return value[:size] if value else None


def _neighbor(interface: str, body: dict[str, Any]) -> LinkNeighbor | None:
    """One neighbour on `interface`, or None where it names nothing (or breaks a bound after cutting)."""
    local = _clip(interface, INTERFACE_MAX)
    if local is None:
        return None
    system_name, chassis = _chassis(body.get("chassis"))
    chassis_type, chassis_id = _ident(chassis.get("id"))
    port = _first(body.get("port"))
    port = port if isinstance(port, dict) else {}
    port_type, port_id = _ident(port.get("id"))
    addresses: list[str] = []
    for address in _texts(chassis.get("mgmt-ip")):
        clipped = _clip(address, ADDRESS_MAX)
        if clipped and clipped not in addresses:
            addresses.append(clipped)
    via = (_text(body.get("via")) or "LLDP").lower()
    fields = {
        "local_interface": local,
        "chassis_id": _clip(chassis_id),
        "chassis_id_type": _clip(chassis_type, 32),
        "system_name": _clip(system_name),
        "system_description": _clip(_text(chassis.get("descr"))),
        "port_id": _clip(port_id),
        "port_id_type": _clip(port_type, 32),
        "port_description": _clip(_text(port.get("descr"))),
        "management_addresses": addresses[:MAX_MANAGEMENT_ADDRESSES],
        "protocol": _PROTOCOLS.get(via, "lldp"),
    }
    if not (fields["chassis_id"] or fields["system_name"] or fields["port_id"]):
        return None
    try:
        return LinkNeighbor.model_validate(fields)
    except ValidationError:  # cut to the bounds above; kept as a guard against what cutting cannot fix
        return None


def find_lldpctl(program: str = PROGRAM) -> str | None:
    """lldpctl's path: on PATH, or in the sbin directories a user's PATH leaves out on Debian."""
    if os.sep in program:
        return program if os.access(program, os.X_OK) else None
    return shutil.which(program) or shutil.which(program, path=os.pathsep.join(SBIN_DIRS))


def run_program(args: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[bytes]:
    """Run `args` (lldpctl first) with an argument list, never a shell, capturing its output.

    Raises FileNotFoundError where lldpctl is not installed, subprocess.TimeoutExpired when it outlives
    the timeout (it is killed), OSError when it cannot be started.
    """
    program = find_lldpctl(args[0])
    if program is None:
        raise FileNotFoundError(2, "not found on PATH or in the sbin directories", args[0])
    return subprocess.run([program, *args[1:]], capture_output=True, timeout=timeout_s, check=False)


class LldpNeighbors:
    """This node's LLDP neighbours, read from lldpd through lldpctl at each call.

    `socket` names lldpd's control socket (`lldpctl -u`; None: lldpd's default, /run/lldpd.socket);
    `run` replaces the process launcher in tests.
    """

    def __init__(
        self,
        socket: str | None = None,
        *,
        program: str = PROGRAM,
        timeout_s: float = TIMEOUT_S,
        run: Runner | None = None,
    ) -> None:
        self.socket = socket
        self.program = program
        self.timeout_s = timeout_s
        self._run = run or run_program
        self._problem: str | None = None  # the kind of the last failure logged; None while lldpctl answers

    def command(self) -> list[str]:
        """The argument list run: `lldpctl [-u SOCKET] -f json`."""
        return [self.program, *(["-u", self.socket] if self.socket else []), "-f", "json"]

    def __call__(self) -> list[LinkNeighbor]:
        return self.read()

    def read(self) -> list[LinkNeighbor]:
        """The neighbours lldpd knows now. Never raises: where lldpctl is missing, cannot reach lldpd,
        hangs or prints something else, the node has no neighbours to report, and the reason is logged
        (once per kind of reason)."""
        try:
            done = self._run(self.command(), self.timeout_s)
        except FileNotFoundError:
            return self._none("absent", logging.INFO, "lldpctl is not installed (no lldpd on this node)")
        except subprocess.TimeoutExpired:
            return self._none("timeout", logging.WARNING, f"lldpctl did not answer within {self.timeout_s:g} s")
        except OSError as exc:
            return self._none("start", logging.WARNING, f"lldpctl could not be started: {exc}")
        if done.returncode != 0:
            said = _last_line(done.stderr) or _last_line(done.stdout) or "no message"
            return self._none(
                "exit", logging.INFO, f"lldpctl exited with status {done.returncode} ({said}): is lldpd running?"
            )
        try:
            found = parse_lldpctl_json(done.stdout.decode("utf-8", errors="replace"))
        except LldpParseError as exc:
            return self._none("parse", logging.WARNING, f"lldpctl's output was not understood: {exc}")
        if self._problem is not None:
            log.info("lldpctl answers again: %d LLDP neighbour(s)", len(found))
            self._problem = None
        return found

    def _none(self, kind: str, level: int, why: str) -> list[LinkNeighbor]:
        """No neighbours, because `why`: logged at `level` the first time this kind of reason is seen
        in a row, at debug level after that."""
        log.log(level if kind != self._problem else logging.DEBUG, "no LLDP neighbours reported: %s", why)
        self._problem = kind
        return []


def _last_line(output: bytes | None) -> str:
    """The last non-empty line of a program's output, without lldpctl's leading timestamp, at most 200
    characters."""
    lines = [line.strip() for line in (output or b"").decode("utf-8", errors="replace").splitlines() if line.strip()]
    return _LOG_STAMP.sub("", lines[-1])[:200] if lines else ""
