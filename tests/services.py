"""What the tests need from the machine: outside programs and system services.

Where one is missing, the test that needs it skips, naming it and how to install it; under
GPUFLEET_REQUIRE_SERVICES=1 (CI, .ci/run) that skip is a failure. A test that runs an outside program,
itself or through gpufleet's code, is marked `@pytest.mark.requires_tool("rsync")` (checked before its
fixtures run, by tests/conftest.py) or calls `require_tool("rsync")` where it needs the path; one that
scripts/services installs calls `install_tools(("rsync",), "rsync.sh")`.

Services the test processes share (PostgreSQL, Slurm) are a `SharedService`: started by the first
process that needs one, stopped by the last one done with it, so a test run leaves running nothing it
started; a service that was running before the tests started it is left alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from filelock import FileLock

# Where each outside program the tests run comes from; the skip reason says it. Programs every Debian
# system has (Priority: required: tar, gzip, cp, chroot, unshare, dash, sh) need no mark.
TOOL_SOURCES = {
    "rsync": "bash scripts/services/rsync.sh install",
    "ssh": "bash scripts/services/rsync.sh install",
    "sshd": "bash scripts/services/rsync.sh install",
    "debootstrap": "bash scripts/services/images.sh install",
    "podman": "bash scripts/services/containers.sh install image",
    "bwrap": "bash scripts/services/containers.sh install image",
    "dnsmasq": "bash scripts/services/dnsmasq.sh install",
    "busybox": "bash scripts/services/dnsmasq.sh install",
    "ip": "bash scripts/services/dnsmasq.sh install",
    "rsyslogd": "bash scripts/services/rsyslog.sh install",
    "prometheus": "bash scripts/services/prometheus.sh install",
    "promtool": "bash scripts/services/prometheus.sh install",
    "ipmitool": "bash scripts/services/ipmi.sh install",
    "ipmi_sim": "bash scripts/services/ipmi.sh install",
    "stress-ng": "bash scripts/services/burnin-tools.sh install",
    "fio": "bash scripts/services/burnin-tools.sh install",
    "useradd": "apt-get install passwd",
    "bash": "apt-get install bash",
}
SBIN_DIRS = ("/usr/local/sbin", "/usr/sbin", "/sbin")
MARKER = "requires_tool"


def need(service: str, reason: str) -> None:
    """Skip (or, in CI, fail) a test whose system service is unavailable, saying why."""
    message = f"{service} unavailable: {reason}"
    if os.environ.get("GPUFLEET_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{message} (GPUFLEET_REQUIRE_SERVICES=1 makes this a failure)")
    pytest.skip(message)


def find_tool(name: str) -> str | None:
    """The path of program `name` on PATH, or None. Where PATH names no sbin directory (a user's
    shell on Debian), the system's sbin directories are searched too: dnsmasq, sshd and debootstrap
    live there, and gpufleet's own runner (provisioning.runner) has them on its PATH."""
    path = os.environ.get("PATH", os.defpath)
    if not any(os.path.basename(part.rstrip("/")) == "sbin" for part in path.split(os.pathsep)):
        path = os.pathsep.join([path, *SBIN_DIRS])
    return shutil.which(name, path=path)


def require_tool(name: str) -> str:
    """The path of program `name`; where it is missing, skip the test (fail it in CI) naming the
    program and how to install it."""
    found = find_tool(name)
    if found is None:
        need(name, f"{name} is not installed ({TOOL_SOURCES.get(name, 'install it')})")
    assert found is not None
    return found


SCRIPTS = Path(__file__).resolve().parents[1] / "scripts" / "services"


def install_tools(tools: Sequence[str], script: str, timeout: float = 600) -> dict[str, str]:
    """The paths of `tools`, installing them first with `bash scripts/services/SCRIPT install` where any
    is missing (as root it uses apt; otherwise, or offline, it fails). Where they cannot be had, skip
    the test (fail it in CI) naming the missing programs, the installer and its last line of output."""
    missing = [tool for tool in tools if find_tool(tool) is None]
    if missing:
        done = subprocess.run(
            ["bash", str(SCRIPTS / script), "install"], capture_output=True, text=True, timeout=timeout, check=False
        )
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip().splitlines()
            why = said[-1] if said else f"exit status {done.returncode}"
            need(", ".join(missing), f"not installed, and `bash scripts/services/{script} install` failed: {why}")
    return {tool: require_tool(tool) for tool in tools}


def register_marker(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(*names): runs these outside programs, itself or through gpufleet; skips naming each one "
        "missing from PATH, a failure under GPUFLEET_REQUIRE_SERVICES=1 (tests.services.require_tool)",
    )


def check_required_tools(item: pytest.Item) -> None:
    """Skip `item` (fail it in CI) if a program its `requires_tool` marks name is missing."""
    for mark in item.iter_markers(MARKER):
        for name in mark.args:
            require_tool(name)


SHARED_STATE = Path("/tmp") / "gpufleet-test-services"
STARTED_BY_TESTS = "started-by-tests"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


@dataclass
class SharedService:
    """A service behind a scripts/services script (`start`, `stop`, `status`) that the test processes
    on this machine share: xdist workers, and runs side by side.

    Each process that starts it holds it (a file named after its pid) until `release`; the last holder
    to release stops it, if a test process started it: `status` said it was not running before the
    start. A holder that died without releasing (kill -9) is forgotten at the next release.
    """

    name: str  # its state under `state`: the marker and the holders
    script: Path
    lock: Path  # the same lock serialises starts, releases and stops
    env: Mapping[str, str] = field(default_factory=dict)
    state: Path = SHARED_STATE
    holder: int = field(default_factory=os.getpid)

    def start(self) -> subprocess.CompletedProcess[str]:
        """`SCRIPT start` (which returns at once when it is running); this process holds the service
        from a successful start until `release`."""
        with FileLock(str(self.lock)):
            was_running = self.running()
            started = self._run("start", 600)
            if started.returncode == 0:
                holders = self._dir / "holders"
                holders.mkdir(parents=True, exist_ok=True)
                if not was_running:
                    (self._dir / STARTED_BY_TESTS).write_text(f"{self.holder}\n")
                (holders / str(self.holder)).touch()
        return started

    def release(self) -> None:
        """This process is done with the service: stop it if a test process started it and no live
        process holds it any more."""
        with FileLock(str(self.lock)):
            holders = self._dir / "holders"
            (holders / str(self.holder)).unlink(missing_ok=True)
            left = []
            for held in holders.iterdir() if holders.is_dir() else ():
                if held.name.isdigit() and _alive(int(held.name)):
                    left.append(held)
                else:
                    held.unlink(missing_ok=True)
            marker = self._dir / STARTED_BY_TESTS
            if not left and marker.exists():
                self._run("stop", 120)
                marker.unlink()

    def running(self) -> bool:
        """What `SCRIPT status` says."""
        return self._run("status", 60).returncode == 0

    @property
    def _dir(self) -> Path:
        return self.state / self.name

    def _run(self, command: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(self.script), command],
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
