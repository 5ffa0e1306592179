"""On a real NVIDIA GPU with MIG (A100, H100, H200): the agent's own MIG code end to end, timed.

Run as root with the package importable and nvidia-ml-py installed, on a GPU nothing else uses:
    PYTHONPATH=src python bench/mig_device.py [--gpu 0] [--layout all-1g.18gb] [--json out.json]

Steps, each timed: read the GPU (NvmlReader); apply the layout (agent.gpu.mig.apply_layout: MIG on, which
resets the GPU, then the instances at gpufleet's placements); read the MIG devices back and check they are
the layout's; run a "job" on one instance: a child process with CUDA_VISIBLE_DEVICES set to the device's
UUID that, through the CUDA driver API (libcuda, no toolkit needed), counts its devices (must be 1), names
it, creates a context and allocates and frees a quarter of the instance's memory; then put the GPU back as
it was found (its layout, or MIG off). The default layout is `all-<the smallest profile>`.

Prints one JSON document (and writes it with --json). Exits 0 when every step held, 1 when one did not (the
GPU is restored all the same), and 0 with {"skipped": reason} where there is no NVIDIA GPU or NVML, or the
GPU has no MIG: the benchmark can run anywhere, and says why it measured nothing.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpufleet.agent.gpu.mig import MigError
from gpufleet.agent.gpu.nvml import NvmlReader
from gpufleet.agent.gpu.ports import GpuReadError
from gpufleet.protocol.inventory import GpuInfo
from gpufleet.protocol.mig import layout_profiles, profiles_of

CHILD_TIMEOUT_S = 120


def _cuda_child() -> int:
    """In the child: one CUDA device visible (the MIG instance); name it, make a context, allocate. Prints
    one JSON line; exits 0 on success."""
    cuda = ctypes.CDLL("libcuda.so.1")
    out: dict[str, Any] = {}

    def check(call: str, rc: int) -> None:
        if rc != 0:
            out["failed"] = f"{call} returned CUDA error {rc}"
            print(json.dumps(out))
            sys.exit(1)

    check("cuInit", cuda.cuInit(0))
    count = ctypes.c_int()
    check("cuDeviceGetCount", cuda.cuDeviceGetCount(ctypes.byref(count)))
    out["devices"] = count.value
    device = ctypes.c_int()
    check("cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(device), 0))
    name = ctypes.create_string_buffer(256)
    check("cuDeviceGetName", cuda.cuDeviceGetName(name, 256, device))
    out["name"] = name.value.decode()
    total = ctypes.c_size_t()
    check("cuDeviceTotalMem_v2", cuda.cuDeviceTotalMem_v2(ctypes.byref(total), device))
    out["memory_mib"] = total.value // (1024 * 1024)
    context = ctypes.c_void_p()
    check("cuCtxCreate_v2", cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device))
    pointer = ctypes.c_uint64()
    size = total.value // 4
    started = time.perf_counter()
    check("cuMemAlloc_v2", cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(size)))
    check("cuMemsetD8_v2", cuda.cuMemsetD8_v2(pointer, ctypes.c_ubyte(1), ctypes.c_size_t(size)))
    check("cuCtxSynchronize", cuda.cuCtxSynchronize())
    out["memset_s"] = round(time.perf_counter() - started, 4)
    check("cuMemFree_v2", cuda.cuMemFree_v2(pointer))
    check("cuCtxDestroy_v2", cuda.cuCtxDestroy_v2(context))
    print(json.dumps(out))
    return 0 if count.value == 1 else 1


def _timed(steps: dict[str, Any], name: str, call: Any) -> Any:
    started = time.perf_counter()
    try:
        return call()
    finally:
        steps[name] = {"seconds": round(time.perf_counter() - started, 3)}


def _layout_of(gpu: GpuInfo) -> str:
    """The layout that puts the GPU back as found (its instances' profiles, or none)."""
    if gpu.mig_mode != "enabled" or not gpu.mig:
        return "none"
    return "+".join(m.profile for m in sorted(gpu.mig, key=lambda m: m.start or 0))


def run(index: int, layout: str | None) -> tuple[dict[str, Any], int]:
    reader = NvmlReader()
    try:
        gpus = reader.read()
    except GpuReadError as exc:
        return {"skipped": f"no NVIDIA GPU here: {exc}"}, 0
    if not 0 <= index < len(gpus):
        return {"skipped": f"no GPU {index} (this machine has {len(gpus)})"}, 0
    gpu = gpus[index]
    offered = profiles_of(gpu.model, gpu.memory_total_mib)
    if not offered:
        return {"skipped": f"{gpu.model} has no MIG"}, 0
    layout = layout or f"all-{min(offered.values(), key=lambda p: (p.slices, p.memory_mib)).name}"
    report: dict[str, Any] = {"gpu": gpu.model, "driver": gpu.driver_version, "layout": layout, "steps": {}}
    steps = report["steps"]
    original = _layout_of(gpu)
    report["found"] = original
    failed = False
    try:
        _timed(steps, "apply", lambda: reader.apply_mig(index, layout))
        after = _timed(steps, "read_back", reader.read)[index]
        report["devices"] = [m.model_dump() for m in after.mig]
        got = {m.profile for m in after.mig}
        wanted = layout_profiles(layout, gpu.model, gpu.memory_total_mib)
        steps["read_back"]["matches"] = sorted(m.profile for m in after.mig) == sorted(wanted.elements())
        failed |= not steps["read_back"]["matches"] or not got
        device = after.mig[0]
        child = _timed(
            steps,
            "job_on_one_instance",
            lambda: subprocess.run(
                [sys.executable, __file__, "--cuda-child"],
                env={**os.environ, "CUDA_VISIBLE_DEVICES": device.uuid},
                capture_output=True,
                text=True,
                timeout=CHILD_TIMEOUT_S,
                check=False,
            ),
        )
        steps["job_on_one_instance"] |= {"device": device.uuid, "exit": child.returncode}
        steps["job_on_one_instance"]["saw"] = json.loads(child.stdout.strip().splitlines()[-1] or "{}")
        failed |= child.returncode != 0
    except (MigError, subprocess.TimeoutExpired, json.JSONDecodeError, IndexError) as exc:
        report["error"] = str(exc)
        failed = True
    finally:
        try:
            _timed(steps, "restore", lambda: reader.apply_mig(index, original))
            steps["restore"]["back_to"] = _layout_of(reader.read()[index])
            failed |= steps["restore"]["back_to"] != original
        except MigError as exc:
            report["restore_error"] = str(exc)
            failed = True
        reader.close()
    return report, int(failed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--layout", default=None, help="e.g. all-1g.18gb, 3g.71gb+4g.71gb")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--cuda-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cuda_child:
        return _cuda_child()
    report, code = run(args.gpu, args.layout)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
