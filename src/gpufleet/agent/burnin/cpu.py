"""CPU and memory stress with stress-ng: bogo operations per second, and memory verified as it is written.

stress-ng writes its figures as YAML (`--yaml FILE`); the value is the sum over stressors of
`bogo-ops-per-second-real-time` (wall-clock rate, what a slower or throttled CPU lowers). The head
judges the rate; this module fails the step outright only where stress-ng says something went wrong:
an exit status other than 0 or a `fail:` line, which is how `--verify` reports a page that read back
wrong.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpufleet.agent.burnin.common import (
    Run,
    Usage,
    failed,
    find_tool,
    human_bytes,
    parse_size,
    progress,
    result,
    run_tool,
    tail,
    tool_version,
    usable_cpus,
)
from gpufleet.protocol.burnin import StepResult

UNIT = "bogo-ops/s"
# stress-ng's exit statuses (its manual, EXIT STATUS): what each means in a detail.
EXIT_MEANING = {
    1: "bad options or a fatal resource problem",
    2: "one or more stressors failed",
    3: "a stressor could not start for lack of resources (memory, disk) or a missing system call",
    4: "a stressor is not implemented here",
    5: "a stressor was killed by a signal (the OOM killer?)",
    6: "a stressor exited unexpectedly, without metrics",
    7: "the bogo-op counts may be untrustworthy (a stressor was killed mid-update)",
}
MIN_VM_BYTES = 4 << 20
_FAIL_LINE = re.compile(r"\bfail:\s")


@dataclass(frozen=True)
class StressFigures:
    """What stress-ng's YAML says: the summed rate and each stressor's figures."""

    ops_per_s: float
    bogo_ops: int
    stressors: dict[str, dict[str, float]]


def parse_stress_yaml(text: str) -> StressFigures:
    """The figures in stress-ng's `--yaml` file. Raises ValueError when it holds no metrics."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"stress-ng's YAML cannot be read: {str(exc).splitlines()[0]}") from None
    metrics = data.get("metrics") if isinstance(data, dict) else None
    if not isinstance(metrics, list) or not metrics:
        raise ValueError("stress-ng's YAML has no metrics")
    stressors: dict[str, dict[str, float]] = {}
    rate = 0.0
    ops = 0
    for entry in metrics:
        if not isinstance(entry, dict) or "stressor" not in entry:
            continue
        figures = {
            key: float(entry[key])
            for key in ("bogo-ops", "bogo-ops-per-second-real-time", "wall-clock-time", "user-time", "system-time")
            if isinstance(entry.get(key), int | float)
        }
        stressors[str(entry["stressor"])] = figures
        rate += figures.get("bogo-ops-per-second-real-time", 0.0)
        ops += int(figures.get("bogo-ops", 0))
    if not stressors:
        raise ValueError("stress-ng's YAML has no stressor figures")
    return StressFigures(rate, ops, stressors)


def failure_lines(output: str) -> list[str]:
    """stress-ng's `fail:` lines (a verification error, a stressor that failed)."""
    return [line.strip() for line in output.splitlines() if _FAIL_LINE.search(line)]


def cpu_stress(run: Run) -> StepResult:
    # Counted here rather than stress-ng's 0 (every online CPU): a job pinned to some CPUs gets one each.
    workers = int(run.options["workers"]) or usable_cpus()
    return _stress(run, ["--cpu", str(workers)], {"workers": workers})


