"""Slurm's view of its nodes: base state, flags, drain reason (and who set it), GPUs. Pure parsing.

Two sources, one model (`SlurmNode`):

- `sinfo --json` (Slurm 21.08 and later; checked on 22.05.8): each node has `state` (the base state,
  lower case: "idle", "mixed", "allocated", "down"...) and `state_flags` (["DRAIN"], ["NOT_RESPONDING"]...).
  From 23.02 Slurm writes `state` as a list of upper-case words instead (["IDLE", "DRAIN"]) and from 23.11
  timestamps as {"set": .., "number": ..}; both shapes are read. A `sinfo --json` that cannot reach
  slurmctld still exits 0, with an empty node list and a non-empty `errors`: that is `Unavailable`.
- `sinfo -h -N -O SINFO_FIELDS` (any Slurm with `-O StateComplete`): fields separated by "|", the reason
  last so a "|" inside it is kept; StateComplete reads "idle+drain", "allocated+drain", "idle+not_responding".
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gpufleet.core.errors import InvalidInput, Unavailable
from gpufleet.jobs.ports import OWN_DRAIN_PREFIX

SINFO_JSON = ("sinfo", "--json")
# One node per line (-N), no header (-h); ":0" = no truncation, "|" after each field. Reason must stay last.
SINFO_FIELDS = "NodeList:0|,StateComplete:0|,User:0|,Timestamp:0|,Gres:0|,GresUsed:0|,Reason:0"
SINFO_TEXT = ("sinfo", "-h", "-N", "-O", SINFO_FIELDS)

# Slurm's base node states (node_state_string's first word), lower case.
BASE_STATES = frozenset(
    {"unknown", "down", "idle", "allocated", "error", "mixed", "future", "completing", "planned", "end"}
)
# Shown by sinfo's text output for the states held in `allocated`.
_ALIASES = {"alloc": "allocated", "drng": "draining", "drain": "drained", "comp": "completing", "mix": "mixed"}


@dataclass(frozen=True)
class SlurmNode:
    """One Slurm node as gpufleet needs it."""

    name: str
    state: str  # base state, lower case: idle, mixed, allocated, down, completing, future, unknown...
    flags: frozenset[str] = field(default_factory=frozenset)  # upper case: DRAIN, NOT_RESPONDING, REBOOT_REQUESTED...
    reason: str | None = None
    reason_user: str | None = None
    reason_at: datetime | None = None
    gres: str = ""
    gres_used: str = ""

    @property
    def drain(self) -> bool:
        """Slurm keeps new jobs off this node (drained, or draining while jobs finish)."""
        return "DRAIN" in self.flags

    @property
    def draining(self) -> bool:
        """Drained but still running jobs."""
        return self.drain and self.state in {"allocated", "mixed", "completing"}

    @property
    def drained(self) -> bool:
        """Drained and empty."""
        return self.drain and not self.draining

    @property
    def responding(self) -> bool:
        return "NOT_RESPONDING" not in self.flags

    @property
    def own_drain(self) -> bool:
        """The drain (or down) reason was written by gpufleet, which may therefore undo it."""
        return (self.reason or "").startswith(OWN_DRAIN_PREFIX)

    @property
    def display_state(self) -> str:
        """sinfo's long state word: "drained", "draining", "idle*", "down"..."""
        word = ("draining" if self.draining else "drained") if self.drain else self.state
        return word if self.responding else f"{word}*"


