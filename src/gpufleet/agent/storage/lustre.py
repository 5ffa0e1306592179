"""Lustre as a client sees it: `lctl get_param` and `lfs df`, parsed purely, and the argv that reads them.

- `lctl get_param osc.*.state mdc.*.state`: each import's `current_state` (FULL when connected; IDLE
  when an idle import let its connection go, which is healthy too; DISCONN, CONNECTING, REPLAY ... not).
- `lctl get_param llite.*.stats`: per client mount, `NAME COUNT samples [UNIT] MIN MAX SUM [SUMSQ]`
  lines: how many calls and, for [usecs], how long they took; read_bytes and write_bytes in [bytes].
- `lfs df --lazy PATH`: each MDT's and OST's 1K-blocks, used, available (lazy: a target the client is
  not connected to is listed as unavailable instead of being waited for).

A device name is `FSNAME-OST0000-osc-INSTANCE` (or `-MDT0000-mdc-`, and `-osc-MDT0000` on a server);
a client mount's llite instance is `FSNAME-INSTANCE`; the mount's source (mountinfo) ends in `:/FSNAME`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

LCTL_PARAMS = ("osc.*.state", "mdc.*.state", "llite.*.stats")
HEALTHY_IMPORTS = frozenset({"FULL", "IDLE"})
_TARGET = re.compile(r"^(?P<fs>[A-Za-z0-9_.]+)-(?P<target>(?:OST|MDT)[0-9a-fA-F]{4})-(?:osc|mdc)")
_STATS_LINE = re.compile(r"^(?P<name>\S+)\s+(?P<count>\d+)\s+samples\s+\[(?P<unit>[^\]]+)\](?P<rest>.*)$")
_DF_LINE = re.compile(
    r"^(?P<uuid>\S+?)_UUID\s+(?P<total>\d+)\s+(?P<used>\d+)\s+(?P<avail>\d+)\s+(?P<pct>\d+)%\s+"
    r"(?P<mount>\S+?)\[(?P<kind>MDT|OST):(?P<index>\d+)\]\s*$"
)
_DF_SUMMARY = re.compile(r"^filesystem[ _]summary:\s+\d+\s+\d+\s+\d+\s+\d+%\s+(?P<mount>\S+)\s*$")
_DF_UNAVAILABLE = re.compile(r"^(?P<name>\S+?)(?:_UUID)?\s*:\s*(?P<why>\D.*)$")


def fsname_of(source: str) -> str:
    """The Lustre file system name of a mount source (`10.0.0.1@o2ib:/scratch` -> `scratch`)."""
    return source.rpartition(":/")[2].strip("/") if ":/" in source else source


@dataclass(frozen=True)
class Import:
    fsname: str
    target: str  # OST0000, MDT0000
    state: str


def parse_import_states(text: str) -> list[Import]:
    """`lctl get_param osc.*.state mdc.*.state` (YAML-ish blocks) as one Import per device; also takes
    the older `*.ost_server_uuid=UUID STATE` form."""
    found: list[Import] = []
    device: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if "=" in line and not line.startswith("-"):
            name, _, value = line.partition("=")
            parts = name.split(".")
            device = parts[1] if len(parts) >= 3 else None
            if name.endswith(".ost_server_uuid") and device is not None:
                words = value.split()
                match = _TARGET.match(device)
                if match and len(words) >= 2:
                    found.append(Import(match["fs"], match["target"], words[1]))
                device = None
            continue
        if device is not None and line.startswith("current_state:"):
            match = _TARGET.match(device)
            if match:
                found.append(Import(match["fs"], match["target"], line.partition(":")[2].strip()))
            device = None
    return found


@dataclass(frozen=True)
class StatLine:
    count: int
    unit: str
    total: float | None  # the SUM column, where the line has one


def parse_llite_stats(text: str) -> dict[str, dict[str, StatLine]]:
    """`lctl get_param llite.*.stats` by llite instance (`FSNAME-INSTANCE`), then by counter name."""
    out: dict[str, dict[str, StatLine]] = {}
    current: dict[str, StatLine] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.endswith("=") or ("=" in line and line.split("=", 1)[0].startswith("llite.")):
            name = line.split("=", 1)[0]
            parts = name.split(".")
            current = out.setdefault(parts[1], {}) if len(parts) >= 3 and parts[0] == "llite" else None
            continue
        if current is None:
            continue
        match = _STATS_LINE.match(line)
        if match is None:
            continue
        numbers = match["rest"].split()
        total = float(numbers[2]) if len(numbers) >= 3 else None
        current[match["name"]] = StatLine(int(match["count"]), match["unit"], total)
    return out


@dataclass(frozen=True)
class LfsTarget:
    name: str  # FSNAME-OST0000
    kind: str  # MDT, OST
    index: int
    total_kb: int
    used_kb: int
    avail_kb: int

    @property
    def used_pct(self) -> float:
        """As lfs df computes Use%: used of used plus available."""
        room = self.used_kb + self.avail_kb
        return 100.0 * self.used_kb / room if room else 0.0


@dataclass
class LfsDf:
    """One file system's block of `lfs df`."""

    mountpoint: str
    targets: list[LfsTarget] = field(default_factory=list)
    unavailable: list[str] = field(default_factory=list)  # "fs-OST0002: inactive device"


