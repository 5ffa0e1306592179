"""What every burn-in kind shares: the parsed command line, progress lines, the result line and its
exit status, outside programs, sizes and the multi-node rendezvous the agent sets.

A kind's function takes a `Run` and returns a `StepResult`; it raises `Usage` for a bad option value
(exit 2) and nothing else on purpose: `main` turns any other exception into a failed result.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from gpufleet.protocol.burnin import MAX_RESULT_CHARS, RESULT_MARK, StepResult, format_result

PROGRAM = "gpufleet-burnin"
TORCH_MISSING = "torch is not installed (pip install 'gpufleet[burnin]')"

# Evidence is for a person reading why a step passed or failed, not a log: past these it is cut.
MAX_TEXT = 400
MAX_ITEMS = 64
MAX_DEPTH = 4
MAX_DETAIL = 1024


class Usage(Exception):
    """The command line is wrong; the message is the one line printed before exiting with status 2."""


@dataclass(frozen=True)
class Run:
    """One step as its command line asked for it. `options` hold parsed values, defaults filled in."""

    kind: str
    seconds: float
    options: Mapping[str, Any] = field(default_factory=dict)


def progress(message: str) -> None:
    """A human line in the step's output (the job log); never starts with the result mark."""
    print(f"{PROGRAM}: {message}", flush=True)


def result(
    kind: str,
    value: float,
    unit: str,
    *,
    ok: bool = True,
    skipped: bool = False,
    detail: str = "",
    per_gpu: Mapping[str, float] | None = None,
    evidence: Mapping[str, Any] | None = None,
) -> StepResult:
    """A StepResult with its detail and evidence cut to fit the protocol's bounds."""
    if len(detail) > MAX_DETAIL:
        detail = detail[: MAX_DETAIL - 3] + "..."
    return StepResult(
        kind=kind,
        value=float(value),
        unit=unit,
        ok=ok,
        skipped=skipped,
        detail=detail,
        per_gpu=dict(per_gpu or {}),
        evidence=bounded(dict(evidence or {})),
    )


def skipped(kind: str, unit: str, detail: str, evidence: Mapping[str, Any] | None = None) -> StepResult:
    """The node lacks what the step needs: no value to judge, and not a failure."""
    return result(kind, 0.0, unit, skipped=True, detail=detail, evidence=evidence)


def failed(
    kind: str, unit: str, detail: str, value: float = 0.0, evidence: Mapping[str, Any] | None = None
) -> StepResult:
    """Something no threshold can excuse (or nothing could be measured)."""
    return result(kind, value, unit, ok=False, detail=detail, evidence=evidence)


def bounded(value: Any, depth: int = 0) -> Any:
    """`value` as JSON-ready data cut to MAX_TEXT characters per string, MAX_ITEMS per list or table
    and MAX_DEPTH levels, so no tool's output can blow up the result line."""
    if isinstance(value, float):
        value = round(value, 6) if math.isfinite(value) else None  # JSON has no NaN
    elif isinstance(value, Mapping | list | tuple) and depth >= MAX_DEPTH:
        value = json.dumps(value, default=str)
    elif isinstance(value, Mapping):
        items = list(value.items())
        value = {str(k): bounded(v, depth + 1) for k, v in items[:MAX_ITEMS]}
        if len(items) > MAX_ITEMS:
            value["..."] = f"{len(items) - MAX_ITEMS} more"
    elif isinstance(value, list | tuple):
        value = [bounded(v, depth + 1) for v in value[:MAX_ITEMS]] + (
            [f"... {len(value) - MAX_ITEMS} more"] if len(value) > MAX_ITEMS else []
        )
    elif not (value is None or isinstance(value, str | bool | int)):
        value = str(value)
    if isinstance(value, str) and len(value) > MAX_TEXT:
        value = value[: MAX_TEXT - 3] + "..."
    return value


