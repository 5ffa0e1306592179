"""Point-to-point network between the nodes of a step: bandwidth in Gbit/s and ping-pong latency.

Rank 0 listens on `--port` (default MASTER_PORT + 1) at every address; each other rank connects to
MASTER_ADDR with one control connection and `--streams` data connections, each opened with a hello line
(`GFB1 <rank> ctl <streams> <ib device or ->` or `GFB1 <rank> data <i>`). Rank 0 then measures each
partner in turn (rank order), over its control connection:

1. rank 0 says go (JSON: seconds per direction, pings, whether InfiniBand is used);
2. ping-pong: the partner sends one byte, rank 0 echoes it, PINGS times (TCP_NODELAY): round trip µs;
3. bandwidth: over TCP, the partner streams to rank 0 on every data connection for the phase's time,
   then closes its sending side, then rank 0 does the same the other way; each receiver times from its
   first byte to the last connection's end. With InfiniBand on both sides (an active port in
   /sys/class/infiniband and ib_write_bw installed), ib_write_bw runs instead: rank 0 as its server;
4. both send what they received (JSON), so each side knows the link both ways.

Each rank's value is the slower direction of its link(s) (both measured by their receivers); rank 0
with several partners takes the slowest. Evidence has each direction, the round trips and the transport.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.agent.burnin.common import (
    Rendezvous,
    Run,
    Usage,
    failed,
    find_tool,
    progress,
    rendezvous,
    result,
    skipped,
    tail,
)
from gpufleet.protocol.burnin import StepResult

UNIT = "Gbit/s"
MAGIC = "GFB1"
PINGS = 200
CHUNK = 1 << 20
MAX_LINE = 4096
IB_SYS = Path("/sys/class/infiniband")


class LinkError(Exception):
    """The partner broke the exchange (vanished, said something unexpected, timed out)."""


@dataclass
class Peer:
    """A partner as rank 0 sees it: its connections, once all have arrived."""

    rank: int
    ctl: socket.socket
    streams: int
    ib: str | None
    data: dict[int, socket.socket] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return len(self.data) >= self.streams


def network(run: Run) -> StepResult:
    kind = run.kind
    rdv = rendezvous()
    if rdv.nodes < 2:
        return skipped(kind, UNIT, "no partner node (WORLD_SIZE is 1): the network step runs in pairs")
    port = int(run.options["port"]) or rdv.master_port + 1
    if port > 65535:
        raise Usage(f"MASTER_PORT + 1 = {port} is not a TCP port: give --port")
    transport = str(run.options["transport"])
    ib = ib_device(str(run.options["ib-dev"]) or None) if transport != "tcp" else None
    wait_s = max(60.0, run.seconds) + 60.0
    per_direction = max(0.5, run.seconds / 2)
    progress(
        f"{kind}: node {rdv.node_rank} of {rdv.nodes}, "
        + (f"listening on port {port}" if rdv.node_rank == 0 else f"to {rdv.master_addr}:{port}")
        + f", {run.options['streams']} stream(s), InfiniBand: {ib or 'none'}"
    )
    try:
        if rdv.node_rank == 0:
            links = serve(port, rdv, per_direction, ib, transport, wait_s)
        else:
            links = [join(rdv, port, int(run.options["streams"]), ib, wait_s)]
    except (LinkError, OSError) as exc:
        return failed(kind, UNIT, f"{type(exc).__name__}: {exc}")
    return _judge(kind, links, transport)


def _judge(kind: str, links: list[dict[str, Any]], transport: str) -> StepResult:
    unusable = [link for link in links if link.get("skip")]
    if unusable:
        return skipped(kind, UNIT, str(unusable[0]["skip"]), evidence={"links": links})
    value = min(min(link["rx_gbit_s"], link.get("tx_gbit_s", link["rx_gbit_s"])) for link in links)
    rtt = [link["rtt_us"]["median"] for link in links if link.get("rtt_us")]
    progress(f"{kind}: {value:.2f} {UNIT} (slower direction)" + (f", round trip {max(rtt):.0f} µs" if rtt else ""))
    evidence: dict[str, Any] = {"links": links, "transport": links[0].get("transport", transport)}
    if rtt:
        evidence["latency_us"] = max(rtt)
    missing = [link["partner"] for link in links if "tx_gbit_s" not in link]
    detail = f"rank(s) {missing} sent no figures back: only this side's receiving is judged" if missing else ""
    return result(kind, value, UNIT, detail=detail, evidence=evidence)


# ---- rank 0 ----


def serve(
    port: int, rdv: Rendezvous, per_direction: float, ib: str | None, transport: str, wait_s: float
) -> list[dict[str, Any]]:
    """Accept every partner's connections, then measure them one by one."""
    if socket.has_dualstack_ipv6():
        listener = socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=128)
    else:
        listener = socket.create_server(("", port), backlog=128)
    peers: dict[int, Peer] = {}
    with listener:
        listener.settimeout(0.5)
        deadline = time.monotonic() + wait_s
        expected = set(range(1, rdv.nodes))
        while not (set(peers) == expected and all(p.complete for p in peers.values())):
            if time.monotonic() > deadline:
                absent = sorted(expected - {r for r, p in peers.items() if p.complete})
                _close_all(peers)
                raise LinkError(f"rank(s) {absent} did not connect to port {port} within {wait_s:.0f} s")
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            _welcome(conn, peers, expected)
    links = []
    try:
        for rank in sorted(peers):
            peer = peers[rank]
            for conn in peer.data.values():
                conn.settimeout(per_direction + 60)
            use_ib = ib if (ib and peer.ib and transport != "tcp") else None
            if transport == "ib" and not use_ib:
                # Both ends skip alike: the partner learns why instead of waiting for a measurement.
                why = (
                    f"--transport ib needs InfiniBand (an active port and ib_write_bw) at both ends: "
                    f"rank 0 has {ib or 'none'}, rank {rank} has {peer.ib or 'none'}"
                )
                _send_line(peer.ctl, {"go": False, "why": why})
                links.append({"partner": rank, "skip": why})
                continue
            links.append(_serve_peer(peer, per_direction, use_ib, port + 1))
    finally:
        _close_all(peers)
    return links


