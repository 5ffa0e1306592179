"""On a real NVIDIA machine: run every GPU burn-in step for a few seconds and print what each measured.

    PYTHONPATH=src python bench/device_burnin.py [--seconds 5] [--json OUT.json]

Runs `python -m gpufleet.agent.burnin KIND --seconds N` as a step job would (gemm in bf16, fp16 and
fp32, gpu-memory, host-copy, gpu-peer, thermal, dcgm, and an NCCL all-reduce over this node's GPUs),
reads each result line with the head's reader (protocol.burnin.parse_result) and prints a table: value,
unit, verdict, per-GPU figures, the detail and the wall time. Then it checks, in this process, that the
gemm checksum catches a wrong product on a real GPU (one element of a burn product changed after the
first few: the step must name the GPU). Steps the machine cannot run (gpu-peer on one GPU, dcgm without
DCGM, all-reduce on one GPU) show as skipped with the reason.

Needs torch with CUDA, pydantic and pyyaml (the gpufleet base install); nvidia-ml-py for thermal.
Exit status: 0 every step measured or was skipped, 1 a step failed outright or the fault went
unnoticed, 2 a step printed no result.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from typing import Any

from gpufleet.protocol.burnin import BadResult, StepResult, parse_result

STEPS: list[tuple[str, list[str]]] = [
    ("gemm", ["--dtype", "bf16"]),
    ("gemm", ["--dtype", "fp16"]),
    ("gemm", ["--dtype", "fp32", "--size", "4096"]),
    ("gpu-memory", []),
    ("host-copy", []),
    ("gpu-peer", []),
    ("thermal", []),
    ("dcgm", ["--level", "1"]),
    ("allreduce", []),
]


def run_step(kind: str, options: list[str], seconds: float) -> tuple[StepResult | None, float, str]:
    argv = [sys.executable, "-m", "gpufleet.agent.burnin", kind, "--seconds", f"{seconds:g}", *options]
    env = dict(os.environ)
    # A one-node job: the all-reduce runs over this node's GPUs only.
    env.update(WORLD_SIZE="1", NODE_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29517")
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=10 * seconds + 300, check=False, env=env)
    wall = time.monotonic() - started
    try:
        return parse_result(done.stdout), wall, done.stderr[-2000:]
    except BadResult as exc:
        return None, wall, f"{exc}; stderr: {done.stderr[-2000:]}"


def fault_is_caught() -> tuple[bool, str]:
    """gemm's checks on a real GPU with a product changed after the first few."""
    import torch

    from gpufleet.agent.burnin import gpu

    class Faulty:
        def __init__(self) -> None:
            self.calls = 0

        def __getattr__(self, name: str) -> Any:
            return getattr(torch, name)

        def matmul(self, a: Any, b: Any, out: Any = None) -> Any:
            self.calls += 1
            product = torch.matmul(a, b, out=out)
            if self.calls > 4 and product.shape[0] > gpu.CHECK_N:  # the burn's products, not the check's
                product[7, 11] += 1000
            return product

    if not torch.cuda.is_available():
        return True, "no GPU: not tried"
    figures = gpu.burn(Faulty(), torch.device("cuda", 0), "bf16", 4096, 1.0)
    fault = figures.fault("bf16")
    return bool(fault), fault or f"not caught: {figures}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--json", help="also write every result here")
    args = parser.parse_args()
    print(f"machine: {platform.node()} {platform.machine()}, Python {platform.python_version()}")
    try:
        import torch

        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), GPUs: {names or 'none'}")
    except ImportError:
        print("torch is not installed: every GPU step will be skipped")
    rows: list[dict[str, Any]] = []
    status = 0
    header = f"{'step':<22} {'value':>10} {'unit':<9} {'verdict':<8} {'wall s':>7}  per GPU / detail"
    print(header)
    print("-" * len(header))
    for kind, options in STEPS:
        name = kind + (f" {options[1]}" if kind == "gemm" else "")
        step, wall, said = run_step(kind, options, args.seconds)
        if step is None:
            print(f"{name:<22} {'-':>10} {'':<9} {'NO LINE':<8} {wall:>7.1f}  {said[:200]}")
            rows.append({"step": name, "error": said})
            status = max(status, 2)
            continue
        verdict = "skipped" if step.skipped else ("ok" if step.ok else "FAILED")
        if not step.ok and not step.skipped:
            status = max(status, 1)
        per_gpu = " ".join(f"{k}:{v:.1f}" for k, v in step.per_gpu.items())
        print(f"{name:<22} {step.value:>10.2f} {step.unit:<9} {verdict:<8} {wall:>7.1f}  {per_gpu} {step.detail}")
        rows.append({"step": name, "wall_s": wall, **step.model_dump()})
    caught, how = fault_is_caught()
    print(f"\ninjected wrong product caught: {'yes' if caught else 'NO'} ({how})")
    if not caught:
        status = max(status, 1)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({"rows": rows, "fault_caught": caught, "fault_detail": how}, out, indent=2)
    return status


if __name__ == "__main__":
    sys.exit(main())