def emit(step: StepResult) -> int:
    """Print the result line and return the exit status: 1 when the step failed outright, else 0.
    A line over the protocol's limit loses its evidence (largest entries first), never its verdict."""
    line = format_result(step)
    evidence = dict(step.evidence)
    while len(line) - len(RESULT_MARK) - 1 > MAX_RESULT_CHARS and evidence:
        largest = max(evidence, key=lambda k: len(json.dumps(evidence[k], default=str)))
        evidence[largest] = "left out: too large for the result line"
        if all(v == "left out: too large for the result line" for v in evidence.values()):
            evidence = {}
        line = format_result(step.model_copy(update={"evidence": evidence}))
    sys.stdout.write(line)
    sys.stdout.flush()
    return 0 if step.ok or step.skipped else 1


def find_tool(name: str) -> str | None:
    """`name` on PATH, or in the system's sbin directories (a job's PATH may lack them)."""
    path = os.environ.get("PATH", os.defpath)
    return shutil.which(name) or shutil.which(name, path=os.pathsep.join([path, "/usr/sbin", "/sbin"]))


def run_tool(argv: Sequence[str], timeout: float, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run an outside program (never through a shell), capturing its output. Raises
    subprocess.TimeoutExpired past `timeout`, OSError when it cannot start."""
    return subprocess.run(
        list(argv), capture_output=True, text=True, errors="replace", timeout=timeout, check=False, cwd=cwd
    )


def tool_version(argv: Sequence[str]) -> str:
    """The first line a program prints for its version, or '' if it says nothing useful."""
    try:
        done = run_tool(argv, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    lines = (done.stdout or done.stderr).strip().splitlines()
    return lines[0].strip() if lines else ""


def tail(text: str, lines: int = 3) -> str:
    """The last non-empty lines of a program's output, joined: what a detail quotes."""
    kept = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " | ".join(kept[-lines:])


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes from '4096', '512K', '256M', '1G', '1GiB' (powers of 1024). Raises ValueError."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a size (like 256M or 1G)")
    size = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if size <= 0:
        raise ValueError(f"{text!r} must be more than zero bytes")
    return size


def human_bytes(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


@dataclass(frozen=True)
class Rendezvous:
    """Where the ranks of a multi-node step meet: the agent sets these for every multi-node job
    (agent.jobs.identity.allocation_environment). `nodes` is WORLD_SIZE: one rank per node."""

    nodes: int
    node_rank: int
    master_addr: str
    master_port: int


def rendezvous(environ: Mapping[str, str] | None = None) -> Rendezvous:
    """The rendezvous from the environment; without WORLD_SIZE a lone node (rank 0 of 1, on loopback).
    Raises Usage for values that are not numbers or out of range."""
    env = os.environ if environ is None else environ
    try:
        nodes = int(env.get("WORLD_SIZE", "1"))
        rank = int(env.get("NODE_RANK", "0"))
        port = int(env.get("MASTER_PORT", "29500"))
    except ValueError:
        raise Usage("WORLD_SIZE, NODE_RANK and MASTER_PORT must be whole numbers") from None
    if nodes < 1 or not 0 <= rank < nodes:
        raise Usage(f"NODE_RANK {rank} is not a rank of WORLD_SIZE {nodes}")
    if not 1 <= port <= 65535:
        raise Usage(f"MASTER_PORT {port} is not a TCP port")
    return Rendezvous(nodes, rank, env.get("MASTER_ADDR", "").strip() or "127.0.0.1", port)


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity, which a cgroup cpuset narrows)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@contextmanager
def quiet_import() -> Iterator[None]:
    """Around `import torch`: a CPU wheel without numpy warns that it cannot use numpy, which these
    steps never do; the warning would only clutter the job's output."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*NumPy.*")
        yield


def no_gpu_reason(environ: Mapping[str, str] | None = None) -> str | None:
    """Why this rank sees no GPU before asking torch, or None: the agent sets CUDA_VISIBLE_DEVICES
    empty for a job given no GPUs, so such a job must not use any."""
    env = os.environ if environ is None else environ
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and not visible.strip():
        return "no GPU visible (CUDA_VISIBLE_DEVICES is empty: the job was given no GPUs)"
    return None