def _welcome(conn: socket.socket, peers: dict[int, Peer], expected: set[int]) -> None:
    conn.settimeout(10)
    try:
        words = read_line(conn).split()
    except (OSError, LinkError):
        words = []
    rank = int(words[1]) if words and words[0] == MAGIC and words[1].isdigit() else -1
    role, rest = (words[2], words[3:]) if rank in expected else ("", [])
    if role == "ctl" and len(rest) == 2 and rest[0].isdigit():
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peers[rank] = Peer(rank, conn, int(rest[0]), None if rest[1] == "-" else rest[1])
    elif role == "data" and len(rest) == 1 and rest[0].isdigit() and rank in peers:
        peers[rank].data[int(rest[0])] = conn
    else:
        conn.close()  # not one of ours: a stray connection or a scanner


def _serve_peer(peer: Peer, per_direction: float, ib: str | None, ib_port: int) -> dict[str, Any]:
    ctl = peer.ctl
    ctl.settimeout(per_direction * 2 + 120)
    _send_line(ctl, {"go": True, "seconds": per_direction, "pings": PINGS, "ib": ib is not None, "ib_port": ib_port})
    echoes = []
    last = time.perf_counter()
    for _ in range(PINGS):
        _recv_exact(ctl, 1)
        now = time.perf_counter()
        echoes.append(now - last)
        last = now
        ctl.sendall(b"p")
    link: dict[str, Any] = {"partner": peer.rank, "streams": len(peer.data)}
    link["rtt_us"] = _rtt(echoes[1:])  # the first interval includes the go message
    if ib:
        link.update(_ib_server(ib, ib_port, per_direction, ctl))
    else:
        link["transport"] = "tcp"
        rx = receive(list(peer.data.values()))
        link.update(rx_gbit_s=rx["gbit_s"], rx=rx)
        sent = send(list(peer.data.values()), per_direction)
        link["tx_sent"] = sent
    _send_line(ctl, {"rx_gbit_s": link["rx_gbit_s"]})
    with contextlib.suppress(LinkError, OSError, ValueError):
        link["tx_gbit_s"] = float(json.loads(read_line(ctl))["rx_gbit_s"])
    return link


def _close_all(peers: dict[int, Peer]) -> None:
    for peer in peers.values():
        for conn in (peer.ctl, *peer.data.values()):
            conn.close()


# ---- other ranks ----


