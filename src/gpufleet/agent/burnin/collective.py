"""All-reduce bus bandwidth across the nodes of a step: NCCL with one process per GPU, gloo on the CPU
where the node has no GPU visible.

Layout: one gpufleet-burnin per node (the job's rank, NODE_RANK of WORLD_SIZE). The node of rank 0
serves a TCPStore at MASTER_ADDR:MASTER_PORT; every node writes how many processes it brings (its GPUs,
or one CPU process) and which backend, then reads everyone's, so a node's processes take global ranks
`sum(processes of lower nodes) + local` and nodes with different GPU counts still line up. A GPU node
spawns one process per GPU; a CPU node measures in its own process.

Measure: a correctness all-reduce (every rank sends rank+1; the sum is known exactly), then three
sizes (size/64, size/8, size), each warmed up, timed for a few calls to agree (MIN over ranks) on how
many calls fit in its share of the time, and timed again over those. Bus bandwidth is nccl-tests'
definition: algbw × 2(n-1)/n with algbw = bytes / time per call; the value is the largest size's,
the worst local process's. A wrong sum fails the step outright.
"""

from __future__ import annotations

import datetime
import json
import os
import queue
import socket
import time
import traceback
from dataclasses import dataclass
from typing import Any

from gpufleet.agent.burnin.common import (
    TORCH_MISSING,
    Run,
    Usage,
    failed,
    human_bytes,
    no_gpu_reason,
    parse_size,
    progress,
    quiet_import,
    rendezvous,
    result,
    skipped,
)
from gpufleet.protocol.burnin import StepResult

UNIT = "GB/s"
MAX_CALLS = 100_000
SHARES = (0.15, 0.15, 0.7)  # of the step's time, per size (small, medium, the one that is judged)
DEFAULT_GPU_SIZE = 256 << 20
DEFAULT_CPU_SIZE = 16 << 20
STORE_PREFIX = "gpufleet-burnin-allreduce"


@dataclass(frozen=True)
class WorkerSpec:
    """What each measuring process needs (pickled to spawned children)."""

    master_addr: str
    master_port: int
    base_rank: int
    world: int
    backend: str
    cuda: bool
    size: int
    seconds: float
    timeout_s: float


