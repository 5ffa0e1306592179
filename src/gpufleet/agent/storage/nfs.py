"""NFS client counters from /proc/self/mountstats: pure parsing, and the `fs:` metrics they make.

The kernel writes one block per mount (fs/nfs/super.c nfs_show_stats, net/sunrpc/stats.c):

    device SERVER:/EXPORT mounted on /MOUNT with fstype nfs4 statvers=1.1
        opts:   rw,vers=4.2,...,proto=tcp,...
        age:    13968
        events: ...
        bytes:  NORMAL_READ NORMAL_WRITE DIRECT_READ DIRECT_WRITE SERVER_READ SERVER_WRITE READ_PAGES WRITE_PAGES
        RPC iostats version: 1.1  p/v: 100003/4 (nfs)
        xprt:   tcp SRCPORT BIND CONNECT CONNECT_TIME IDLE SENDS RECVS BAD_XIDS REQ_U BACKLOG_U [...]
        per-op statistics
                READ: OPS TRANS MAJOR_TIMEOUTS BYTES_SENT BYTES_RECV QUEUE_MS RTT_MS EXECUTE_MS [ERRORS]

(`xprt: udp` lacks the connect fields, `xprt: rdma` has more after them; a mount with `nconnect=N`
has N xprt lines.) These are the fields node_exporter's mountstats collector reads (through
prometheus/procfs); times are milliseconds, exposed here in seconds. Other file systems' blocks are
one `device` line and are skipped.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field

MS = 1e-3
# Operations whose counters go out per operation: the ones that say how the data and metadata paths
# fare, for NFSv3 and v4 alike. An entity holds at most 128 values; these stay well under it.
KEY_OPS = (
    "READ",
    "WRITE",
    "COMMIT",
    "GETATTR",
    "SETATTR",
    "LOOKUP",
    "ACCESS",
    "OPEN",
    "CLOSE",
    "READDIRPLUS",
    "READDIR",
    "CREATE",
    "REMOVE",
)
OP_FIELDS = ("requests", "transmissions", "major_timeouts", "sent_bytes", "received_bytes")
OP_TIMES = ("queue_seconds", "rtt_seconds", "execute_seconds")
U64 = 1 << 64
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class OpStats:
    """One line of per-op statistics; times in seconds."""

    requests: int
    transmissions: int
    major_timeouts: int
    sent_bytes: int
    received_bytes: int
    queue_seconds: float
    rtt_seconds: float
    execute_seconds: float
    errors: int | None = None  # statvers 1.1 kernels from 5.x add it


@dataclass(frozen=True)
class Transport:
    """An xprt line (the fields every protocol has, by name); `kind` tcp, udp or rdma."""

    kind: str
    port: int = 0
    bind: int = 0
    connect: int = 0
    connect_time: int = 0
    idle_seconds: int = 0
    sends: int = 0
    receives: int = 0
    bad_xids: int = 0
    requests_total: int = 0  # cumulative "active requests" (req_u)
    backlog_total: int = 0  # cumulative backlog queue length (bklog_u)


@dataclass
class NfsMount:
    """One NFS mount's block of mountstats."""

    device: str
    mountpoint: str
    fstype: str
    statvers: str = ""
    options: dict[str, str] = field(default_factory=dict)
    age_seconds: int = 0
    bytes: tuple[int, ...] = ()  # the 8 `bytes:` counters, in the kernel's order
    transports: list[Transport] = field(default_factory=list)
    ops: dict[str, OpStats] = field(default_factory=dict)

    @property
    def protocol(self) -> str:
        return self.options.get("proto", self.transports[0].kind if self.transports else "")

    @property
    def server(self) -> str:
        return self.options.get("addr", self.options.get("mountaddr", ""))


def _octal(text: str) -> str:
    """mountstats escapes spaces and the like as \\040 (seq_escape), as mountinfo does."""
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), text)


def _int(text: str) -> int:
    """A counter; the kernel prints u64 values, and a few kernels print a negative s64 for a wrapped one."""
    value = int(text)
    return value + U64 if value < 0 else value


def _transport(fields: list[str]) -> Transport | None:
    if not fields:
        return None
    kind, numbers = fields[0], fields[1:]
    try:
        values = [_int(f) for f in numbers]
    except ValueError:
        return None
    if kind == "udp":  # port bind sends recvs bad_xids req_u bklog_u ...
        if len(values) < 7:
            return None
        port, bind, sends, recvs, bad, req, bklog = values[:7]
        return Transport(kind, port, bind, 0, 0, 0, sends, recvs, bad, req, bklog)
    # tcp and rdma: port bind connect connect_time idle sends recvs bad_xids req_u bklog_u ...
    if len(values) < 10:
        return None
    port, bind, connect, connect_time, idle, sends, recvs, bad, req, bklog = values[:10]
    return Transport(kind, port, bind, connect, connect_time, idle, sends, recvs, bad, req, bklog)


