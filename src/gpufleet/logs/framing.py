"""When a log line was written, whatever tool wrote it: the prefixes of dmesg, /dev/kmsg, syslog,
journalctl and the Fabric Manager log. Only lines that carry an event are framed, so this may be
thorough rather than fast.

`frame(line, year)` returns (epoch seconds or None, seconds since boot or None, the message). dmesg's
raw form and /dev/kmsg only know the time since boot; classic syslog omits the year (`year` fills it,
or it is guessed). A syslog priority in front of any of them (`<4>[  123.456789] ...` from `dmesg -r`
and pstore dumps, `<14>` with the facility folded in) is dropped and the rest framed as usual; so is
the caller (`[ T1234]`, `[    C2]`) that kernels built with CONFIG_PRINTK_CALLER print after the time.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime

_KMSG = re.compile(r"^(\d+),(\d+),(\d+),[^;]*;")  # /dev/kmsg: priority,seq,usec-since-boot,flags;message
_PRIORITY = re.compile(r"^<\d{1,3}>")  # dmesg -r, pstore, raw syslog: <level + 8 * facility>
_UPTIME = re.compile(r"^\[\s*(\d+\.\d+)\](?:\[\s*[TC]\d+\])?\s?")  # dmesg: [  123.456789], then [ T1234]
_CTIME = re.compile(r"^\[(\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4})\]\s?")  # dmesg -T
_DMESG_ISO = re.compile(r"^\w+\s*:\s*\w+\s*: (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)[,.](\d+)([+-]\d\d:\d\d) ")
_ISO = re.compile(r"^(\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?) (?:\S+ )?")
_SYSLOG = re.compile(r"^(\w{3} [ \d]\d \d\d:\d\d:\d\d) ")  # Dec  2 10:43:35 (no year)
_FABRIC = re.compile(r"^\[(\w{3} \d\d \d{4} \d\d:\d\d:\d\d)\] ")  # Fabric Manager: [Feb 25 2025 13:59:45]
_IDENT = re.compile(r"^(?:\S+ )?[\w.@/()-]+(?:\[\d+\])?: ")  # "host kernel: " or "kernel: " after syslog time


def _epoch(text: str, fmt: str) -> float | None:
    try:
        return datetime.strptime(text, fmt).replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def _syslog_epoch(text: str, year: int | None) -> float | None:
    """Classic syslog has no year: `year`, or else this year unless that puts the line more than a day
    in the future (a December line read in January), then last year."""
    if year is not None:
        return _epoch(f"{year} {text}", "%Y %b %d %H:%M:%S")
    now = datetime.now(UTC)
    epoch = _epoch(f"{now.year} {text}", "%Y %b %d %H:%M:%S")
    if epoch is not None and epoch > now.timestamp() + 86_400:
        return _epoch(f"{now.year - 1} {text}", "%Y %b %d %H:%M:%S")
    return epoch


def _iso(text: str) -> float | None:
    try:
        parsed = datetime.fromisoformat(text.replace(",", "."))
    except ValueError:
        return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()


def _strip_uptime(message: str) -> tuple[float | None, str]:
    m = _UPTIME.match(message)
    return (float(m.group(1)), message[m.end() :]) if m else (None, message)


Framed = tuple[float | None, float | None, str]


def _after_ident(epoch: float | None, rest: str) -> Framed:
    """A syslog line's remainder: drop "host kernel: " and the kernel's own [uptime] stamp."""
    rest = rest[i.end() :] if (i := _IDENT.match(rest)) else rest
    uptime, rest = _strip_uptime(rest)
    return epoch, uptime, rest


# (prefix, what it gives): tried in order; the first that matches frames the line.
_FORMATS: tuple[tuple[re.Pattern[str], Callable[[re.Match[str], str, int | None], Framed]], ...] = (
    (_KMSG, lambda m, rest, _y: (None, int(m.group(3)) / 1e6, rest)),
    (_UPTIME, lambda m, rest, _y: (None, float(m.group(1)), rest)),
    (_CTIME, lambda m, rest, _y: (_epoch(m.group(1), "%a %b %d %H:%M:%S %Y"), None, rest)),
    (_DMESG_ISO, lambda m, rest, _y: (_iso(f"{m.group(1)}.{m.group(2)}{m.group(3)}"), None, rest)),
    (_FABRIC, lambda m, rest, _y: (_epoch(m.group(1), "%b %d %Y %H:%M:%S"), None, rest)),
    (_ISO, lambda m, rest, _y: _after_ident(_iso(m.group(1)), rest)),
    (_SYSLOG, lambda m, rest, y: _after_ident(_syslog_epoch(m.group(1), y), rest)),
)


def frame(line: str, year: int | None = None) -> Framed:
    """(epoch, uptime, message) of one line. Times without a zone are taken as UTC."""
    if line.startswith("{"):
        return _journal_json(line)
    if line.startswith("<") and (priority := _PRIORITY.match(line)):
        line = line[priority.end() :]  # the priority says how bad, never when: what follows it does
    for prefix, framed in _FORMATS:
        if m := prefix.match(line):
            return framed(m, line[m.end() :], year)
    return None, None, line


def _journal_json(line: str) -> Framed:
    """`journalctl -o json`: MESSAGE (a string, or a byte list for non-UTF-8), times in microseconds."""
    try:
        record = json.loads(line)
    except ValueError:
        return None, None, line
    if not isinstance(record, dict):
        return None, None, line
    message = record.get("MESSAGE", "")
    if isinstance(message, list):
        message = bytes(b for b in message if isinstance(b, int) and 0 <= b < 256).decode(errors="replace")
    epoch = _micros(record.get("__REALTIME_TIMESTAMP"))
    uptime = _micros(record.get("__MONOTONIC_TIMESTAMP"))
    return epoch, uptime, str(message)


def _micros(value: object) -> float | None:
    try:
        return int(str(value)) / 1e6
    except ValueError:
        return None


def journal_message(line: str) -> str:
    """The MESSAGE of a `journalctl -o json` line (the text the recognisers read); the line itself otherwise."""
    return _journal_json(line)[2] if line.startswith("{") else line
