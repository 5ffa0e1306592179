"""Bounds on the numbers and times agents send, which the head checks before it stores anything.

Numbers: every model on the wire refuses NaN and ±infinity (`allow_inf_nan=False`), and every integer
that reaches a database column is bounded by the column (MAX_INT64 for a BIGINT). A message breaking
either is dropped whole by the head, which keeps the channel open (`messages.VALUE_ERRORS`).

Times: a sample, event or log line is stored only if its time lies between 2000-01-01 and a day ahead
of the head's clock. Earlier is a node whose clock was never set (an RTC reset to 1970); later is a
clock far off, or a forged time that would sit past every retention window (retention, roll-ups and
queries all go by these times). The head drops such an item alone and keeps the rest of its message.
A cache entry's times only describe it (the node evicts by its own clock): the entry is kept, since the
node does hold the artifact, unless a time cannot be stored at all (`storable_time`: past year 9999).
The agent's own models take any finite time: it must be able to describe a sample even while its
clock is wrong, and the head decides what it keeps.

Text: PostgreSQL's text holds no NUL character, and one in a log line or a job's message would fail the
write it is part of. The head replaces each with U+FFFD before it parses a message (`without_nul`), as
it does in jobs' output; models the head stores whole (an inventory) do the same on their fields
(`replace_nul`).
"""

from __future__ import annotations

import re
from typing import Any

MAX_INT64 = 2**63 - 1  # the largest value of a BIGINT column
EARLIEST_TS = 946_684_800.0  # 2000-01-01T00:00:00Z
MAX_AHEAD_S = 86_400.0  # how far ahead of the head's clock a reported time may be
MIN_STORABLE_TS = -62_135_596_800.0  # 0001-01-01T00:00:00Z
MAX_STORABLE_TS = 253_402_300_799.0  # 9999-12-31T23:59:59Z


def plausible_time(ts: float, now: float) -> bool:
    """Whether the head stores something reported at `ts` (Unix seconds) when its own clock says `now`."""
    return EARLIEST_TS <= ts <= now + MAX_AHEAD_S


def storable_time(ts: float, _now: float = 0.0) -> bool:
    """Whether `ts` (Unix seconds) is a time a database column (a Python datetime) can hold: years 1 to 9999."""
    return MIN_STORABLE_TS <= ts <= MAX_STORABLE_TS


# A JSON string's escaped NUL, `\u0000`, not preceded by an odd number of backslashes (`\\u0000` is a
# backslash followed by the text "u0000").
_NUL_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")


def without_nul(text: str) -> str:
    """JSON text with every NUL character in its strings replaced by U+FFFD (a raw NUL is not valid JSON)."""
    if "\\u0000" not in text:  # the common case: one substring search
        return text
    return _NUL_ESCAPE.sub(r"\1\\ufffd", text)


def replace_nul(value: Any) -> Any:
    """`value` (a model's raw input: dicts, lists, strings) with every NUL in its strings replaced by U+FFFD."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {replace_nul(k): replace_nul(v) for k, v in value.items()}
    if isinstance(value, list):
        return [replace_nul(v) for v in value]
    return value