def join(rdv: Rendezvous, port: int, streams: int, ib: str | None, wait_s: float) -> dict[str, Any]:
    """Connect to rank 0 and take part in its measurement of this node."""
    deadline = time.monotonic() + wait_s
    ctl = _connect(rdv.master_addr, port, deadline)
    data: list[socket.socket] = []
    try:
        ctl.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        ctl.sendall(f"{MAGIC} {rdv.node_rank} ctl {streams} {ib or '-'}\n".encode())
        for index in range(streams):
            conn = _connect(rdv.master_addr, port, deadline)
            data.append(conn)
            conn.sendall(f"{MAGIC} {rdv.node_rank} data {index}\n".encode())
        # Rank 0 may be measuring other partners first: wait for it as long as the step may last.
        ctl.settimeout(wait_s * max(1, rdv.nodes - 1))
        go = json.loads(read_line(ctl))
        if not go.get("go"):
            return {"partner": 0, "skip": str(go.get("why", "rank 0 declined"))}
        per_direction = float(go["seconds"])
        ctl.settimeout(per_direction * 2 + 120)
        for conn in data:
            conn.settimeout(per_direction + 60)
        rtts = []
        for _ in range(int(go["pings"])):
            started = time.perf_counter()
            ctl.sendall(b"p")
            _recv_exact(ctl, 1)
            rtts.append(time.perf_counter() - started)
        link: dict[str, Any] = {"partner": 0, "streams": streams, "rtt_us": _rtt(rtts)}
        if go.get("ib"):
            link.update(_ib_client(ib or "", rdv.master_addr, int(go["ib_port"]), per_direction, ctl))
        else:
            link["transport"] = "tcp"
            link["tx_sent"] = send(data, per_direction)
            rx = receive(data)
            link.update(rx_gbit_s=rx["gbit_s"], rx=rx)
        theirs = json.loads(read_line(ctl))
        link["tx_gbit_s"] = float(theirs["rx_gbit_s"])
        _send_line(ctl, {"rx_gbit_s": link["rx_gbit_s"]})
    except (ValueError, KeyError, TypeError) as exc:
        raise LinkError(f"rank 0 said something unexpected: {exc}") from None
    else:
        return link
    finally:
        for conn in (ctl, *data):
            conn.close()


def _connect(host: str, port: int, deadline: float) -> socket.socket:
    """Connect, retrying while rank 0 is not listening yet."""
    while True:
        try:
            return socket.create_connection((host, port), timeout=10)
        except OSError as exc:
            if time.monotonic() > deadline:
                raise LinkError(f"cannot connect to rank 0 at {host}:{port}: {exc.strerror or exc}") from None
            time.sleep(0.2)


# ---- TCP streams ----


def send(conns: list[socket.socket], seconds: float) -> dict[str, Any]:
    """Stream on every connection for `seconds`, then close each one's sending side."""
    chunk = memoryview(bytes(CHUNK))
    sent = [0] * len(conns)
    stop_at = time.monotonic() + seconds

    def pump(i: int) -> None:
        conn = conns[i]
        while time.monotonic() < stop_at:
            conn.sendall(chunk)
            sent[i] += CHUNK
        conn.shutdown(socket.SHUT_WR)

    started = time.perf_counter()
    _in_threads(pump, len(conns))
    elapsed = time.perf_counter() - started
    return {"bytes": sum(sent), "seconds": elapsed, "gbit_s": sum(sent) * 8 / elapsed / 1e9}


def receive(conns: list[socket.socket]) -> dict[str, Any]:
    """Read every connection to its end; the rate from the first byte to the last connection's end."""
    got = [0] * len(conns)
    first = [0.0] * len(conns)
    last = [0.0] * len(conns)

    def drain(i: int) -> None:
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        conn = conns[i]
        while True:
            n = conn.recv_into(view)
            if not n:
                break
            now = time.perf_counter()
            if not got[i]:
                first[i] = now
            got[i] += n
            last[i] = now

    _in_threads(drain, len(conns))
    starts = [f for f, g in zip(first, got, strict=True) if g]
    if not starts:
        raise LinkError("the partner sent nothing")
    elapsed = max(1e-6, max(last) - min(starts))
    total = sum(got)
    return {"bytes": total, "seconds": elapsed, "gbit_s": total * 8 / elapsed / 1e9}


