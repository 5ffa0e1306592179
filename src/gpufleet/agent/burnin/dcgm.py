"""DCGM diagnostics: `dcgmi diag -r LEVEL -j` on the job's GPUs; the value is the share of results that
passed (a warning counts as passed, a skipped test is not counted), and any failure fails the step.

The JSON is walked by shape, not by a fixed schema: DCGM 3 nests tests under "DCGM GPU Diagnostic" →
test_categories → tests, DCGM 4 also lists them at the top and names results by entity; a test is any
table with a name and a list of results, each with a status. dcgmi may print warnings before the JSON.
Where dcgmi is not installed the step is skipped; where it is but cannot reach its host engine, or
runs no test, the step fails with what dcgmi said (an admin installed DCGM, so it should work).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from typing import Any

from gpufleet.agent.burnin.common import (
    Run,
    failed,
    find_tool,
    no_gpu_reason,
    progress,
    result,
    run_tool,
    skipped,
    tail,
    tool_version,
)
from gpufleet.protocol.burnin import StepResult

UNIT = "fraction"
PASS, FAIL, WARN, SKIP = "pass", "fail", "warn", "skip"


@dataclass
class Diag:
    """What a dcgmi diag report says: per test, the statuses of its results."""

    tests: dict[str, list[str]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)  # "test: what DCGM said"
    errors: list[str] = field(default_factory=list)  # runtime errors for the whole run
    version: str = ""

    def count(self, status: str) -> int:
        return sum(s == status for statuses in self.tests.values() for s in statuses)


def status_of(raw: object) -> str:
    text = str(raw).strip().lower()
    if text in ("pass", "passed", "ok"):
        return PASS
    if text in ("fail", "failed", "error"):
        return FAIL
    if text in ("warn", "warning"):
        return WARN
    return SKIP  # skipped, not run, n/a, and anything unknown: counted neither way


def parse_diag_json(output: str) -> Diag:
    """The tests in `dcgmi diag -j` output. Raises ValueError when there is no JSON document."""
    start = output.find("{")
    if start < 0:
        raise ValueError("dcgmi printed no JSON report")
    try:
        document = json.JSONDecoder().raw_decode(output[start:])[0]
    except ValueError:
        raise ValueError("dcgmi's JSON report cannot be read") from None
    diag = Diag()
    _walk(document, diag, 0)
    return diag


def _walk(node: Any, diag: Diag, depth: int) -> None:
    if depth > 12:
        return
    if isinstance(node, list):
        for item in node:
            _walk(item, diag, depth + 1)
        return
    if not isinstance(node, dict):
        return
    for key in ("runtime_error", "error"):
        if isinstance(node.get(key), str) and node[key].strip():
            diag.errors.append(node[key].strip())
    if isinstance(node.get("version"), str) and not diag.version:
        diag.version = node["version"]
    results = node.get("results")
    if isinstance(node.get("name"), str) and isinstance(results, list):
        name = node["name"]
        statuses = diag.tests.setdefault(name, [])
        for entry in results:
            if not isinstance(entry, dict):
                continue
            status = status_of(entry.get("status", ""))
            statuses.append(status)
            if status == FAIL:
                diag.failures.append(f"{name}{_where(entry)}: {_said(entry)}")
        return
    for value in node.values():
        _walk(value, diag, depth + 1)


def _where(entry: dict[str, Any]) -> str:
    gpu = entry.get("gpu_ids", entry.get("entity_id"))
    return f" (GPU {gpu})" if gpu not in (None, "") else ""


def _said(entry: dict[str, Any]) -> str:
    for key in ("warnings", "errors", "info", "warning", "error"):
        value = entry.get(key)
        if isinstance(value, list) and value:
            first = value[0]
            return str(first.get("warning", first.get("error", first)) if isinstance(first, dict) else first)[:300]
        if isinstance(value, str) and value:
            return value[:300]
    return "failed"


def gpu_ids(environ: dict[str, str] | None = None) -> tuple[list[str] | None, str]:
    """The DCGM GPU ids of the job's GPUs (NVML indexes), or None for all, and how they were found.
    CUDA_VISIBLE_DEVICES holds UUIDs (the agent's) or indexes."""
    env = dict(os.environ if environ is None else environ)
    visible = [v.strip() for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if not visible:
        return None, "all GPUs (CUDA_VISIBLE_DEVICES unset)"
    if all(v.isdigit() for v in visible):
        return visible, "CUDA_VISIBLE_DEVICES"
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            ids = [str(pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(v))) for v in visible]
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # pynvml missing or NVML refusing: DCGM then checks every GPU
        return None, f"all GPUs (could not map UUIDs to indexes: {type(exc).__name__})"
    return ids, "CUDA_VISIBLE_DEVICES UUIDs through NVML"


def dcgm(run: Run) -> StepResult:
    kind = run.kind
    reason = no_gpu_reason()
    if reason:
        return skipped(kind, UNIT, reason)
    exe = find_tool("dcgmi")
    if exe is None:
        return skipped(kind, UNIT, "DCGM is not installed (no dcgmi)")
    level = int(run.options["level"])
    ids, chosen = gpu_ids()
    argv = [exe, "diag", "-r", str(level), "-j"] + (["-i", ",".join(ids)] if ids else [])
    version = tool_version([exe, "--version"])
    progress(f"dcgm: dcgmi diag -r {level} on {','.join(ids) if ids else 'all GPUs'} ({version or 'version unknown'})")
    limit = 3 * run.seconds + 60  # a level 3 or 4 run takes as long as it takes; the job's limit is above
    evidence: dict[str, Any] = {"tool": version, "argv": ["dcgmi", *argv[1:]], "gpus": chosen}
    try:
        done = run_tool(argv, timeout=limit)
    except subprocess.TimeoutExpired:
        return failed(kind, UNIT, f"dcgmi diag did not finish within {limit:.0f} s", evidence=evidence)
    except OSError as exc:
        return failed(kind, UNIT, f"dcgmi cannot start: {exc.strerror or exc}", evidence=evidence)
    said = done.stdout + "\n" + done.stderr
    evidence["exit_status"] = done.returncode
    try:
        diag = parse_diag_json(done.stdout)
    except ValueError as exc:
        diag = Diag(errors=[f"{exc}: {tail(said, 2)}"])
    return _verdict(kind, diag, said, evidence)


def _verdict(kind: str, diag: Diag, said: str, evidence: dict[str, Any]) -> StepResult:
    """The step's result from a parsed report (`said`: dcgmi's whole output, for its reasons)."""
    passed = diag.count(PASS) + diag.count(WARN)
    failures = diag.count(FAIL)
    evidence.update(
        dcgm=diag.version,
        tests=dict(diag.tests),
        passed=passed,
        failed=failures,
        skipped=diag.count(SKIP),
    )
    if diag.errors:
        evidence["errors"] = diag.errors[:5]
    if passed + failures == 0:
        if "unsupported" in said.lower():
            return skipped(kind, UNIT, f"DCGM does not support these GPUs: {tail(said, 2)}", evidence=evidence)
        why = diag.errors[0] if diag.errors else tail(said, 2)
        return failed(kind, UNIT, f"dcgmi diag ran no test: {why}", evidence=evidence)
    value = passed / (passed + failures)
    progress(f"dcgm: {passed} passed, {failures} failed, {diag.count(SKIP)} skipped")
    if failures or diag.errors:
        detail = "; ".join(diag.failures[:5] or diag.errors[:2])
        return failed(kind, UNIT, f"DCGM diagnostic failed: {detail}", value=value, evidence=evidence)
    return result(kind, value, UNIT, evidence=evidence)
