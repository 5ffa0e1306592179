"""GPU steps through torch on CUDA: compute with a checksum, device memory, host copies, peer copies, heat.

Every GPU the job was given (CUDA_VISIBLE_DEVICES, by UUID) is measured; `per_gpu` keys are the
job's own indexes (0..n-1, torch's order) and the value is the worst GPU's. The step fails outright
only for what no threshold can excuse:

- gemm, thermal: a wrong product. Each GPU multiplies a fixed seeded 512 × 512 pair, before and after
  its burn, and compares with the float64 product computed on the CPU from the same (rounded) inputs
  (relative error under the dtype's tolerance); during the burn, every batch's n × n product is
  compared with that GPU's first (the same inputs, algorithm and stream give the same result, so any
  element off by more than 1% of the largest is a fault: gpu-burn's idea);
- thermal: a clocks-event (throttle) reason NVML reports under load: HW slowdown, SW or HW thermal
  slowdown, HW power brake (a power cap alone is not a fault);
- a CUDA error while loading a GPU.

Bandwidths are decimal GB/s (10^9 bytes). gpu-memory counts a copy's bytes read plus written (as CUDA's
bandwidthTest does), host-copy and gpu-peer the bytes moved. Timed loops run batches of calls between
synchronisations, doubling a batch while time remains, so the launch cost does not hide the bandwidth.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpufleet.agent.burnin.common import (
    TORCH_MISSING,
    Run,
    failed,
    human_bytes,
    no_gpu_reason,
    progress,
    quiet_import,
    result,
    skipped,
)
from gpufleet.protocol.burnin import StepResult

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
# Relative (Frobenius) error of the 512 × 512 check against float64: the output's rounding is
# about 2^-9 (bf16), 2^-12 (fp16) and far less for fp32 (TF32, if someone enables it, about 2^-11);
# these leave a wide margin, and a faulty unit is off by far more.
TOLERANCE = {"bf16": 2e-2, "fp16": 5e-3, "fp32": 5e-3}
CHECK_N = 512
CHECK_SEED = 24
BURN_SEED = 2024
DRIFT = 0.01  # of the largest element of the first product: what a burn product may differ by

# NVML clocks-event reasons (nvml.h nvmlClocksEventReason*): those that fail the thermal step, and the rest.
FAIL_REASONS = {0x8: "HW slowdown", 0x20: "SW thermal slowdown", 0x40: "HW thermal slowdown", 0x80: "HW power brake"}
OTHER_REASONS = {
    0x1: "GPU idle",
    0x2: "applications clocks setting",
    0x4: "SW power cap",
    0x10: "sync boost",
    0x100: "display clock setting",
}
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1


def open_gpus(kind: str, unit: str) -> tuple[Any, int] | StepResult:
    """torch and the number of GPUs this job sees, or the skipped result saying why there are none."""
    reason = no_gpu_reason()
    if reason:
        return skipped(kind, unit, reason)
    try:
        with quiet_import():
            import torch
    except ImportError:
        return skipped(kind, unit, TORCH_MISSING)
    if not torch.cuda.is_available():
        build = " (torch is a CPU build)" if torch.version.cuda is None else ""
        return skipped(kind, unit, f"no GPU visible to torch{build}")
    return torch, int(torch.cuda.device_count())


def timed(
    op: Callable[[], object], sync: Callable[[], None], seconds: float, after_batch: Callable[[], None] | None = None
) -> tuple[int, float]:
    """Call `op` repeatedly for about `seconds` (after two warm-up calls); returns (calls, seconds).
    Batches grow while they are quick and time remains, so few synchronisations are timed."""
    for _ in range(2):
        op()
    sync()
    count, batch = 0, 1
    started = time.perf_counter()
    deadline = started + seconds
    while True:
        for _ in range(batch):
            op()
        sync()
        if after_batch is not None:
            after_batch()
        count += batch
        now = time.perf_counter()
        if now >= deadline:
            return count, now - started
        per_call = (now - started) / count
        batch = max(1, min(batch * 2, int((deadline - now) / per_call)))


def reference_error(torch: Any, device: Any, dtype_name: str) -> float:
    """Relative error of `device`'s product of the seeded check pair against float64 on the CPU."""
    dtype = getattr(torch, DTYPES[dtype_name])
    generator = torch.Generator().manual_seed(CHECK_SEED)
    a = torch.randn(CHECK_N, CHECK_N, generator=generator).to(dtype)
    b = torch.randn(CHECK_N, CHECK_N, generator=generator).to(dtype)
    expected = a.double() @ b.double()
    got = torch.matmul(a.to(device), b.to(device)).cpu().double()
    return float((got - expected).norm() / expected.norm())


