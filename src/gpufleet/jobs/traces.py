"""Job traces for `gpufleet sim replay`: the Alibaba GPU trace 2023 ("openb") and the Philly runtime list.

Pure parsers: each takes the file's lines (and a name for messages) and returns plain dataclasses; the
`read_*` wrappers only open the file. A malformed file raises `InvalidInput` naming the file and line.

**openb pod list** (`openb_pod_list_*.csv`, alibaba/clusterdata cluster-trace-gpu-v2023): one pod a
row with `name, num_gpu, gpu_milli, qos, pod_phase, creation_time, deletion_time, scheduled_time`
(seconds from the trace's start; CPU, memory and `gpu_spec` are read past, see below).

- `num_gpu = 0`: a CPU-only pod. Skipped (the built-in scheduler places GPUs) and counted.
- never ran: a `Pending` pod, or one without `scheduled_time` or `deletion_time`. Skipped and counted.
- `gpu_milli < 1000` with one GPU: a share of a GPU. The built-in scheduler gives whole GPUs, so a
  share is rounded up to one GPU, and counted.
- arrival = `creation_time`; runtime = `deletion_time - scheduled_time` (`creation_time` where
  `scheduled_time` is empty). `Failed` pods held their GPUs until deleted, so they count like the rest;
  pods still `Running` when the trace was cut end at their `deletion_time` (the cut).
- project = `qos` (LS, BE, Burstable, Guaranteed), so fair share has several accounts to balance;
  priority 1 for LS (latency-sensitive) and Guaranteed pods, 0 for the rest.
- CPU and memory requests are not replayed: the GPU nodes have CPUs and memory to spare for them
  and the question is GPU placement. `gpu_spec` (a GPU model constraint) is empty in the default list.

**openb node list** (`openb_node_list_gpu_node.csv`): `sn, gpu, model`; nodes without GPUs are left out.

**Philly runtime list** (`philly_runtime.csv`, cluster-trace-gpu-v2020/analysis): one column,
`runtime` in seconds, sorted; no arrival times and no GPU counts. `synthesise_philly` makes jobs of
it: runtimes in a seeded random order, Poisson arrivals at the rate that offers the cluster `load`
of its GPU-time, and GPU counts drawn from `PHILLY_GPU_MIX`, all from one `random.Random(seed)`, so
the same arguments give the same jobs. One project, priority 0.
"""

from __future__ import annotations

import csv
import math
import random
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from gpufleet.core.errors import InvalidInput

TraceFormat = Literal["openb", "philly"]

OPENB_POD_COLUMNS = (
    "name",
    "num_gpu",
    "gpu_milli",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)
OPENB_NODE_COLUMNS = ("sn", "gpu", "model")
PHILLY_COLUMNS = ("runtime",)

# The Philly list has no GPU counts. Assumed (not from the trace): most jobs use one GPU, as the Philly
# paper (Jeon et al., ATC '19) reports, and the rest 2, 4 or a whole 8-GPU node. Weights, by GPUs.
PHILLY_GPU_MIX: Mapping[int, float] = {1: 0.70, 2: 0.10, 4: 0.10, 8: 0.10}
HIGH_PRIORITY_QOS = frozenset({"LS", "Guaranteed"})


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job to replay: when it arrives, how long it runs once started, and what it asks for."""

    id: str
    arrival: float  # seconds since the trace's start
    runtime: float  # seconds
    gpus_per_node: int
    nodes: int = 1
    project: str = "default"
    priority: int = 0

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True, slots=True)
class TraceNode:
    name: str
    gpus: int
    model: str | None = None


@dataclass(frozen=True, slots=True)
class Trace:
    """The jobs of a trace file plus what was skipped, rounded or made up on the way (`notes`)."""

    source: str
    format: TraceFormat
    jobs: tuple[TraceJob, ...]
    rows: int  # data rows in the file
    counts: Mapping[str, int] = field(default_factory=dict)  # e.g. skipped_cpu_only, rounded_shares
    notes: tuple[str, ...] = ()


def _rows(lines: Iterable[str], source: str, required: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row) for each data row, after checking the header has every `required` column."""
    reader = csv.reader(lines)
    try:
        header = next(reader)
    except StopIteration:
        raise InvalidInput(f"{source}: empty file (expected a CSV header with {', '.join(required)})") from None
    except csv.Error as exc:
        raise InvalidInput(f"{source}, line 1: {exc}") from None
    header = [h.strip() for h in header]
    missing = [c for c in required if c not in header]
    if missing:
        raise InvalidInput(f"{source}: missing column(s) {', '.join(missing)} (header: {','.join(header)})")
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise InvalidInput(f"{source}, line {reader.line_num}: {exc}") from None
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise InvalidInput(f"{source}, line {reader.line_num}: {len(row)} fields, the header has {len(header)}")
        yield reader.line_num, {h: cell.strip() for h, cell in zip(header, row, strict=True)}


