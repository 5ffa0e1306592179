"""Disk: fio sequential write, then read of the same file, in MB/s (10^6 bytes), the slower of the two.

One fio run with two jobs (`read` waits for `write`: stonewall), JSON output. Direct I/O (O_DIRECT)
where the file system takes it, each phase looping over the file for half the step's time; where it
refuses O_DIRECT (older tmpfs, some network file systems) the run is repeated buffered, each phase
once over the file, with an fsync at the end of the write and the page cache dropped before the read
(fio's invalidate), and the evidence says so. The file lives in a fresh directory under `--dir`
(default $TMPDIR, else /var/tmp, which is usually on the node's disk where /tmp may be memory) and
is removed afterwards, whatever happened.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.agent.burnin.common import (
    Run,
    failed,
    find_tool,
    human_bytes,
    progress,
    result,
    run_tool,
    tail,
    tool_version,
)
from gpufleet.protocol.burnin import StepResult

UNIT = "MB/s"
EINVAL = 22


@dataclass(frozen=True)
class FioPhase:
    name: str
    bytes_per_s: float
    io_bytes: int
    runtime_ms: int
    error: int


def parse_fio_json(text: str) -> dict[str, FioPhase]:
    """Each fio job's figures by job name (its read or write side, whichever it did). fio may print
    warnings before the JSON, which are skipped. Raises ValueError when no JSON report is there."""
    start = text.find("{")
    if start < 0:
        raise ValueError("fio printed no JSON report")
    try:
        data = json.JSONDecoder().raw_decode(text[start:])[0]
    except ValueError:
        raise ValueError("fio's JSON report cannot be read") from None
    jobs = data.get("jobs") if isinstance(data, dict) else None
    if not isinstance(jobs, list) or not jobs:
        raise ValueError("fio's JSON report has no jobs")
    phases: dict[str, FioPhase] = {}
    for job in jobs:
        name = str(job.get("jobname", ""))
        side = "read" if name == "read" else "write"
        figures = job.get(side) or {}
        phases[name] = FioPhase(
            name,
            float(figures.get("bw_bytes", 0)),
            int(figures.get("io_bytes", 0)),
            int(figures.get("runtime", 0)),
            int(job.get("error", 0) or 0),
        )
    return phases


def fio_argv(exe: str, path: str, size: int, seconds: float, options: dict[str, Any], direct: bool) -> list[str]:
    """The fio command line: global options, then the write job, then the read job after it."""
    phase_ms = max(500, int(seconds * 1000 / 2))
    argv = [
        exe,
        "--output-format=json",
        f"--filename={path}",
        f"--size={size}",
        f"--bs={options['bs']}",
        f"--ioengine={options['ioengine']}",
        f"--iodepth={options['iodepth']}",
        f"--direct={int(direct)}",
        f"--runtime={phase_ms}ms",
    ]
    if direct:
        # Loop over the file for the whole phase: the step's seconds are how long it loads the disk.
        argv.append("--time_based=1")
    argv += ["--name=write", "--rw=write", "--end_fsync=1", "--name=read", "--rw=read", "--stonewall"]
    if not direct:
        argv.append("--invalidate=1")  # buffered: drop the file's pages so the read comes from the disk
    return argv


class _FioFailed(Exception):
    """fio could not measure; the message is the step's detail."""


def disk(run: Run) -> StepResult:
    kind = run.kind
    exe = find_tool("fio")
    if exe is None:
        return failed(kind, UNIT, "fio is not installed (apt-get install fio)")
    # /var/tmp is only the default parent: the file goes in a private directory made inside it.
    base = Path(str(run.options["dir"] or os.environ.get("TMPDIR") or "/var/tmp"))  # noqa: S108
    size = int(run.options["size"])
    try:
        free = shutil.disk_usage(base).free
        scratch = tempfile.mkdtemp(prefix="gpufleet-burnin-", dir=base)
    except OSError as exc:
        return failed(kind, UNIT, f"cannot write in {base}: {exc.strerror or exc}")
    version = tool_version([exe, "--version"])
    attempts: list[str] = []
    try:
        if free < size + (64 << 20):
            return failed(kind, UNIT, f"{base} has {human_bytes(free)} free; the step writes {human_bytes(size)}")
        progress(f"{kind}: fio ({version}) sequential write then read of {human_bytes(size)} in {base}")
        phases, direct, argv = _measure(run, exe, os.path.join(scratch, "fio.data"), attempts, base)
    except _FioFailed as exc:
        return failed(kind, UNIT, str(exc), evidence={"tool": version, "attempts": attempts})
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    write, read = phases["write"].bytes_per_s / 1e6, phases["read"].bytes_per_s / 1e6
    progress(f"{kind}: write {write:.1f} MB/s, read {read:.1f} MB/s")
    evidence = {
        "tool": version,
        "argv": ["fio", *(a for a in argv[1:] if not a.startswith("--filename="))],
        "dir": str(base),
        "direct": direct,
        "size_bytes": size,
        "write_mb_s": write,
        "read_mb_s": read,
        "write": {"io_bytes": phases["write"].io_bytes, "runtime_ms": phases["write"].runtime_ms},
        "read": {"io_bytes": phases["read"].io_bytes, "runtime_ms": phases["read"].runtime_ms},
    }
    if attempts:
        evidence["attempts"] = attempts
    detail = "" if direct else f"{base} refused direct I/O: measured buffered, through the page cache"
    return result(kind, min(write, read), UNIT, detail=detail, evidence=evidence)


def _measure(
    run: Run, exe: str, path: str, attempts: list[str], base: Path
) -> tuple[dict[str, FioPhase], bool, list[str]]:
    """Run fio with direct I/O, then buffered if the file system refused it; (phases, direct, argv).
    Raises _FioFailed; `attempts` collects what each failed try said."""
    for direct in (True, False):
        argv = fio_argv(exe, path, int(run.options["size"]), run.seconds, dict(run.options), direct)
        try:
            done = run_tool(argv, timeout=2 * run.seconds + 120, cwd=os.path.dirname(path))
        except subprocess.TimeoutExpired:
            raise _FioFailed(f"fio did not finish within {2 * run.seconds + 120:.0f} s") from None
        except OSError as exc:
            raise _FioFailed(f"fio cannot start: {exc.strerror or exc}") from None
        said = done.stdout + "\n" + done.stderr
        phases: dict[str, FioPhase] = {}
        try:
            phases = parse_fio_json(done.stdout)
        except ValueError as exc:
            problem = f"{exc}: {tail(said)}"
        else:
            errors = {p.name: p.error for p in phases.values() if p.error}
            problem = f"fio job error(s) {errors}: {tail(said)}" if errors else ""
            if not problem and done.returncode != 0:
                problem = f"fio exit status {done.returncode}: {tail(said)}"
            if not problem and not {"write", "read"} <= set(phases):
                problem = f"fio reported jobs {sorted(phases)}, not write and read"
        if not problem:
            return phases, direct, argv
        attempts.append(f"direct={int(direct)}: {problem}")
        refused_direct = "direct" in said.lower() or any(p.error == EINVAL for p in phases.values())
        if not (direct and refused_direct):
            raise _FioFailed(problem)
        progress(f"{run.kind}: {base} refused direct I/O; buffered instead")
    raise _FioFailed(attempts[-1])