@dataclass
class Burn:
    """One GPU's burn: matmul rate and what the checks saw."""

    index: int
    tflops: float = 0.0
    matmuls: int = 0
    seconds: float = 0.0
    drifted: int = 0  # elements of burn products off the first product
    check_before: float = 0.0
    check_after: float = 0.0
    error: str = ""

    def fault(self, dtype_name: str) -> str:
        """What is wrong with this GPU's results, or ''."""
        if self.error:
            return f"GPU {self.index}: {self.error}"
        limit = TOLERANCE[dtype_name]
        if self.check_before > limit or self.check_after > limit:
            worst = max(self.check_before, self.check_after)
            return f"GPU {self.index}: checksum mismatch (relative error {worst:.2e} over {limit:.0e})"
        if self.drifted:
            return f"GPU {self.index}: checksum mismatch ({self.drifted} elements of burn products changed)"
        return ""


def burn(torch: Any, device: Any, dtype_name: str, n: int, seconds: float) -> Burn:
    """Multiply two seeded n × n matrices on `device` for `seconds`, checking the products."""
    figures = Burn(index=device.index if device.index is not None else 0)
    dtype = getattr(torch, DTYPES[dtype_name])

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    figures.check_before = reference_error(torch, device, dtype_name)
    generator = torch.Generator(device=device).manual_seed(BURN_SEED)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=generator)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=generator)
    first = torch.matmul(a, b)
    out = torch.empty_like(first)
    limit = DRIFT * float(first.abs().max().item())

    def compare() -> None:
        figures.drifted += int(torch.count_nonzero((out - first).abs() > limit).item())

    figures.matmuls, figures.seconds = timed(lambda: torch.matmul(a, b, out=out), sync, seconds, compare)
    figures.tflops = 2 * n**3 * figures.matmuls / max(figures.seconds, 1e-9) / 1e12
    figures.check_after = reference_error(torch, device, dtype_name)
    return figures


def in_parallel(work: Callable[[int], Any], count: int) -> list[Any]:
    """work(0..count-1), one thread each (CUDA calls release the GIL); an exception becomes the item."""
    results: list[Any] = [None] * count

    def run(i: int) -> None:
        try:
            results[i] = work(i)
        except Exception as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def _error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _names(torch: Any, count: int) -> dict[str, str]:
    return {str(i): str(torch.cuda.get_device_name(i)) for i in range(count)}


def _burn_all(torch: Any, count: int, dtype_name: str, n: int, seconds: float) -> list[Burn]:
    def one(i: int) -> Burn:
        with torch.cuda.device(i):
            return burn(torch, torch.device("cuda", i), dtype_name, n, seconds)

    burns = []
    for i, outcome in enumerate(in_parallel(one, count)):
        burns.append(Burn(index=i, error=_error(outcome)) if isinstance(outcome, BaseException) else outcome)
    return burns


