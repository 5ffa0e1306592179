"""On a real NVIDIA machine: do the NVML and nvidia-smi readers describe the GPUs alike, how fast is NVML,
and does the agent's metrics collector fill every GPU metric with a sane value, at what cost?

Run with the package importable and nvidia-ml-py (and psutil) installed:
    PYTHONPATH=src python bench/device_gpu_check.py

Prints both inventories as JSON, a field-by-field comparison and the median time of NvmlReader.read();
then runs the metrics collector (GpuCollector, with the Xid watcher listening) for a few samples and
prints every GPU metric with its value and whether it is in range, or the reason NVML gave for not
offering it, and the cost per sample (CPU and wall time, NVML calls, % of one core at 5 s, RSS).
Exits 1 if the two backends disagree or a metric is missing without NVML saying it is unsupported
or out of range, 2 if either backend cannot read the GPUs at all. Needs no network.
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
import time

import psutil

from gpufleet.agent.gpu.detect import detect_gpus
from gpufleet.agent.gpu.nvml import NvmlReader
from gpufleet.agent.gpu.ports import GpuReadError, normalise_pci_bus_id
from gpufleet.agent.gpu.smi import NvidiaSmiReader
from gpufleet.agent.metrics.gpu import GpuCollector
from gpufleet.agent.metrics.host import HostCollector
from gpufleet.agent.metrics.infiniband import IbCollector
from gpufleet.agent.metrics.sampler import Sampler
from gpufleet.agent.metrics.xid import XidBook, XidWatcher
from gpufleet.protocol.inventory import GpuInfo
from gpufleet.protocol.metrics import GPU_METRICS

# Fields both backends must report identically; memory is compared within a tolerance instead.
EXACT_FIELDS = (
    "uuid",
    "model",
    "serial",
    "pci_bus_id",
    "driver_version",
    "cuda_version",
    "vbios_version",
    "mig_mode",
    "ecc_mode",
)
MEMORY_TOLERANCE = 0.01
TIMED_READS = 20
METRIC_SAMPLES = 20
METRIC_GAP_S = 0.05  # between samples, so counters such as energy can move
INTERVAL_S = 5.0  # the agent's default metrics interval, for the % of one core

# Sane ranges of the GPU metrics (units as in protocol.metrics.GPU_METRICS); checks across metrics
# (used + free <= total, current <= max, links up <= total, energy never falling) come on top.
RANGES: dict[str, tuple[float, float]] = {
    "gpu_util": (0, 100),
    "mem_copy_util": (0, 100),
    "fb_used_mib": (0, 1 << 22),
    "fb_free_mib": (0, 1 << 22),
    "gpu_temp_c": (5, 100),
    "mem_temp_c": (5, 110),
    "power_w": (5, 2000),
    "energy_mj": (1, 1e15),
    "sm_clock_mhz": (100, 3500),
    "mem_clock_mhz": (100, 20000),
    "clocks_event_reasons": (0, 2**32 - 1),
    "pcie_link_gen": (1, 6),
    "pcie_link_gen_max": (1, 6),
    "pcie_link_width": (1, 32),
    "pcie_link_width_max": (1, 32),
    "nvlink_links_up": (0, 36),
    "nvlink_links_total": (1, 36),
    "remapped_rows_pending": (0, 1),
    "remapped_rows_failure": (0, 1),
    "retired_pages_pending": (0, 1),
}
COUNTER_MAX = 1e12  # ECC, remap, retirement, replay and NVLink error counts, xid_last
MAXIMA = {
    "pcie_link_gen": "pcie_link_gen_max",
    "pcie_link_width": "pcie_link_width_max",
    "nvlink_links_up": "nvlink_links_total",
}


def compare(nvml: list[GpuInfo], smi: list[GpuInfo]) -> list[str]:
    """Print a comparison table and return the disagreements, one line each."""
    problems: list[str] = []
    if len(nvml) != len(smi):
        problems.append(f"GPU count: nvml {len(nvml)} != nvidia-smi {len(smi)}")
    for a, b in zip(nvml, smi, strict=False):
        print(f"\nGPU {a.index}:")
        for field in EXACT_FIELDS:
            left, right = getattr(a, field), getattr(b, field)
            if field == "pci_bus_id":
                left, right = normalise_pci_bus_id(left), normalise_pci_bus_id(right)
            same = left == right
            print(f"  {'ok ' if same else 'BAD'} {field:18} nvml={left!r:48} nvidia-smi={right!r}")
            if not same:
                problems.append(f"GPU {a.index} {field}: nvml {left!r} != nvidia-smi {right!r}")
        near = abs(a.memory_total_mib - b.memory_total_mib) <= MEMORY_TOLERANCE * max(a.memory_total_mib, 1)
        print(
            f"  {'ok ' if near else 'BAD'} {'memory_total_mib':18} "
            f"nvml={a.memory_total_mib!r:48} nvidia-smi={b.memory_total_mib!r}"
        )
        if not near:
            problems.append(f"GPU {a.index} memory_total_mib: {a.memory_total_mib} vs {b.memory_total_mib}")
        # Informative only: nvidia-smi's XML has no compute capability, and power limits may be rounded.
        for field in ("power_limit_w", "compute_capability"):
            print(f"  --  {field:18} nvml={getattr(a, field)!r:48} nvidia-smi={getattr(b, field)!r}")
    return problems


def time_reads(reader: NvmlReader) -> float:
    """Median wall time of one NvmlReader.read() in ms, over TIMED_READS reads after the first."""
    times = []
    for _ in range(TIMED_READS):
        start = time.perf_counter()
        reader.read()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def sane(metric: str, value: float, values: dict[str, float], gpu: GpuInfo | None) -> str | None:
    """Why `value` is not a sane `metric` for this GPU, or None when it is."""
    low, high = RANGES.get(metric, (0, COUNTER_MAX))
    limit = gpu.power_limit_w if gpu is not None else None
    memory = gpu.memory_total_mib if gpu is not None else None
    most = values.get(MAXIMA.get(metric, ""))
    why = None
    if not low <= value <= high:
        why = f"{value:g} outside {low:g}..{high:g}"
    elif metric not in RANGES and value != int(value):
        why = f"{value:g} is not a whole count"
    elif metric == "power_w" and limit and value > 1.2 * limit:
        why = f"{value:g} W is over the {limit:g} W limit"
    elif metric == "fb_used_mib" and memory and value + values.get("fb_free_mib", 0) > memory + 1:
        why = f"used + free = {value + values.get('fb_free_mib', 0):g} MiB > {memory} MiB"
    elif most is not None and value > most:
        why = f"{value:g} above {MAXIMA[metric]} {most:g}"
    return why


def check_metrics(inventory: list[GpuInfo]) -> list[str]:
    """Run the agent's metrics collector on the real GPUs; print every metric and the cost; return the problems."""
    problems: list[str] = []
    xids = XidBook()
    watcher = XidWatcher(book=xids)
    watcher.poll(100)  # sets up the event set; an Xid now would be news
    collector = GpuCollector(xids=xids)
    rounds = []
    collector.collect()  # discovery: what each GPU supports
    calls_before = collector.calls
    cpu_start, wall_start = time.process_time(), time.perf_counter()
    wall = 0.0
    for _ in range(METRIC_SAMPLES):
        started = time.perf_counter()
        rounds.append(collector.collect())
        wall += time.perf_counter() - started
        time.sleep(METRIC_GAP_S)
    cpu = time.process_time() - cpu_start
    calls = (collector.calls - calls_before) / METRIC_SAMPLES
    elapsed = time.perf_counter() - wall_start
    if not xids.active:
        problems.append("the Xid watcher could not register any GPU for Xid events (see the log above)")
    by_index = {gpu.index: gpu for gpu in inventory}
    last = rounds[-1]
    for round_ in rounds:
        problems.extend(f"collector: {p}" for p in round_.problems)
        problems.extend(f"collector event: {e.kind} GPU {e.gpu}: {e.message}" for e in round_.events)
    if len(last.entities) != len(inventory):
        problems.append(f"{len(last.entities)} GPU entities for {len(inventory)} GPUs")
    for entity, values in sorted(last.entities.items()):
        index = int(entity.removeprefix("gpu:"))
        refused = collector.unsupported(index)
        print(f"\n{entity} metrics:")
        for metric in GPU_METRICS:
            if metric in values:
                why = sane(metric, values[metric], values, by_index.get(index))
                print(f"  {'ok ' if why is None else 'BAD'} {metric:28} {values[metric]:>16g}  {why or ''}")
                if why is not None:
                    problems.append(f"{entity} {metric}: {why}")
            elif metric in refused:
                print(f"  --  {metric:28} {'not offered':>16}  {refused[metric]}")
            else:
                print(f"  BAD {metric:28} {'missing':>16}")
                problems.append(f"{entity} {metric}: missing, and NVML did not say it is unsupported")
        energy = [r.entities.get(entity, {}).get("energy_mj") for r in rounds]
        readings = [e for e in energy if e is not None]
        if any(b < a for a, b in itertools.pairwise(readings)):
            problems.append(f"{entity} energy_mj went backwards: {readings}")
    per_sample_cpu = cpu / METRIC_SAMPLES
    print(
        f"\nGpuCollector on {len(inventory)} GPU(s): {per_sample_cpu * 1000:.2f} ms CPU and"
        f" {wall / METRIC_SAMPLES * 1000:.2f} ms wall per sample, {calls:.1f} NVML calls per sample"
        f" ({wall / METRIC_SAMPLES / max(calls, 1) * 1e6:.0f} us wall per call);"
        f" {100 * per_sample_cpu / INTERVAL_S:.3f} % of one core at {INTERVAL_S:g} s"
        f" (over {elapsed:.1f} s of sampling)"
    )
    full = Sampler([collector, HostCollector(), IbCollector()])
    full.collect()
    cpu_start = time.process_time()
    for _ in range(METRIC_SAMPLES):
        full.collect()
    full_cpu = (time.process_time() - cpu_start) / METRIC_SAMPLES
    rss_mb = psutil.Process().memory_info().rss / (1024 * 1024)
    print(
        f"whole sample (GPUs, host, InfiniBand): {full_cpu * 1000:.2f} ms CPU,"
        f" {100 * full_cpu / INTERVAL_S:.3f} % of one core at {INTERVAL_S:g} s; RSS {rss_mb:.1f} MB"
    )
    watcher.close()
    collector.close()
    return problems