def parse_lfs_df(text: str) -> dict[str, LfsDf]:
    """`lfs df` by mount point."""
    out: dict[str, LfsDf] = {}
    pending_unavailable: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("UUID"):
            continue
        match = _DF_LINE.match(line)
        if match:
            block = out.setdefault(match["mount"], LfsDf(match["mount"]))
            block.unavailable += pending_unavailable
            pending_unavailable = []
            block.targets.append(
                LfsTarget(
                    match["uuid"],
                    match["kind"],
                    int(match["index"]),
                    int(match["total"]),
                    int(match["used"]),
                    int(match["avail"]),
                )
            )
            continue
        summary = _DF_SUMMARY.match(line)
        if summary:
            block = out.setdefault(summary["mount"], LfsDf(summary["mount"]))
            block.unavailable += pending_unavailable
            pending_unavailable = []
            continue
        gone = _DF_UNAVAILABLE.match(line)
        if gone:
            pending_unavailable.append(f"{gone['name']}: {gone['why'].strip()}")
    return out


def lustre_values(
    fsname: str, imports: list[Import], stats: dict[str, dict[str, StatLine]], df: LfsDf | None
) -> dict[str, float]:
    """The `lustre_*` metrics (protocol.metrics.FS_METRICS) of file system `fsname`, and `fs_ops` and
    `fs_op_seconds` from its llite call counts and [usecs] sums."""
    out: dict[str, float] = {}
    mine = [i for i in imports if i.fsname == fsname]
    if mine:
        out["lustre_targets"] = float(len(mine))
        out["lustre_targets_unhealthy"] = float(sum(1 for i in mine if i.state not in HEALTHY_IMPORTS))
    instances = [lines for name, lines in stats.items() if name.rpartition("-")[0] == fsname]
    if instances:
        ops = 0
        seconds = 0.0
        read = written = 0.0
        for lines in instances:
            for name, line in lines.items():
                if line.unit == "usecs":
                    ops += line.count
                    seconds += (line.total or 0.0) * 1e-6
                elif name == "read_bytes" and line.total is not None:
                    read += line.total
                elif name == "write_bytes" and line.total is not None:
                    written += line.total
        out["fs_ops"] = float(ops)
        out["fs_op_seconds"] = round(seconds, 6)
        out["lustre_read_bytes"] = read
        out["lustre_write_bytes"] = written
    if df is not None:
        osts = [t.used_pct for t in df.targets if t.kind == "OST"]
        mdts = [t.used_pct for t in df.targets if t.kind == "MDT"]
        if osts:
            out["lustre_ost_fill_max_pct"] = round(max(osts), 2)
        if mdts:
            out["lustre_mdt_fill_max_pct"] = round(max(mdts), 2)
        out["lustre_targets_inactive"] = float(len(df.unavailable))
    return out