def gemm(run: Run) -> StepResult:
    unit = "TFLOPS"
    opened = open_gpus(run.kind, unit)
    if isinstance(opened, StepResult):
        return opened
    torch, count = opened
    dtype_name, n = str(run.options["dtype"]), int(run.options["size"])
    progress(f"gemm: {count} GPU(s), {dtype_name} {n} × {n} matrix multiply for {run.seconds:g} s each, in parallel")
    burns = _burn_all(torch, count, dtype_name, n, run.seconds)
    per_gpu = {str(b.index): b.tflops for b in burns}
    for b in burns:
        progress(
            f"gemm: GPU {b.index}: {b.tflops:.1f} TFLOPS, {b.matmuls} products" + (f", {b.error}" if b.error else "")
        )
    evidence = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpus": _names(torch, count),
        "dtype": dtype_name,
        "n": n,
        "tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "burns": {str(b.index): _burn_facts(b) for b in burns},
    }
    faults = [f for f in (b.fault(dtype_name) for b in burns) if f]
    value = min(per_gpu.values())
    if faults:
        return failed(run.kind, unit, "; ".join(faults), value=value, evidence=evidence)
    return result(run.kind, value, unit, per_gpu=per_gpu, evidence=evidence)


def _burn_facts(b: Burn) -> dict[str, Any]:
    return {
        "tflops": b.tflops,
        "matmuls": b.matmuls,
        "seconds": b.seconds,
        "check_before": b.check_before,
        "check_after": b.check_after,
        "drifted": b.drifted,
        **({"error": b.error} if b.error else {}),
    }