def memory_stress(run: Run) -> StepResult:
    workers = int(run.options["workers"]) or usable_cpus()
    total = vm_bytes(str(run.options["vm-bytes"]), available_memory())
    per_worker = max(MIN_VM_BYTES, total // workers)
    # Bytes per worker, not a percentage: stress-ng's reading of "P%" changed between releases (per
    # worker, then shared), and its percentage ignores the job's cgroup limit, which available_memory keeps.
    argv = ["--vm", str(workers), "--vm-bytes", f"{per_worker // 1024}k", "--verify"]
    return _stress(run, argv, {"workers": workers, "vm_bytes_per_worker": per_worker})


def vm_bytes(option: str, available: int) -> int:
    """The bytes to stress in all: 'P%' of what is available to this job, or an absolute size.
    Raises Usage."""
    text = option.strip()
    if text.endswith("%"):
        try:
            share = float(text[:-1])
        except ValueError:
            raise Usage(f"--vm-bytes {option!r} is not a percentage (like 50%)") from None
        if not 0 < share <= 95:
            raise Usage("--vm-bytes must be a percentage above 0 and at most 95")
        return int(available * share / 100)
    try:
        return parse_size(text)
    except ValueError as exc:
        raise Usage(f"--vm-bytes: {exc}") from None


def available_memory(proc: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """Memory this job can use: MemAvailable, or less where its cgroup (v2) leaves less room."""
    available = 0
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    room = cgroup_room(proc, cgroup_root)
    candidates = [x for x in (available, room) if x]
    return min(candidates) if candidates else 1 << 30


def cgroup_room(proc: Path, cgroup_root: Path) -> int | None:
    """memory.max minus memory.current of this process's cgroup v2 and its parents (the tightest),
    or None where no limit is set or readable."""
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    path = next((line[3:] for line in lines if line.startswith("0::")), None)
    if path is None:
        return None
    rooms: list[int] = []
    directory = cgroup_root / path.strip("/")
    while True:
        try:
            limit = (directory / "memory.max").read_text().strip()
            if limit != "max":
                rooms.append(int(limit) - int((directory / "memory.current").read_text().strip()))
        except (OSError, ValueError):
            pass
        if directory == cgroup_root or cgroup_root not in directory.parents:
            break
        directory = directory.parent
    return max(0, min(rooms)) if rooms else None


def _stress(run: Run, stressor: Sequence[str], evidence: Mapping[str, Any]) -> StepResult:
    kind = run.kind
    exe = find_tool("stress-ng")
    if exe is None:
        return failed(kind, UNIT, "stress-ng is not installed (apt-get install stress-ng)")
    seconds = max(1, round(run.seconds))
    version = tool_version([exe, "--version"])
    with tempfile.TemporaryDirectory(prefix="gpufleet-burnin-") as scratch:
        report = Path(scratch) / "metrics.yaml"
        shown = ["stress-ng", *stressor, "--timeout", f"{seconds}s", "--metrics-brief"]
        # --temp-path: stress-ng's own scratch files go to ours, removed with it.
        argv = [exe, *shown[1:], "--yaml", str(report), "--temp-path", scratch]
        progress(f"{kind}: {' '.join(shown)} ({version or 'version unknown'})")
        try:
            done = run_tool(argv, timeout=2 * seconds + 120, cwd=scratch)
        except subprocess.TimeoutExpired:
            return failed(kind, UNIT, f"stress-ng did not finish within {2 * seconds + 120} s")
        except OSError as exc:
            return failed(kind, UNIT, f"stress-ng cannot start: {exc.strerror or exc}")
        text = report.read_text(errors="replace") if report.exists() else ""
    output = done.stdout + "\n" + done.stderr
    fails = failure_lines(output)
    facts: dict[str, Any] = {
        "tool": version,
        "argv": shown,
        "exit_status": done.returncode,
        **evidence,
    }
    if "vm_bytes_per_worker" in facts:
        progress(f"{kind}: {human_bytes(facts['vm_bytes_per_worker'])} per worker, verified")
    if fails:
        facts["failures"] = fails[:10]
    try:
        figures = parse_stress_yaml(text)
    except ValueError as exc:
        why = EXIT_MEANING.get(done.returncode, f"exit status {done.returncode}")
        return failed(kind, UNIT, f"{exc} (stress-ng: {why}; {tail(output)})", evidence=facts)
    facts["stressors"] = figures.stressors
    facts["bogo_ops"] = figures.bogo_ops
    progress(f"{kind}: {figures.bogo_ops} bogo ops, {figures.ops_per_s:.1f} {UNIT}")
    if fails or done.returncode != 0:
        why = EXIT_MEANING.get(done.returncode, f"exit status {done.returncode}")
        first = fails[0] if fails else tail(output, 1)
        detail = f"stress-ng: {why}" + (f" ({len(fails)} failure line(s)); first: {first}" if first else "")
        return failed(kind, UNIT, detail, value=figures.ops_per_s, evidence=facts)
    return result(kind, figures.ops_per_s, UNIT, evidence=facts)