def main() -> int:
    """Read with both backends, compare, time; return the exit status."""
    reader = NvmlReader()
    try:
        nvml = reader.read()
        smi = NvidiaSmiReader().read()
    except GpuReadError as exc:
        print(f"cannot read GPUs: {exc}", file=sys.stderr)
        return 2
    print("NVML version:", reader.nvml_version())
    print("nvml inventory:")
    print(json.dumps([gpu.model_dump() for gpu in nvml], indent=1))
    print("nvidia-smi inventory:")
    print(json.dumps([gpu.model_dump() for gpu in smi], indent=1))

    problems = compare(nvml, smi)

    median_ms = time_reads(reader)
    reader.close()
    source, gpus, reasons = detect_gpus()
    print(f"\nNvmlReader.read(): median {median_ms:.3f} ms over {TIMED_READS} reads ({len(nvml)} GPU(s))")
    print(f"detect_gpus(): source={source} gpus={len(gpus)} reasons={reasons}")
    if problems:
        print("\nDISAGREEMENTS:\n  " + "\n  ".join(problems))
    else:
        print("\nall fields agree")

    metric_problems = check_metrics(nvml)
    if metric_problems:
        print("\nMETRICS PROBLEMS:\n  " + "\n  ".join(metric_problems))
    else:
        print("\nevery GPU metric is filled and sane, or NVML says this GPU does not offer it")
    return 1 if problems or metric_problems else 0


if __name__ == "__main__":
    sys.exit(main())