def gpu_memory(run: Run) -> StepResult:
    unit = "GB/s"
    opened = open_gpus(run.kind, unit)
    if isinstance(opened, StepResult):
        return opened
    torch, count = opened
    nbytes = int(run.options["size"])
    progress(f"gpu-memory: {count} GPU(s), device-to-device copies of {human_bytes(nbytes)} for {run.seconds:g} s")

    def one(i: int) -> dict[str, float]:
        device = torch.device("cuda", i)
        src = torch.ones(nbytes, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        calls, elapsed = timed(lambda: dst.copy_(src), lambda: torch.cuda.synchronize(device), run.seconds)
        # A copy reads and writes every byte: counted twice, as CUDA's bandwidthTest does.
        return {"gb_s": 2 * nbytes * calls / elapsed / 1e9, "copies": calls, "seconds": elapsed}

    return _bandwidths(run.kind, unit, torch, count, in_parallel(one, count), {"bytes": nbytes})


def host_copy(run: Run) -> StepResult:
    unit = "GB/s"
    opened = open_gpus(run.kind, unit)
    if isinstance(opened, StepResult):
        return opened
    torch, count = opened
    nbytes = int(run.options["size"])
    share = max(0.2, run.seconds / count / 2)
    progress(f"host-copy: {count} GPU(s) one at a time, pinned {human_bytes(nbytes)} each way for {share:g} s")
    outcomes: list[Any] = []
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    for i in range(count):
        # One GPU at a time: GPUs share PCIe switches and the host's memory, and each is judged alone.
        try:
            outcomes.append(_host_copies(torch, i, host, share))
        except Exception as exc:
            outcomes.append(exc)
    return _bandwidths(run.kind, unit, torch, count, outcomes, {"bytes": nbytes, "pinned": True})


def _host_copies(torch: Any, index: int, host: Any, seconds: float) -> dict[str, float]:
    """Pinned host memory to GPU `index` and back, `seconds` each way."""
    device = torch.device("cuda", index)
    on_gpu = torch.empty(host.numel(), dtype=torch.uint8, device=device)

    def sync() -> None:
        torch.cuda.synchronize(device)

    up, up_s = timed(lambda: on_gpu.copy_(host, non_blocking=True), sync, seconds)
    down, down_s = timed(lambda: host.copy_(on_gpu, non_blocking=True), sync, seconds)
    h2d, d2h = host.numel() * up / up_s / 1e9, host.numel() * down / down_s / 1e9
    return {"gb_s": min(h2d, d2h), "h2d_gb_s": h2d, "d2h_gb_s": d2h}


def _pair_copies(torch: Any, source: Any, target: Any, seconds: float) -> float:
    """GB/s copying `source` into `target` (on another GPU) for `seconds`."""

    def copy() -> object:
        return target.copy_(source, non_blocking=True)

    def sync() -> None:
        torch.cuda.synchronize(source.device)
        torch.cuda.synchronize(target.device)

    calls, elapsed = timed(copy, sync, seconds)
    return float(source.numel() * calls / elapsed / 1e9)


def gpu_peer(run: Run) -> StepResult:
    unit = "GB/s"
    opened = open_gpus(run.kind, unit)
    if isinstance(opened, StepResult):
        return opened
    torch, count = opened
    if count < 2:
        return skipped(run.kind, unit, "one GPU: no pair to copy between")
    nbytes = int(run.options["size"])
    pairs = [(i, j) for i in range(count) for j in range(count) if i != j]
    share = max(0.2, run.seconds / len(pairs))
    progress(f"gpu-peer: {len(pairs)} ordered pairs, {human_bytes(nbytes)} copies, {share:.2f} s each")
    sources = [torch.ones(nbytes, dtype=torch.uint8, device=torch.device("cuda", i)) for i in range(count)]
    targets = [torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", i)) for i in range(count)]
    figures: dict[str, float] = {}
    peer_access: dict[str, bool] = {}
    for i, j in pairs:
        key = f"{i}->{j}"
        peer_access[key] = bool(torch.cuda.can_device_access_peer(i, j))
        figures[key] = _pair_copies(torch, sources[i], targets[j], share)
    per_gpu = {str(g): min(v for k, v in figures.items() if g in _ends(k)) for g in range(count)}
    value = min(figures.values())
    slowest = min(figures, key=lambda k: figures[k])
    progress(f"gpu-peer: slowest pair {slowest}: {value:.1f} {unit}")
    evidence = {
        "torch": torch.__version__,
        "gpus": _names(torch, count),
        "bytes": nbytes,
        "pairs_gb_s": figures,
        "peer_access": peer_access,
        "slowest": slowest,
    }
    return result(run.kind, value, unit, per_gpu=per_gpu, evidence=evidence)


def _ends(pair: str) -> tuple[int, int]:
    src, dst = pair.split("->")
    return int(src), int(dst)


def _bandwidths(kind: str, unit: str, torch: Any, count: int, outcomes: list[Any], facts: dict[str, Any]) -> StepResult:
    errors = {i: _error(o) for i, o in enumerate(outcomes) if isinstance(o, BaseException)}
    figures = {str(i): o for i, o in enumerate(outcomes) if not isinstance(o, BaseException)}
    evidence = {"torch": torch.__version__, "gpus": _names(torch, count), **facts, "per_gpu": figures}
    for i, o in figures.items():
        progress(f"{kind}: GPU {i}: {o['gb_s']:.1f} {unit}")
    if errors:
        detail = "; ".join(f"GPU {i}: {e}" for i, e in errors.items())
        return failed(kind, unit, detail, evidence={**evidence, "errors": errors})
    per_gpu = {i: float(o["gb_s"]) for i, o in figures.items()}
    return result(kind, min(per_gpu.values()), unit, per_gpu=per_gpu, evidence=evidence)


# ---- thermal ----


@dataclass
class Heat:
    """What NVML said about one GPU under load."""

    max_c: float = 0.0
    sm_mhz: list[int] = field(default_factory=list)
    power_w: list[float] = field(default_factory=list)
    reasons: int = 0
    failing_at: dict[str, float] = field(default_factory=dict)  # failing reason -> temperature when first seen
    samples: int = 0
    unread: str = ""


def reason_names(mask: int) -> list[str]:
    names = [name for bit, name in {**FAIL_REASONS, **OTHER_REASONS}.items() if mask & bit]
    known = 0
    for bit in (*FAIL_REASONS, *OTHER_REASONS):
        known |= bit
    unknown = mask & ~known
    return names + ([f"0x{unknown:x}"] if unknown else [])


def sample(nvml: Any, handle: Any, heat: Heat) -> None:
    """One NVML reading of one GPU into `heat`."""
    # nvidia-ml-py renamed throttle reasons to clocks-event reasons (driver 535); older releases lack the new name.
    reasons_of = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if reasons_of is None:
        reasons_of = nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    temperature = float(nvml.nvmlDeviceGetTemperature(handle, NVML_TEMPERATURE_GPU))
    heat.max_c = max(heat.max_c, temperature)
    mask = int(reasons_of(handle))
    heat.reasons |= mask
    for bit, name in FAIL_REASONS.items():
        if mask & bit:
            heat.failing_at.setdefault(name, temperature)
    try:
        heat.sm_mhz.append(int(nvml.nvmlDeviceGetClockInfo(handle, NVML_CLOCK_SM)))
        heat.power_w.append(nvml.nvmlDeviceGetPowerUsage(handle) / 1000)
    except nvml.NVMLError:
        pass  # clocks and power are evidence only; some boards do not report them
    heat.samples += 1


def nvml_handle(torch: Any, nvml: Any, index: int) -> Any:
    """The NVML handle of torch's GPU `index`, matched by UUID (CUDA_VISIBLE_DEVICES renumbers GPUs,
    NVML does not); by index only where torch gives no UUID or NVML does not know it."""
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if uuid is not None:
        with contextlib.suppress(nvml.NVMLError):
            return nvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
    return nvml.nvmlDeviceGetHandleByIndex(index)


def thermal(run: Run) -> StepResult:
    unit = "C"
    opened = open_gpus(run.kind, unit)
    if isinstance(opened, StepResult):
        return opened
    torch, count = opened
    try:
        import pynvml
    except ImportError:
        return skipped(run.kind, unit, "nvidia-ml-py is not installed (pip install 'gpufleet[agent]')")
    dtype_name, n, interval = str(run.options["dtype"]), int(run.options["size"]), float(run.options["interval"])
    pynvml.nvmlInit()
    try:
        handles = [nvml_handle(torch, pynvml, i) for i in range(count)]
        heats = [Heat() for _ in range(count)]
        progress(f"thermal: loading {count} GPU(s) with {dtype_name} matrix multiplies for {run.seconds:g} s")
        burns: list[Burn] = []
        loader = threading.Thread(
            target=lambda: burns.extend(_burn_all(torch, count, dtype_name, n, run.seconds)), daemon=True
        )
        loader.start()
        next_report = time.monotonic() + 30
        while loader.is_alive():
            for handle, heat in zip(handles, heats, strict=True):
                try:
                    sample(pynvml, handle, heat)
                except pynvml.NVMLError as exc:
                    heat.unread = _error(exc)
            if time.monotonic() >= next_report:
                progress("thermal: " + ", ".join(f"GPU {i} {h.max_c:.0f} C" for i, h in enumerate(heats)))
                next_report += 30
            loader.join(timeout=interval)
        driver = pynvml.nvmlSystemGetDriverVersion()
    finally:
        pynvml.nvmlShutdown()
    per_gpu = {str(i): h.max_c for i, h in enumerate(heats)}
    evidence = {
        "torch": torch.__version__,
        "driver": driver.decode() if isinstance(driver, bytes) else str(driver),
        "gpus": _names(torch, count),
        "per_gpu": {
            str(i): {
                "max_c": h.max_c,
                "samples": h.samples,
                "sm_mhz_min": min(h.sm_mhz, default=0),
                "sm_mhz_max": max(h.sm_mhz, default=0),
                "power_w_max": max(h.power_w, default=0.0),
                "reasons": reason_names(h.reasons),
                **({"unread": h.unread} if h.unread else {}),
            }
            for i, h in enumerate(heats)
        },
        "burns": {str(b.index): _burn_facts(b) for b in burns},
    }
    faults = [f"GPU {i}: {name} (at {at:.0f} C)" for i, h in enumerate(heats) for name, at in h.failing_at.items()]
    faults += [f for f in (b.fault(dtype_name) for b in burns) if f]
    faults += [f"GPU {i}: NVML read nothing ({h.unread})" for i, h in enumerate(heats) if not h.samples]
    value = max(per_gpu.values())
    progress(f"thermal: hottest {value:.0f} C" + (f"; {'; '.join(faults)}" if faults else ""))
    if faults:
        return failed(run.kind, unit, "; ".join(faults), value=value, evidence=evidence)
    return result(run.kind, value, unit, per_gpu=per_gpu, evidence=evidence)