def _op(numbers: list[str]) -> OpStats | None:
    try:
        values = [_int(n) for n in numbers]
    except ValueError:
        return None
    if len(values) < 8:
        return None
    ops, trans, timeouts, sent, recv, queue, rtt, execute = values[:8]
    return OpStats(
        ops,
        trans,
        timeouts,
        sent,
        recv,
        queue * MS,
        rtt * MS,
        execute * MS,
        values[8] if len(values) > 8 else None,
    )


def _device_line(raw: str) -> NfsMount | None:
    """`device DEV mounted on POINT with fstype TYPE [statvers=X]`: an NfsMount for an NFS block."""
    parts = raw.split()
    if len(parts) < 8 or parts[2:4] != ["mounted", "on"] or parts[5:7] != ["with", "fstype"]:
        return None
    if not parts[7].startswith("nfs"):
        return None
    statvers = next((p.split("=", 1)[1] for p in parts[8:] if p.startswith("statvers=")), "")
    return NfsMount(_octal(parts[1]), _octal(parts[4]), parts[7], statvers)


def _header_line(mount: NfsMount, key: str, rest: str) -> None:
    """One of a block's lines before `per-op statistics`, into `mount`; unknown or broken ones are skipped."""
    if key == "opts":
        for option in rest.strip().split(","):
            name, _, value = option.partition("=")
            if name:
                mount.options[name.strip()] = value.strip()
    elif key == "age":
        with contextlib.suppress(ValueError):
            mount.age_seconds = int(rest.strip())
    elif key == "bytes":
        with contextlib.suppress(ValueError):
            mount.bytes = tuple(_int(v) for v in rest.split())
    elif key == "xprt":
        transport = _transport(rest.split())
        if transport is not None:
            mount.transports.append(transport)


def parse_mountstats(text: str) -> dict[str, NfsMount]:
    """NFS mounts by mount point (the last block wins where a point is mounted twice, as in mountinfo)."""
    mounts: dict[str, NfsMount] = {}
    current: NfsMount | None = None
    in_ops = False
    for raw in text.splitlines():
        if raw.startswith("device "):
            current, in_ops = _device_line(raw), False
            if current is not None:
                mounts[current.mountpoint] = current
            continue
        line = raw.strip()
        if current is None or not line:
            continue
        if line == "per-op statistics":
            in_ops = True
            continue
        key, sep, rest = line.partition(":")
        if not sep:
            continue
        if in_ops:
            stats = _op(rest.split())
            if stats is not None:
                current.ops[key.strip()] = stats
        else:
            _header_line(current, key.strip(), rest)
    return mounts


def _op_name(op: str) -> str:
    return op.lower()


def nfs_values(mount: NfsMount) -> dict[str, float]:
    """The `nfs_*` metrics of one mount (protocol.metrics.FS_METRICS), and `fs_ops` / `fs_op_seconds`:
    every operation's count and round-trip time summed."""
    out: dict[str, float] = {"nfs_age_seconds": float(mount.age_seconds)}
    if len(mount.bytes) >= 6:
        names = (
            "nfs_read_bytes",
            "nfs_write_bytes",
            "nfs_direct_read_bytes",
            "nfs_direct_write_bytes",
            "nfs_total_read_bytes",
            "nfs_total_write_bytes",
        )
        out.update({name: float(value) for name, value in zip(names, mount.bytes, strict=False)})
    if mount.transports:
        # nconnect=N gives N transports to one server: their counters add up, the idle time is the least.
        ts = mount.transports
        out["nfs_xprt_connects"] = float(sum(t.connect for t in ts))
        out["nfs_xprt_idle_seconds"] = float(min(t.idle_seconds for t in ts))
        out["nfs_xprt_sends"] = float(sum(t.sends for t in ts))
        out["nfs_xprt_receives"] = float(sum(t.receives for t in ts))
        out["nfs_xprt_bad_xids"] = float(sum(t.bad_xids for t in ts))
        out["nfs_xprt_backlog_queue"] = float(sum(t.backlog_total for t in ts))
    ops = list(mount.ops.values())
    out["fs_ops"] = float(sum(o.requests for o in ops))
    out["fs_op_seconds"] = round(sum(o.rtt_seconds for o in ops), 3)
    out["nfs_transmissions"] = float(sum(o.transmissions for o in ops))
    out["nfs_major_timeouts"] = float(sum(o.major_timeouts for o in ops))
    for op in KEY_OPS:
        stats = mount.ops.get(op)
        if stats is None or not stats.requests:
            continue  # an operation never used (or another NFS version's) adds no series
        prefix = f"nfs_op_{_op_name(op)}_"
        for name in OP_FIELDS:
            out[prefix + name] = float(getattr(stats, name))
        for name in OP_TIMES:
            out[prefix + name] = round(float(getattr(stats, name)), 3)
    return out
