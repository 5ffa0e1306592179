"""gpufleet logs classify: the GPU, network and host faults in a kernel log, without a server.

Admins run it on a log a user sent them (dmesg, dmesg -T, dmesg -r, /dev/kmsg records, syslog,
journalctl short or `-o json`, a pstore dump, the Fabric Manager log, ibstat output; plain, gzip, xz or
bzip2, or `-` for stdin). One event per line for people, or a JSON array for scripts. The same
classifier runs in every agent. What is not a text log (a binary, a journal file, a device) is
refused with one line naming it, never classified as zero events.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import stat
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated

import typer

from gpufleet.cli.output import Format, OutputOpt, print_json, table
from gpufleet.cli.state import state
from gpufleet.core.durations import parse_duration
from gpufleet.core.errors import InvalidInput
from gpufleet.logs.catalog import XidPolicy
from gpufleet.logs.classify import LogEvent, classify_text

app = typer.Typer(help="Kernel and driver logs: classify a file offline, search what the agents sent.")
events_app = typer.Typer(
    help="Events found in the nodes' logs: Xids, SXids, link and host faults.", no_args_is_help=True
)


# How logrotate leaves old logs, by their first bytes; Python reads all three itself.
DECOMPRESSORS: tuple[tuple[bytes, Callable[[bytes], bytes]], ...] = (
    (b"\x1f\x8b", gzip.decompress),
    (b"\xfd7zXZ\x00", lzma.decompress),
    (b"BZh", bz2.decompress),
)
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"  # no zstd in Python's library before 3.14
JOURNAL_MAGIC = b"LPKSHHRH"  # a systemd journal file's signature
# Bytes no text log holds: the C0 controls but tab, newline, vertical tab, form feed, carriage return
# and escape (colour codes), and DEL. NUL is counted apart (see `not_text`).
CONTROL_BYTES = bytes([*range(1, 9), *range(14, 27), *range(28, 32), 127])
NOT_TEXT_BYTES = CONTROL_BYTES + b"\0"
MAX_NOT_TEXT_SHARE = 0.1  # of the bytes: control bytes or not UTF-8; text logs have next to none
CHUNK = 1 << 20


def read_log(path: Path) -> str:
    """The text of a log file (plain, gzip, xz or bzip2; `-` is stdin).

    Raises InvalidInput, naming the file, when it cannot be read, is a device or socket, or is not
    text (a binary, a systemd journal file, zstd that cannot be opened here)."""
    name = "stdin" if str(path) == "-" else str(path)
    try:
        if name == "stdin":
            data = sys.stdin.buffer.read()
        else:
            kind = stat.S_IFMT(path.stat().st_mode)
            if kind in (stat.S_IFCHR, stat.S_IFBLK, stat.S_IFSOCK):  # /dev/kmsg would be read forever
                what = {stat.S_IFCHR: "character device", stat.S_IFBLK: "block device"}.get(kind, "socket")
                raise InvalidInput(f"{name}: not a log file but a {what}; save it first, or pipe it to `-`")
            data = path.read_bytes()  # a pipe (`<(journalctl -k)`) is read like a file
        data = _decompressed(data)
    except (OSError, EOFError, gzip.BadGzipFile, lzma.LZMAError) as exc:
        raise InvalidInput(f"cannot read {name}: {getattr(exc, 'strerror', None) or exc}") from None
    if data.startswith(JOURNAL_MAGIC):
        raise InvalidInput(
            f"{name}: a systemd journal file: export it with journalctl --file {name} -o json and classify that"
        )
    if data.startswith(ZSTD_MAGIC):
        raise InvalidInput(f"{name}: zstd-compressed: decompress it first (zstd -dc {name} | gpufleet logs classify -)")
    text = data.decode("utf-8", errors="replace")
    if reason := not_text(data, text):
        raise InvalidInput(f"{name}: not a text log: {reason}")
    return text


def _decompressed(data: bytes) -> bytes:
    """`data`, decompressed when it starts as gzip, xz or bzip2 does. Raises what the decompressor raises."""
    for magic, decompress in DECOMPRESSORS:
        if data.startswith(magic):
            return decompress(data)
    return data


def not_text(data: bytes, text: str) -> str | None:
    """Why `data` (decoded as `text`) is not a text log, or None when it is.

    NUL bytes are left out of the count: after a power loss a filesystem can leave zero-filled blocks
    in a log that was being written, the very log an admin wants read after a crash. A few bytes that
    are not UTF-8 (a Latin-1 process name) are text too; a binary has them by the thousand."""
    if not data:
        return None
    nul = data.count(0)
    if nul == len(data):
        return "it holds only NUL bytes"
    # In pieces: a copy of a log of gigabytes, only to count, would double what reading it costs.
    kept = sum(len(data[at : at + CHUNK].translate(None, NOT_TEXT_BYTES)) for at in range(0, len(data), CHUNK))
    control = len(data) - nul - kept
    share = (control + text.count("\ufffd")) / (len(data) - nul)
    if share > MAX_NOT_TEXT_SHARE:
        return f"{share:.0%} of its bytes are control characters or not UTF-8 (a binary file?)"
    return None


def parse_overrides(values: list[str]) -> XidPolicy:
    """`--xid-action 13=ignore --xid-action 31=drain`. Raises InvalidInput for a malformed one."""
    pairs: dict[str, str] = {}
    for value in values:
        code, sep, action = value.partition("=")
        if not sep:
            raise InvalidInput(f"--xid-action {value!r}: expected CODE=ACTION, e.g. 13=ignore")
        pairs[code.strip()] = action.strip()
    try:
        return XidPolicy.from_setting(pairs)
    except ValueError as exc:
        raise InvalidInput(f"--xid-action: {exc}") from None


def _where(event: LogEvent) -> str:
    return event.pci_bus or event.device or "-"


def _what(event: LogEvent) -> str:
    return f"{event.kind} {event.code}" if event.code is not None else event.kind


def _when(event: LogEvent) -> str:
    if event.time is not None:
        return datetime.fromtimestamp(event.time, UTC).strftime("%Y-%m-%d %H:%M:%S")
    return f"+{event.uptime_s:.3f}s" if event.uptime_s is not None else "-"


@app.command("classify")
def classify(
    path: Annotated[Path, typer.Argument(help="the log file (plain or gzip); - for stdin")],
    xid_action: Annotated[
        list[str] | None, typer.Option("--xid-action", help="override an Xid's action, e.g. 13=ignore (repeatable)")
    ] = None,
    year: Annotated[int | None, typer.Option(min=1970, max=9999, help="year of syslog dates, which have none")] = None,
    output: Format = OutputOpt,
) -> None:
    """Print the events found in a log file, one per line (line number, time, severity, action, what, where)."""
    policy = parse_overrides(xid_action or [])
    text = read_log(path)
    events = classify_text(text, policy, year)
    if output is Format.json:
        print_json([e.as_json() for e in events])
        return
    for e in events:
        typer.echo(
            f"{e.line_no:>6}  {_when(e):<19}  {e.severity:<8}  {e.action:<9}  {_what(e):<12}  {_where(e):<12}  "
            f"{e.message}"
        )
    critical = sum(1 for e in events if e.severity == "critical")
    lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
    typer.echo(f"{len(events)} events ({critical} critical) in {lines} lines", err=True)


def _search(
    ctx: typer.Context,
    words: list[str] | None,
    node: str | None,
    since: str | None,
    severity: str | None,
    kind: str | None,
    limit: int,
    output: Format,
    *,
    events: bool,
) -> None:
    start = datetime.now(UTC) - timedelta(seconds=parse_duration(since)) if since else None
    rows = (
        state(ctx)
        .client()
        .search_logs(
            node=node,
            since=start,
            severity=severity,
            kind=kind,
            events=events or None,
            q=" ".join(words) if words else None,
            limit=limit,
        )
    )
    if output is Format.json:
        print_json(rows)
        return
    for row in rows:
        row["where"] = row["pci_bus"] or row["device"]
        row["what"] = f"{row['kind']} {row['code']}" if row["code"] is not None else row["kind"]
    table(
        rows,
        [
            ("at", "At"),
            ("node", "Node"),
            ("severity", "Severity"),
            ("what", "Kind"),
            ("where", "Where"),
            ("line", "Line"),
        ],
    )


SinceOpt = Annotated[str | None, typer.Option(help="how far back, e.g. 1h, 7d")]
SeverityOpt = Annotated[str | None, typer.Option(help="at least: info, warning or critical")]


@app.command("search")
def search(
    ctx: typer.Context,
    words: Annotated[list[str] | None, typer.Argument(help="words that must all appear in the line")] = None,
    node: Annotated[str | None, typer.Option(help="only this node")] = None,
    since: SinceOpt = "1d",
    severity: SeverityOpt = None,
    kind: Annotated[str | None, typer.Option(help="only this kind of event: xid, sxid, ib_link, ...")] = None,
    limit: Annotated[int, typer.Option(min=1, max=5000)] = 200,
    output: Format = OutputOpt,
) -> None:
    """Search the log lines the agents sent (newest first)."""
    _search(ctx, words, node, since, severity, kind, limit, output, events=False)


@app.command("templates")
def templates(
    ctx: typer.Context,
    category: Annotated[str | None, typer.Option(help="only this node category")] = None,
    new: Annotated[bool, typer.Option("--new", help="only templates found after the category's learning")] = False,
    output: Format = OutputOpt,
) -> None:
    """The log templates mined from each node category's lines (most recently seen first)."""
    rows = state(ctx).client().log_templates(category, new)
    if output is Format.json:
        print_json(rows)
        return
    for row in rows:
        row["category"] = row["category"] or "-"
        row["since"] = "learned" if row["learned"] else row["first_seen"]
    table(
        rows,
        [
            ("category", "Category"),
            ("template_id", "Id"),
            ("count", "Lines"),
            ("since", "First seen"),
            ("first_node", "First on"),
            ("last_seen", "Last seen"),
            ("template", "Template"),
        ],
    )


@events_app.command("list")
def list_events(
    ctx: typer.Context,
    node: Annotated[str | None, typer.Option(help="only this node")] = None,
    since: SinceOpt = "1d",
    severity: SeverityOpt = None,
    kind: Annotated[
        str | None, typer.Option(help="xid, sxid, gpu_off_bus, ecc, nvlink, nic, ib_link, oom, ...")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=5000)] = 200,
    output: Format = OutputOpt,
) -> None:
    """The events found in the nodes' logs (newest first)."""
    _search(ctx, None, node, since, severity, kind, limit, output, events=True)