def allreduce(run: Run) -> StepResult:
    kind = run.kind
    try:
        with quiet_import():
            import torch
            import torch.distributed as dist
    except ImportError:
        return failed(kind, UNIT, TORCH_MISSING)
    rdv = rendezvous()
    gpus = 0 if no_gpu_reason() else (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    backend = str(run.options["backend"])
    if backend == "auto":
        backend = "nccl" if gpus else "gloo"
    if backend == "nccl" and not gpus:
        raise Usage("--backend nccl needs GPUs, and this node has none visible")
    cuda = gpus > 0
    procs = gpus if cuda else 1
    size = _size(str(run.options["size"]), cuda)
    if backend == "gloo" and "GLOO_SOCKET_IFNAME" not in os.environ:
        iface = route_interface(rdv.master_addr)
        if iface:
            # gloo otherwise takes the address the host name resolves to, which on many nodes is not
            # the interface that reaches the other node (or is 127.0.1.1).
            os.environ["GLOO_SOCKET_IFNAME"] = iface
    timeout_s = max(60.0, run.seconds) + 60.0
    progress(
        f"{kind}: node {rdv.node_rank} of {rdv.nodes}, {procs} process(es) on {'GPUs' if cuda else 'the CPU'}, "
        f"{backend}, up to {human_bytes(size)}, rendezvous {rdv.master_addr}:{rdv.master_port}"
    )
    try:
        # TCPStore and PrefixStore are public API that torch.distributed re-exports without declaring it.
        store = dist.TCPStore(  # type: ignore[attr-defined]
            rdv.master_addr,
            rdv.master_port,
            None,
            rdv.node_rank == 0,
            datetime.timedelta(seconds=timeout_s),
            wait_for_workers=False,
        )
        me = {"procs": procs, "backend": backend, "host": socket.gethostname()}
        store.set(f"{STORE_PREFIX}/node/{rdv.node_rank}", json.dumps(me))
        nodes = [json.loads(store.get(f"{STORE_PREFIX}/node/{r}")) for r in range(rdv.nodes)]
    except (RuntimeError, OSError, ValueError) as exc:
        return failed(kind, UNIT, f"rendezvous at {rdv.master_addr}:{rdv.master_port} failed: {_first_line(exc)}")
    facts: dict[str, Any] = {
        "torch": torch.__version__,
        "backend": backend,
        "nodes": rdv.nodes,
        "node_rank": rdv.node_rank,
        "processes": [n["procs"] for n in nodes],
        "hosts": [n["host"] for n in nodes],
    }
    if cuda and backend == "nccl":
        facts["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())  # type: ignore[no-untyped-call]
    backends = {n["backend"] for n in nodes}
    if len(backends) > 1:
        _finish(store, rdv.node_rank, rdv.nodes, timeout_s)
        return failed(kind, UNIT, f"the nodes chose different backends ({', '.join(sorted(backends))})", evidence=facts)
    world = sum(int(n["procs"]) for n in nodes)
    if world < 2:
        _finish(store, rdv.node_rank, rdv.nodes, timeout_s)
        return skipped(kind, UNIT, "one process in all: nothing to all-reduce with (one node, at most one GPU)")
    base = sum(int(n["procs"]) for n in nodes[: rdv.node_rank])
    spec = WorkerSpec(rdv.master_addr, rdv.master_port, base, world, backend, cuda, size, run.seconds, timeout_s)
    facts["world"] = world
    try:
        figures = [measure(spec, 0)] if procs == 1 else _spawn(spec, procs)
    finally:
        _finish(store, rdv.node_rank, rdv.nodes, timeout_s)
    return _judge(kind, figures, cuda, facts)


def _judge(kind: str, figures: list[dict[str, Any]], cuda: bool, facts: dict[str, Any]) -> StepResult:
    errors = [f for f in figures if "error" in f]
    if errors:
        return failed(kind, UNIT, f"process {errors[0]['local']}: {errors[0]['error']}", evidence=facts)
    facts["sizes"] = {str(f["local"]): f["sizes"] for f in figures}
    value = min(float(f["busbw_gb_s"]) for f in figures)
    per_gpu = {str(f["local"]): float(f["busbw_gb_s"]) for f in figures} if cuda else {}
    wrong = [f for f in figures if not f["sum_ok"]]
    progress(f"{kind}: bus bandwidth {value:.2f} {UNIT}")
    if wrong:
        where = ", ".join(str(f["device"]) for f in wrong)
        return failed(kind, UNIT, f"all-reduce returned wrong sums on {where}", value=value, evidence=facts)
    return result(kind, value, UNIT, per_gpu=per_gpu, evidence=facts)


def _size(option: str, cuda: bool) -> int:
    if option == "auto":
        return DEFAULT_GPU_SIZE if cuda else DEFAULT_CPU_SIZE
    try:
        return parse_size(option)
    except ValueError as exc:
        raise Usage(f"--size: {exc}") from None


def _finish(store: Any, node_rank: int, nodes: int, timeout_s: float) -> None:
    """Every node says it is done; the node serving the store waits for all of them before its exit
    takes the store away (a slower node may still be reading it)."""
    try:
        store.add(f"{STORE_PREFIX}/done", 1)
        if node_rank != 0:
            return
        # Bounded well inside the job's limit (3 × seconds + 120): a partner that died mid-step must not
        # cost this node its own result.
        deadline = time.monotonic() + min(timeout_s, 30.0)
        while store.add(f"{STORE_PREFIX}/done", 0) < nodes and time.monotonic() < deadline:
            time.sleep(0.05)
    except (RuntimeError, OSError):
        pass  # a partner that vanished has its own result to tell


def _spawn(spec: WorkerSpec, procs: int) -> list[dict[str, Any]]:
    """One spawned process per GPU; their figures, or {'local', 'error'} for each that failed."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")  # CUDA cannot be used in a forked child
    answers: Any = ctx.Queue()
    children = [ctx.Process(target=_child, args=(spec, local, answers), daemon=True) for local in range(procs)]
    for child in children:
        child.start()
    figures: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + spec.timeout_s + 2 * spec.seconds
    while len(figures) < procs and time.monotonic() < deadline:
        try:
            answer = answers.get(timeout=0.5)
        except queue.Empty:
            if not any(c.is_alive() for c in children) and answers.empty():
                break
            continue
        figures[int(answer["local"])] = answer
    for child in children:
        child.join(timeout=10)
        if child.is_alive():
            child.terminate()
            child.join(timeout=5)
    for local, child in enumerate(children):
        if local not in figures:
            figures[local] = {"local": local, "error": f"exited with status {child.exitcode} and no figures"}
    return [figures[local] for local in range(procs)]


def _child(spec: WorkerSpec, local: int, answers: Any) -> None:
    try:
        answers.put(measure(spec, local))
    except Exception as exc:
        answers.put({"local": local, "error": _first_line(exc), "traceback": traceback.format_exc()[-2000:]})


def measure(spec: WorkerSpec, local: int) -> dict[str, Any]:
    """One process's part: join the process group, check a sum, time the three sizes."""
    with quiet_import():
        import torch
        import torch.distributed as dist

    rank = spec.base_rank + local
    device = torch.device("cuda", local) if spec.cuda else torch.device("cpu")
    if spec.cuda:
        torch.cuda.set_device(device)

    def sync() -> None:
        if spec.cuda:
            torch.cuda.synchronize(device)

    timeout = datetime.timedelta(seconds=spec.timeout_s)
    store = dist.TCPStore(spec.master_addr, spec.master_port, None, False, timeout)  # type: ignore[attr-defined]
    group_store = dist.PrefixStore(f"{STORE_PREFIX}/group", store)  # type: ignore[attr-defined]
    dist.init_process_group(spec.backend, store=group_store, rank=rank, world_size=spec.world, timeout=timeout)
    try:
        check = torch.full((1024,), float(rank + 1), dtype=torch.float32, device=device)
        dist.all_reduce(check)
        sync()
        # Small whole numbers add up exactly in float32, so any difference is a fault, not rounding.
        sum_ok = bool(torch.all(check == spec.world * (spec.world + 1) / 2).item())
        rows = []
        sizes = sorted({max(4096, spec.size // 64), max(4096, spec.size // 8), spec.size})
        shares = SHARES[-len(sizes) :]
        for nbytes, share in zip(sizes, shares, strict=True):
            buf = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)
            for _ in range(2):  # the first calls set up connections and buffers
                dist.all_reduce(buf)
            sync()
            started = time.perf_counter()
            for _ in range(3):
                dist.all_reduce(buf)
            sync()
            per_call = max(1e-6, (time.perf_counter() - started) / 3)
            # Every rank must make the same number of calls, or the last ones wait forever.
            calls = torch.tensor([max(1, min(MAX_CALLS, int(share * spec.seconds / per_call)))], device=device)
            dist.all_reduce(calls, op=dist.ReduceOp.MIN)
            count = int(calls.item())
            started = time.perf_counter()
            for _ in range(count):
                dist.all_reduce(buf)
            sync()
            elapsed = time.perf_counter() - started
            algbw = nbytes / (elapsed / count) / 1e9
            busbw = algbw * 2 * (spec.world - 1) / spec.world
            rows.append({"bytes": nbytes, "calls": count, "seconds": elapsed, "algbw_gb_s": algbw, "busbw_gb_s": busbw})
    finally:
        dist.destroy_process_group()
    name = torch.cuda.get_device_name(device) if spec.cuda else "cpu"
    return {
        "local": local,
        "device": f"GPU {local} ({name})" if spec.cuda else "cpu",
        "sum_ok": sum_ok,
        "busbw_gb_s": rows[-1]["busbw_gb_s"],
        "sizes": rows,
    }


def route_interface(address: str) -> str | None:
    """The name of the local interface that reaches `address`, or None where it cannot be told
    (psutil missing, the name does not resolve)."""
    try:
        import psutil

        family, _, _, _, sockaddr = socket.getaddrinfo(address, 9, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(sockaddr)  # UDP: picks the route, sends nothing
            local = str(probe.getsockname()[0])
        for name, addrs in psutil.net_if_addrs().items():
            if any(str(a.address).split("%")[0] == local for a in addrs):
                return str(name)
    except (ImportError, OSError, IndexError):
        return None
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:500]
