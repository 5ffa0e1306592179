"""What a burn-in step prints: one result line the head reads back from the step job's output.

A step runs as a gpufleet job (`gpufleet-burnin KIND [--option value ...]`, agent.burnin) on the node under
test; its last stdout line that starts with RESULT_MARK carries a `StepResult` as JSON. Every rank of a
multi-node step prints its own line: what its side measured. The head (lifecycle.burnin) judges the value
against the profile's threshold for the node's GPU model; the step itself only says `ok=False` when it saw
something no threshold can excuse (a checksum mismatch, a DCGM failure, a throttle reason).
"""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

RESULT_MARK = "GPUFLEET-BURNIN-RESULT "
MAX_RESULT_CHARS = 64 * 1024  # a result line past this is refused, never half-read

# The step kinds gpufleet-burnin runs, and whether more of the metric is better ("higher") or worse.
KINDS: dict[str, str] = {
    "gemm": "higher",  # TFLOPS of a matrix-multiply burn, checked against a checksum
    "gpu-memory": "higher",  # device memory copy bandwidth, GB/s
    "host-copy": "higher",  # host to device and back, pinned memory, GB/s (the slower direction)
    "gpu-peer": "higher",  # GPU to GPU (NVLink or PCIe peer), GB/s, the slowest pair
    "dcgm": "higher",  # dcgmi diag -r LEVEL: tests passed, out of those run
    "cpu-stress": "higher",  # stress-ng --cpu bogo operations per second
    "memory-stress": "higher",  # stress-ng --vm bogo operations per second (verified pages)
    "disk": "higher",  # fio sequential write + read, MB/s (the slower)
    "thermal": "lower",  # degrees C, the hottest GPU under sustained load (throttling fails it outright)
    "allreduce": "higher",  # all-reduce bus bandwidth, GB/s (NCCL on GPUs, gloo on CPUs)
    "network": "higher",  # point-to-point bandwidth to the partner, Gbit/s (ib_write_bw or TCP)
}
MULTI_NODE_KINDS = frozenset({"allreduce", "network"})
GPU_KINDS = frozenset({"gemm", "gpu-memory", "host-copy", "gpu-peer", "dcgm", "thermal"})


class StepResult(BaseModel):
    """One rank's measurement. `per_gpu`: the value of each GPU (by index) where the step measures each;
    the node's `value` is then the worst of them. `evidence`: the raw figures behind it, bounded."""

    model_config = ConfigDict(extra="forbid")

    kind: str = Field(max_length=32)
    value: float
    unit: str = Field(max_length=16)
    ok: bool = True
    # The node lacks what the step needs (no DCGM, no GPU, no InfiniBand for ib_write_bw): not a failure,
    # and no value to judge; `detail` says what is missing.
    skipped: bool = False
    detail: str = Field("", max_length=1024)
    per_gpu: dict[str, float] = Field(default_factory=dict, max_length=64)
    evidence: dict[str, Any] = Field(default_factory=dict)

    @field_validator("value")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v

    @field_validator("per_gpu")
    @classmethod
    def _finite_gpus(cls, v: dict[str, float]) -> dict[str, float]:
        if not all(math.isfinite(x) for x in v.values()):
            raise ValueError("per-GPU values must be finite numbers")
        return v


def format_result(result: StepResult) -> str:
    """The line a step prints (with its newline)."""
    return RESULT_MARK + result.model_dump_json() + "\n"


class BadResult(ValueError):
    """The output holds no readable result line; the message says why (it becomes the step's detail)."""


def parse_result(output: str) -> StepResult:
    """The last result line in a rank's output. Raises BadResult."""
    line = None
    for text in output.splitlines():
        if text.startswith(RESULT_MARK):
            line = text[len(RESULT_MARK) :]
    if line is None:
        raise BadResult("the step printed no result")
    if len(line) > MAX_RESULT_CHARS:
        raise BadResult(f"the step's result is over {MAX_RESULT_CHARS} characters")
    if "\x00" in line or "\\u0000" in line:
        # The head stores what it reads, and PostgreSQL's text refuses NUL characters.
        raise BadResult("the step's result holds a NUL character")
    try:
        return StepResult.model_validate(json.loads(line, parse_constant=_no_constant, parse_float=_finite))
    except RecursionError:
        raise BadResult("the step's result is nested too deep") from None
    except (ValueError, ValidationError) as exc:
        raise BadResult(f"the step's result cannot be read: {str(exc).splitlines()[0]}") from None


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number")


def _finite(text: str) -> float:
    """Every number in the result, evidence included: 1e999 reads as infinity, which JSON columns refuse."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:32]} is not a finite number")
    return value
