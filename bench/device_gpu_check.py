"""On a real NVIDIA machine: do the NVML and nvidia-smi readers describe the GPUs alike, and how fast is NVML?

Run with the package importable and nvidia-ml-py installed:
    PYTHONPATH=src python bench/device_gpu_check.py

Prints both inventories as JSON, a field-by-field comparison and the median time of NvmlReader.read();
exits 1 if the two backends disagree, 2 if either cannot read the GPUs at all. Needs no network.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from gpufleet.agent.gpu.detect import detect_gpus
from gpufleet.agent.gpu.nvml import NvmlReader
from gpufleet.agent.gpu.ports import GpuReadError, normalise_pci_bus_id
from gpufleet.agent.gpu.smi import NvidiaSmiReader
from gpufleet.protocol.inventory import GpuInfo

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
        return 1
    print("\nall fields agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