def _int(value: str, column: str, where: str, *, minimum: int = 0) -> int:
    try:
        number = int(value)
    except ValueError:
        raise InvalidInput(f"{where}: {column} {value!r} is not a whole number") from None
    if number < minimum:
        raise InvalidInput(f"{where}: {column} {number} is below {minimum}")
    return number


def _seconds(value: str, column: str, where: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise InvalidInput(f"{where}: {column} {value!r} is not a number of seconds") from None
    if not math.isfinite(number) or number < 0:
        raise InvalidInput(f"{where}: {column} {value!r} is not a number of seconds >= 0")
    return number


def detect_format(header_line: str, source: str) -> TraceFormat:
    """Which trace a file holds, from its first line; `InvalidInput` for anything else."""
    columns = {c.strip() for c in header_line.strip().split(",")}
    if set(OPENB_POD_COLUMNS) <= columns:
        return "openb"
    if columns == set(PHILLY_COLUMNS):
        return "philly"
    if set(OPENB_NODE_COLUMNS) <= columns:
        raise InvalidInput(f"{source} is an openb node list, not a job trace: pass it as --nodes-file")
    raise InvalidInput(
        f"{source}: not a known trace (an openb pod list has {','.join(OPENB_POD_COLUMNS)}; "
        f"a Philly runtime list has the one column 'runtime')"
    )


def parse_openb_pods(lines: Iterable[str], source: str, limit: int | None = None) -> Trace:
    """The GPU pods of an openb pod list that ran, as jobs (see the module doc for what is skipped).

    `limit`: read only the first `limit` data rows. Raises `InvalidInput` for a missing column, a
    non-numeric or negative count or time, a pod deleted before it started, or a duplicate name.
    """
    jobs: list[TraceJob] = []
    seen: set[str] = set()
    rows = cpu_only = never_ran = rounded = 0
    for line, row in _rows(lines, source, OPENB_POD_COLUMNS):
        if limit is not None and rows >= limit:
            break
        rows += 1
        where = f"{source}, line {line}"
        name = row["name"]
        if not name:
            raise InvalidInput(f"{where}: empty name")
        if name in seen:
            raise InvalidInput(f"{where}: pod {name} appears twice")
        seen.add(name)
        gpus = _int(row["num_gpu"], "num_gpu", where)
        milli = _int(row["gpu_milli"] or "0", "gpu_milli", where)
        created = _seconds(row["creation_time"], "creation_time", where)
        if gpus == 0:
            cpu_only += 1
            continue
        if row["pod_phase"] == "Pending" or not row["deletion_time"]:
            never_ran += 1
            continue
        started = _seconds(row["scheduled_time"], "scheduled_time", where) if row["scheduled_time"] else created
        deleted = _seconds(row["deletion_time"], "deletion_time", where)
        if deleted < started:
            raise InvalidInput(f"{where}: deletion_time {deleted:g} is before the pod started ({started:g})")
        if milli < 1000:
            rounded += 1
        qos = row["qos"] or "default"
        jobs.append(
            TraceJob(
                id=name,
                arrival=created,
                runtime=deleted - started,
                gpus_per_node=gpus,
                project=qos,
                priority=1 if qos in HIGH_PRIORITY_QOS else 0,
            )
        )
    jobs.sort(key=lambda j: (j.arrival, j.id))
    counts = {"skipped_cpu_only": cpu_only, "skipped_never_ran": never_ran, "rounded_shares": rounded}
    notes = (
        f"{cpu_only} CPU-only pod(s) skipped",
        f"{never_ran} pod(s) that never ran (Pending, or no deletion time) skipped",
        f"{rounded} GPU share(s) (gpu_milli < 1000) rounded up to one whole GPU",
        "project = qos; priority 1 for LS and Guaranteed pods; CPU and memory requests not replayed",
    )
    return Trace(source=source, format="openb", jobs=tuple(jobs), rows=rows, counts=counts, notes=notes)


def parse_openb_nodes(lines: Iterable[str], source: str) -> list[TraceNode]:
    """The GPU nodes of an openb node list (nodes with no GPU left out), in file order."""
    nodes: list[TraceNode] = []
    seen: set[str] = set()
    for line, row in _rows(lines, source, OPENB_NODE_COLUMNS):
        where = f"{source}, line {line}"
        name = row["sn"]
        if not name:
            raise InvalidInput(f"{where}: empty sn")
        if name in seen:
            raise InvalidInput(f"{where}: node {name} appears twice")
        seen.add(name)
        gpus = _int(row["gpu"], "gpu", where)
        if gpus:
            nodes.append(TraceNode(name=name, gpus=gpus, model=row["model"] or None))
    if not nodes:
        raise InvalidInput(f"{source}: no node with a GPU")
    return nodes


def parse_philly_runtimes(lines: Iterable[str], source: str) -> list[float]:
    """The runtimes (seconds) of a Philly runtime list, in file order."""
    runtimes: list[float] = []
    for line, row in _rows(lines, source, PHILLY_COLUMNS):
        runtimes.append(_seconds(row["runtime"], "runtime", f"{source}, line {line}"))
    if not runtimes:
        raise InvalidInput(f"{source}: no runtimes")
    return runtimes


def synthesise_philly(
    runtimes: Sequence[float],
    source: str,
    cluster_gpus: int,
    *,
    load: float = 0.8,
    seed: int = 1,
    limit: int | None = None,
    mix: Mapping[int, float] = PHILLY_GPU_MIX,
) -> Trace:
    """Jobs from a runtime distribution: seeded order, Poisson arrivals, GPU counts drawn from `mix`.

    The arrival rate is `load * cluster_gpus / (mean GPUs * mean runtime)`, so on average the jobs ask
    for `load` of the cluster's GPU-seconds. `limit`: use a seeded random sample of that many runtimes
    (the file is sorted, so its first lines would all be the shortest jobs).
    """
    if cluster_gpus <= 0:
        raise InvalidInput("the cluster has no GPUs")
    if not 0 < load <= 10:
        raise InvalidInput(f"load {load} must be above 0 and at most 10")
    if not mix or any(g <= 0 or w < 0 for g, w in mix.items()) or sum(mix.values()) <= 0:
        raise InvalidInput("the GPU mix needs positive GPU counts with non-negative weights")
    rng = random.Random(seed)  # noqa: S311 - a reproducible simulation, not a secret
    picked = list(runtimes)
    if limit is not None and limit < len(picked):
        picked = rng.sample(picked, limit)
    else:
        rng.shuffle(picked)
    sizes = sorted(mix)
    weights = [mix[g] for g in sizes]
    mean_gpus = sum(g * w for g, w in zip(sizes, weights, strict=True)) / sum(weights)
    mean_runtime = sum(picked) / len(picked) if picked else 0.0
    rate = load * cluster_gpus / (mean_gpus * mean_runtime) if mean_runtime > 0 else 1.0
    jobs: list[TraceJob] = []
    now = 0.0
    width = len(str(len(picked)))
    for i, runtime in enumerate(picked):
        now += rng.expovariate(rate)
        gpus = rng.choices(sizes, weights)[0]
        jobs.append(TraceJob(id=f"philly-{i:0{width}}", arrival=now, runtime=runtime, gpus_per_node=gpus))
    mix_text = ", ".join(f"{g} GPU {w / sum(weights):.0%}" for g, w in zip(sizes, weights, strict=True))
    notes = (
        f"synthetic arrivals: Poisson, {rate * 3600:.2f} jobs/hour, chosen to offer {load:.0%} of "
        f"{cluster_gpus} GPUs (seed {seed})",
        f"synthetic GPU counts (assumed, not in the trace): {mix_text}",
        f"{len(picked)} of {len(runtimes)} runtimes, in a seeded random order; one project, priority 0",
    )
    counts = {"runtimes": len(runtimes), "used": len(picked)}
    return Trace(source=source, format="philly", jobs=tuple(jobs), rows=len(runtimes), counts=counts, notes=notes)


def _lines(path: Path) -> list[str]:
    try:
        with path.open(newline="", encoding="utf-8") as f:
            return f.readlines()
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise InvalidInput(f"{path}: not UTF-8 text") from None


def read_format(path: Path) -> TraceFormat:
    """The trace format of a file, from its header."""
    lines = _lines(path)
    if not lines:
        raise InvalidInput(f"{path}: empty file")
    return detect_format(lines[0], str(path))


def read_openb_nodes(path: Path) -> list[TraceNode]:
    return parse_openb_nodes(_lines(path), str(path))


def read_trace(path: Path, *, cluster_gpus: int, limit: int | None = None, load: float = 0.8, seed: int = 1) -> Trace:
    """Read a trace file of either format. `cluster_gpus`, `load`, `seed` matter only for Philly."""
    lines = _lines(path)
    if not lines:
        raise InvalidInput(f"{path}: empty file")
    fmt = detect_format(lines[0], str(path))
    if fmt == "openb":
        return parse_openb_pods(lines, str(path), limit=limit)
    runtimes = parse_philly_runtimes(lines, str(path))
    return synthesise_philly(runtimes, str(path), cluster_gpus, load=load, seed=seed, limit=limit)


def homogeneous(nodes: int, gpus_per_node: int) -> list[TraceNode]:
    """`nodes` nodes of `gpus_per_node` GPUs each (`--nodes N --gpus-per-node G`)."""
    if nodes < 1 or gpus_per_node < 1:
        raise InvalidInput("--nodes and --gpus-per-node must both be at least 1")
    width = max(4, len(str(nodes - 1)))
    return [TraceNode(name=f"node{i:0{width}}", gpus=gpus_per_node) for i in range(nodes)]


OPENB_NODE_LIST = "openb_node_list_gpu_node.csv"


def resolve_cluster(
    trace: Path,
    fmt: TraceFormat,
    *,
    nodes_file: Path | None = None,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
) -> tuple[list[TraceNode], str]:
    """The nodes to replay on, and a line saying where they came from.

    `--nodes N --gpus-per-node G` (both) make a homogeneous cluster; else `--nodes-file`; else, for an
    openb trace, the openb node list beside it. A Philly list has no nodes, so it needs one of those.
    """
    if nodes is not None or gpus_per_node is not None:
        if nodes_file is not None:
            raise InvalidInput("give either --nodes-file or --nodes with --gpus-per-node, not both")
        if nodes is None or gpus_per_node is None:
            raise InvalidInput("--nodes and --gpus-per-node go together")
        return homogeneous(nodes, gpus_per_node), f"{nodes} nodes x {gpus_per_node} GPUs (homogeneous)"
    if nodes_file is None:
        if fmt == "philly":
            raise InvalidInput(
                f"{trace} has runtimes only, no nodes: give --nodes N --gpus-per-node G (or --nodes-file)"
            )
        nodes_file = trace.parent / OPENB_NODE_LIST
        if not nodes_file.is_file():
            raise InvalidInput(f"no {OPENB_NODE_LIST} beside {trace}: give --nodes-file or --nodes and --gpus-per-node")
    listed = read_openb_nodes(nodes_file)
    sizes = Counter(n.gpus for n in listed)
    mix = ", ".join(f"{count} x {gpus}" for gpus, count in sorted(sizes.items(), reverse=True))
    return listed, f"{len(listed)} nodes from {nodes_file} ({mix} GPUs)"
