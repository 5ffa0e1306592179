"""Required services: `systemctl is-active UNIT` for each, as the check `service:UNIT`.

`active` (or `reloading`, `refreshing`: still serving) passes; any other state fails with "UNIT is
STATE". When systemctl is missing or cannot talk to systemd (a container without it) the check warns
instead: that is the agent's blindness, not the service's failure.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable

from gpufleet.agent.checks.executables import first_line
from gpufleet.agent.checks.ports import FAIL, PASS, WARN, result
from gpufleet.agent.checks.process import CLEAN_ENV, Finished, run_bounded
from gpufleet.protocol.metrics import CheckResult

RUNNING_STATES = frozenset({"active", "reloading", "refreshing"})
# What `systemctl is-active` prints (systemd's unit active states); anything else is an error message.
KNOWN_STATES = RUNNING_STATES | {"inactive", "failed", "activating", "deactivating", "maintenance", "unknown"}


def service_check_name(unit: str) -> str:
    return f"service:{unit}"


def check_service(
    unit: str,
    *,
    timeout_s: float,
    systemctl: str = "systemctl",
    run: Callable[[list[str], float], Finished] = run_bounded,
) -> CheckResult:
    """Ask systemd whether `unit` is active. Raises nothing: an error is the verdict (status 2)."""
    name = service_check_name(unit)
    program = shutil.which(systemctl, path=CLEAN_ENV["PATH"])
    if program is None:
        return result(name, WARN, "systemctl not available")
    try:
        # `--` so that a unit name can never be read as an option.
        finished = run([program, "is-active", "--", unit], timeout_s)
    except OSError as exc:
        return result(name, WARN, f"systemctl not available: {exc.strerror or exc}")
    if finished.timed_out:
        return result(name, WARN, f"systemctl is-active timed out after {timeout_s:g} s")
    state = first_line(finished.stdout)
    if state in RUNNING_STATES:
        return result(name, PASS, f"{unit} is {state}")
    if state in KNOWN_STATES:
        return result(name, FAIL, f"{unit} is {state}")
    why = first_line(finished.stderr) or state or f"exited with {finished.returncode}"
    return result(name, WARN, f"systemctl is-active {unit}: {why}")
