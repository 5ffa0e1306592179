"""snmpsim's recording format (.snmprec: `OID|TAG|VALUE` lines) read into what `gpufleet.network.snmp`
walks, so its parsing is tested on real switches' data without a network; and the edits the tests make
to a recording snmpsim is serving (it re-reads a recording whose modification time changed)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path

from gpufleet.network import snmp
from gpufleet.network.snmp import Index, Value

# snmprec tags (ASN.1 BER tag numbers): what each value is
INTEGER_TAGS = {"2", "65", "66", "67", "70"}  # Integer32, Counter32, Gauge32, TimeTicks, Counter64
OCTETS_TAGS = {"4", "64", "68"}  # OCTET STRING, IpAddress, Opaque
OID_TAG = "6"


def value_of(tag: str, text: str) -> Value | None:
    """A recorded value as `snmp` has it from pysnmp: int, bytes or a dotted OID."""
    base, _, _variation = tag.partition(":")
    hexed = base.endswith("x")
    base = base.removesuffix("x")
    if base in INTEGER_TAGS:
        return int(text)
    if base in OCTETS_TAGS:
        return bytes.fromhex(text) if hexed else text.encode()
    if base == OID_TAG:
        return text
    return None


def records(path: Path) -> dict[str, tuple[str, str]]:
    """The recording's lines: OID -> (tag, value text)."""
    found = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            oid, tag, value = line.split("|", 2)
            found[oid] = (tag, value)
    return found


def columns(path: Path) -> dict[str, dict[Index, Value]]:
    """What `snmp.poll` would walk from an agent serving this recording: each scalar's .0 and each
    column's rows, by index."""
    wanted = sorted((*snmp.SCALARS, *snmp.COLUMNS), key=len, reverse=True)
    found: dict[str, dict[Index, Value]] = {}
    for oid, (tag, text) in records(path).items():
        column = next((c for c in wanted if oid.startswith(c + ".")), None)
        value = value_of(tag, text)
        if column is None or value is None:
            continue
        index = tuple(int(x) for x in oid[len(column) + 1 :].split("."))
        if column in snmp.SCALARS and index != (0,):
            continue
        found.setdefault(column, {})[index] = value
    return found


def edit(path: Path, changes: Mapping[str, str | None]) -> None:
    """Change values in a recording snmpsim serves: OID -> new value text (same tag), None to drop the
    line (`replace` says how snmpsim comes to see it)."""
    lines = []
    seen = set()
    for line in path.read_text().splitlines():
        oid, sep, rest = line.partition("|")
        if sep and oid in changes:
            seen.add(oid)
            value = changes[oid]
            if value is None:
                continue
            tag = rest.split("|", 1)[0]
            lines.append(f"{oid}|{tag}|{value}")
        else:
            lines.append(line)
    missing = set(changes) - seen
    if missing:
        raise KeyError(f"not in {path.name}: {sorted(missing)}")
    replace(path, "\n".join(lines) + "\n")


def replace(path: Path, text: str) -> None:
    """Put `text` in the recording at `path`, for snmpsim to see at its next request. It re-reads a
    recording whose modification time (in whole seconds) changed, and rebuilds its index of the file
    unless the index is newer than the file: so the file is written whole, renamed into place, and dated
    a second past both its last date and now."""
    mtime = max(int(path.stat().st_mtime), int(time.time())) + 1
    fresh = path.with_suffix(".new")
    fresh.write_text(text)
    os.utime(fresh, (mtime, mtime))
    fresh.replace(path)