def _in_threads(work: Callable[[int], None], count: int) -> None:
    """Run work(0..count-1) in threads (socket calls release the GIL); re-raise the first error."""
    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            work(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise LinkError(f"stream failed: {errors[0]}")


# ---- InfiniBand ----


def ib_device(wanted: str | None, root: Path = IB_SYS) -> str | None:
    """The InfiniBand device to use (`wanted`, or the first with an ACTIVE port) where ib_write_bw is
    installed, or None."""
    if find_tool("ib_write_bw") is None:
        return None
    try:
        devices = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
    except OSError:
        return None
    for device in devices:
        if wanted and device != wanted:
            continue
        for state in sorted((root / device / "ports").glob("*/state")):
            with contextlib.suppress(OSError):
                if "ACTIVE" in state.read_text():
                    return device
    return None


def parse_ib_write_bw(output: str) -> dict[str, float]:
    """The figures of ib_write_bw's result row (run with --report_gbits): bytes, iterations, peak and
    average Gbit/s, message rate. Raises ValueError when there is no result row."""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if "BW average" in line:
            for row in lines[i + 1 :]:
                numbers = re.findall(r"[-+]?\d+(?:\.\d+)?", row)
                if len(numbers) >= 4 and not row.strip().startswith("-"):
                    keys = ("bytes", "iterations", "peak_gbit_s", "average_gbit_s", "msg_rate_mpps")
                    return {k: float(v) for k, v in zip(keys, numbers, strict=False)}
            break
    raise ValueError(f"ib_write_bw printed no result row: {tail(output)}")


def _ib_argv(device: str, port: int, seconds: float) -> list[str]:
    exe = find_tool("ib_write_bw") or "ib_write_bw"
    # -F: no failure over CPU frequency scaling warnings; -D: run for this many seconds.
    return [exe, "-d", device, "-p", str(port), "-D", str(max(1, round(seconds))), "--report_gbits", "-F"]


def _ib_server(device: str, port: int, seconds: float, ctl: socket.socket) -> dict[str, Any]:
    argv = _ib_argv(device, port, seconds)
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as server:
        time.sleep(1.0)  # let it listen before the partner's client connects (the client also retries)
        _send_line(ctl, {"ib_ready": True})
        try:
            output, _ = server.communicate(timeout=seconds + 120)
        except subprocess.TimeoutExpired:
            server.kill()
            raise LinkError("ib_write_bw (server) did not finish") from None
    figures = parse_ib_write_bw(output)
    return {"transport": f"ib_write_bw on {device}", "rx_gbit_s": figures["average_gbit_s"], "ib": figures}


def _ib_client(device: str, host: str, port: int, seconds: float, ctl: socket.socket) -> dict[str, Any]:
    read_line(ctl)  # the server is up
    output = ""
    for _ in range(5):
        try:
            done = subprocess.run(
                [*_ib_argv(device, port, seconds), host],
                capture_output=True,
                text=True,
                timeout=seconds + 120,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise LinkError("ib_write_bw (client) did not finish") from None
        output = done.stdout + done.stderr
        if done.returncode == 0:
            break
        time.sleep(1.0)
    figures = parse_ib_write_bw(output)
    # ib_write_bw measures the client's writes into the server; both ends report that one figure.
    return {"transport": f"ib_write_bw on {device}", "rx_gbit_s": figures["average_gbit_s"], "ib": figures}


# ---- the control connection ----


def read_line(conn: socket.socket) -> str:
    """One line from a control connection, byte by byte: nothing past it is taken from the socket
    (ping bytes and streams follow on the same connections)."""
    data = bytearray()
    while len(data) < MAX_LINE:
        byte = conn.recv(1)
        if not byte:
            raise LinkError("the partner closed the connection")
        if byte == b"\n":
            return data.decode("utf-8", "replace")
        data += byte
    raise LinkError("the partner sent an over-long line")


def _send_line(conn: socket.socket, message: dict[str, Any]) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")


def _recv_exact(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        more = conn.recv(size - len(data))
        if not more:
            raise LinkError("the partner closed the connection")
        data += more
    return data


def _rtt(seconds: list[float]) -> dict[str, float]:
    if not seconds:
        return {}
    micro = sorted(s * 1e6 for s in seconds)
    return {
        "min": micro[0],
        "median": statistics.median(micro),
        "p99": micro[min(len(micro) - 1, int(len(micro) * 0.99))],
        "count": float(len(micro)),
    }
