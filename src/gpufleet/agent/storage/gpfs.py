"""GPFS (IBM Storage Scale) where the node runs it: `mmhealth node show -Y` and `mmdf FS -Y`, parsed purely.

`-Y` is Scale's machine-readable form: colon-separated records, each kind announced by a HEADER line
naming its fields (`mmhealth:State:HEADER:version:reserved:reserved:node:component:entityname:...`),
values percent-encoded (`%3A` for `:`). mmdf gives sizes in KiB.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

MM_DIR = "/usr/lpp/mmfs/bin"  # where Scale installs its commands; not on a default PATH
HEALTH_CODES: dict[str, int] = {"HEALTHY": 0, "TIPS": 1, "DEGRADED": 1, "FAILED": 2}


def parse_y(text: str) -> list[tuple[str, str, dict[str, str]]]:
    """(command, record kind, fields by header name) for each data line of -Y output."""
    headers: dict[tuple[str, str], list[str]] = {}
    rows: list[tuple[str, str, dict[str, str]]] = []
    for line in text.splitlines():
        parts = line.rstrip("\n").split(":")
        if len(parts) < 3:
            continue
        command, kind = parts[0], parts[1]
        if parts[2] == "HEADER":
            headers[(command, kind)] = parts
            continue
        names = headers.get((command, kind))
        if names is None:
            continue
        rows.append((command, kind, {n: unquote(v) for n, v in zip(names[2:], parts[2:], strict=False) if n}))
    return rows


@dataclass(frozen=True)
class HealthState:
    component: str
    entity: str
    entity_type: str
    status: str


def parse_mmhealth(text: str) -> list[HealthState]:
    """`mmhealth node show -Y`: the State records (events are left out)."""
    return [
        HealthState(f.get("component", ""), f.get("entityname", ""), f.get("entitytype", ""), f.get("status", ""))
        for command, kind, f in parse_y(text)
        if command == "mmhealth" and kind == "State"
    ]


def parse_mmdf(text: str) -> dict[str, dict[str, str]]:
    """`mmdf FS -Y`: the one-record kinds (fsTotal, metadata, data, inode) by kind; per-NSD and per-pool
    records are left out."""
    return {kind: f for command, kind, f in parse_y(text) if command == "mmdf" and kind not in ("nsd", "poolTotal")}


def _code(status: str) -> float:
    return float(HEALTH_CODES.get(status.upper(), 3))


def gpfs_values(device: str, health: list[HealthState], df: dict[str, dict[str, str]]) -> dict[str, float]:
    """The `gpfs_*` metrics (protocol.metrics.FS_METRICS) of file system `device`."""
    out: dict[str, float] = {}
    for state in health:
        if state.component == "FILESYSTEM" and state.entity_type == "FILESYSTEM" and state.entity == device:
            out["gpfs_health"] = _code(state.status)
        elif state.component == "NODE" and state.entity_type == "NODE":
            out["gpfs_node_health"] = _code(state.status)
    try:
        if "metadata" in df:
            out["gpfs_metadata_size_bytes"] = float(df["metadata"]["totalMetadata"]) * 1024
            out["gpfs_metadata_free_bytes"] = float(df["metadata"]["freeBlocks"]) * 1024
        if "inode" in df:
            out["gpfs_inodes_max"] = float(df["inode"]["maxInodes"])
            out["gpfs_inodes_used"] = float(df["inode"]["usedInodes"])
    except (KeyError, ValueError):
        pass  # a record with fields missing or not numbers: left out, the rest kept
    return out