def _text(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    return text or None


def _timestamp(value: Any) -> datetime | None:
    """22.05: seconds since the epoch (0 = never); 23.11+: {"set": bool, "infinite": bool, "number": int}."""
    if isinstance(value, Mapping):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return None
    return datetime.fromtimestamp(value, UTC)


def _state_and_flags(words: Iterable[str]) -> tuple[str, frozenset[str]]:
    """Split Slurm's state words (["IDLE", "DRAIN"], ["idle"], "idle+drain") into base state and flags."""
    base = "unknown"
    flags: set[str] = set()
    for word in words:
        lower = word.strip().lower()
        if not lower:
            continue
        if lower in BASE_STATES and base == "unknown":
            base = lower
        else:
            flags.add(lower.upper())
    return base, frozenset(flags)


def _json_node(raw: Mapping[str, Any]) -> SlurmNode:
    name = _text(raw.get("name"))
    if name is None:
        raise InvalidInput("Slurm: a node in sinfo --json has no name")
    state = raw.get("state")
    words = [state] if isinstance(state, str) else [str(w) for w in state or []]
    words += [str(w) for w in raw.get("state_flags") or []]
    base, flags = _state_and_flags(words)
    reason = _text(raw.get("reason"))
    return SlurmNode(
        name=name,
        state=base,
        flags=flags,
        reason=reason,
        reason_user=_text(raw.get("reason_set_by_user")) if reason else None,
        reason_at=_timestamp(raw.get("reason_changed_at")) if reason else None,
        gres=_text(raw.get("gres")) or "",
        gres_used=_text(raw.get("gres_used")) or "",
    )


def json_document(output: str, command: str) -> Mapping[str, Any]:
    """The JSON object a Slurm `--json` command printed. Raises Unavailable when it reports errors (an
    unreachable slurmctld still exits 0, with an "errors" list), InvalidInput when it is not JSON."""
    try:
        document = json.loads(output)
    except ValueError as exc:
        raise InvalidInput(f"Slurm: {command} did not print JSON: {exc}") from None
    if not isinstance(document, Mapping):
        raise InvalidInput(f"Slurm: {command} printed JSON that is not an object")
    errors = [e for e in document.get("errors") or [] if e]
    if errors:
        described = "; ".join(
            f"{e.get('error') or e.get('description') or 'error'} (errno {e.get('errno', e.get('error_number', '?'))})"
            if isinstance(e, Mapping)
            else str(e)
            for e in errors
        )
        raise Unavailable(f"Slurm: {command} reported: {described}")
    return document


def parse_sinfo_json(output: str) -> list[SlurmNode]:
    """Nodes from `sinfo --json`, each once, in Slurm's order.

    Raises Unavailable when Slurm reports errors (slurmctld unreachable exits 0 with an "errors" list) and
    InvalidInput when the output is not the JSON expected.
    """
    document = json_document(output, "sinfo --json")
    raw_nodes = document.get("nodes")
    if not isinstance(raw_nodes, list):
        raise InvalidInput("Slurm: sinfo --json has no node list")
    seen: dict[str, SlurmNode] = {}
    for raw in raw_nodes:
        if not isinstance(raw, Mapping):
            raise InvalidInput("Slurm: a node in sinfo --json is not an object")
        node = _json_node(raw)
        seen.setdefault(node.name, node)
    return list(seen.values())


def _text_timestamp(value: str) -> datetime | None:
    if value in {"", "Unknown", "None", "(null)"}:
        return None
    try:
        # sinfo prints slurmctld's local time without a zone; the test cluster and most clusters run in UTC.
        return datetime.fromisoformat(value).replace(tzinfo=UTC)
    except ValueError:
        return None


def parse_sinfo_text(output: str) -> list[SlurmNode]:
    """Nodes from `sinfo -h -N -O SINFO_FIELDS`, each once (a node in two partitions is listed twice).

    Raises InvalidInput on a line without the expected fields.
    """
    seen: dict[str, SlurmNode] = {}
    for number, line in enumerate(output.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("|", 6)
        if len(parts) != 7:
            raise InvalidInput(f"Slurm: sinfo line {number} has {len(parts)} fields, expected 7: {line!r}")
        name, state, user, when, gres, gres_used, reason_text = (p.strip() for p in parts)
        words = [_ALIASES.get(w.lower(), w) for w in state.rstrip("*").split("+")]
        base, flags = _state_and_flags(w for w in words if w not in {"drained", "draining"})
        if any(w in {"drained", "draining"} for w in words):
            flags |= {"DRAIN"}
        if state.endswith("*"):
            flags |= {"NOT_RESPONDING"}
        reason = None if reason_text in {"", "none", "(null)"} else reason_text
        node = SlurmNode(
            name=name,
            state=base,
            flags=frozenset(flags),
            reason=reason,
            reason_user=None if not reason or user in {"", "Unknown", "(null)"} else user,
            reason_at=_text_timestamp(when) if reason else None,
            gres="" if gres == "(null)" else gres,
            gres_used="" if gres_used == "(null)" else gres_used,
        )
        seen.setdefault(node.name, node)
    return list(seen.values())
