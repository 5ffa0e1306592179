"""tests/services.py. The README's promise for outside programs: a test whose program is missing skips,
naming it and how to install it; under GPUFLEET_REQUIRE_SERVICES=1 (CI) that skip is a failure. And
services the tests share are stopped by the last test process done with them, if the tests started them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests import services
from tests.conftest import ROOT
from tests.services import SBIN_DIRS, SharedService, find_tool, require_tool

RSYNC_MISSING = "rsync unavailable: rsync is not installed (bash scripts/services/rsync.sh install)"


def _path(tmp_path: Path, *programs: str) -> str:
    """A PATH of a bin and an sbin directory holding only `programs` (empty scripts)."""
    for directory in ("bin", "sbin"):
        (tmp_path / directory).mkdir(exist_ok=True)
    for name in programs:
        program = tmp_path / "bin" / name
        program.write_text("#!/bin/sh\n")
        program.chmod(0o755)
    return f"{tmp_path / 'bin'}{os.pathsep}{tmp_path / 'sbin'}"


def test_a_missing_program_skips_naming_it_and_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUFLEET_REQUIRE_SERVICES", raising=False)
    monkeypatch.setenv("PATH", _path(tmp_path, "rsync"))
    assert require_tool("rsync") == str(tmp_path / "bin" / "rsync")

    (tmp_path / "bin" / "rsync").unlink()
    with pytest.raises(pytest.skip.Exception, match=f"^{RSYNC_MISSING}$".replace("(", r"\(").replace(")", r"\)")):
        require_tool("rsync")
    with pytest.raises(pytest.skip.Exception, match=r"^frobnicate unavailable: frobnicate is not installed"):
        require_tool("frobnicate")  # a program with no known source still says which one

    monkeypatch.setenv("GPUFLEET_REQUIRE_SERVICES", "1")
    with pytest.raises(pytest.fail.Exception, match="GPUFLEET_REQUIRE_SERVICES=1 makes this a failure"):
        require_tool("rsync")


def test_a_program_the_installer_cannot_install_skips_naming_it_and_the_installer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As on a machine where apt cannot install it (offline, not root): the skip names the missing
    program, not only the service script or apt's complaint."""
    monkeypatch.delenv("GPUFLEET_REQUIRE_SERVICES", raising=False)
    monkeypatch.setenv("PATH", _path(tmp_path, "ipmi_sim"))
    (tmp_path / "bin" / "bash").symlink_to(shutil.which("bash") or "/bin/bash")  # what runs the installer
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "ipmi.sh").write_text('echo "E: Unable to locate package ipmitool" >&2; exit 100\n')
    monkeypatch.setattr(services, "SCRIPTS", scripts)
    with pytest.raises(pytest.skip.Exception) as skipped:
        services.install_tools(("ipmi_sim", "ipmitool"), "ipmi.sh")
    assert str(skipped.value) == (
        "ipmitool unavailable: not installed, and `bash scripts/services/ipmi.sh install` failed:"
        " E: Unable to locate package ipmitool"
    )

    # An installer that works: the programs' paths; with nothing missing it is not run at all.
    made = tmp_path / "bin" / "ipmitool"
    (scripts / "ipmi.sh").write_text(f"printf '#!/bin/sh\\n' > {made}; /bin/chmod +x {made}\n")
    found = services.install_tools(("ipmi_sim", "ipmitool"), "ipmi.sh")
    assert found == {"ipmi_sim": str(tmp_path / "bin" / "ipmi_sim"), "ipmitool": str(tmp_path / "bin" / "ipmitool")}
    (scripts / "ipmi.sh").write_text("exit 1\n")
    assert services.install_tools(("ipmi_sim", "ipmitool"), "ipmi.sh") == found


def test_the_sbin_directories_are_searched_only_where_path_names_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    in_sbin = shutil.which("chroot", path=os.pathsep.join(SBIN_DIRS))  # coreutils: on every Debian system
    assert in_sbin is not None
    monkeypatch.setenv("PATH", str(tmp_path))  # a user's shell: /usr/sbin not on PATH
    assert find_tool("chroot") == in_sbin

    monkeypatch.setenv("PATH", _path(tmp_path))  # an sbin named: PATH alone decides, so a test can hide one
    assert find_tool("chroot") is None


def _session(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A pytest session of its own over two tests that need rsync, with tests/conftest.py's hooks."""
    session = tmp_path / "session"
    session.mkdir(exist_ok=True)
    (session / "pytest.ini").write_text("[pytest]\n")
    (session / "conftest.py").write_text("from tests.conftest import pytest_configure, pytest_runtest_setup\n")
    (session / "test_needs_rsync.py").write_text(
        "import pytest\n"
        "from tests.services import require_tool\n\n"
        '@pytest.mark.requires_tool("rsync")\n'
        "def test_marked():\n"
        '    raise AssertionError("ran without rsync")\n\n'
        "def test_asking():\n"
        '    require_tool("rsync")\n'
        '    raise AssertionError("ran without rsync")\n'
    )
    options = ["-c", str(session / "pytest.ini"), "-rs", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "t")]
    return subprocess.run(
        [sys.executable, "-m", "pytest", str(session), *options],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_session_without_the_program_skips_its_tests_with_the_reason(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GPUFLEET_REQUIRE_SERVICES"}
    env |= {"PATH": _path(tmp_path), "PYTHONPATH": str(ROOT)}

    skipped = _session(tmp_path, env)  # the failure under GPUFLEET_REQUIRE_SERVICES=1: the first test

    assert skipped.returncode == 0, skipped.stdout + skipped.stderr
    assert f"SKIPPED [2] {Path(services.__file__).relative_to(ROOT)}" in skipped.stdout, skipped.stdout
    assert f": {RSYNC_MISSING}\n" in skipped.stdout
    assert "2 skipped" in skipped.stdout
    assert "ran without rsync" not in skipped.stdout


# A service as scripts/services/*.sh are: start (at once when running), stop, status; a sleep is its daemon.
FAKE_SERVICE = """#!/usr/bin/env bash
set -eu
pidfile=$FAKE_STATE/daemon.pid
running() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }
case $1 in
  start) running || { sleep 300 >/dev/null 2>&1 & echo $! >"$pidfile"; }; echo "ready" ;;
  stop) if running; then kill "$(cat "$pidfile")"; fi; rm -f "$pidfile"; echo "fake: stopped" ;;
  status) running ;;
esac
"""


@pytest.fixture
def fake_service(tmp_path: Path) -> Iterator[Callable[..., SharedService]]:
    """SharedServices over one fake service (one per holder pid); its daemon killed at the end whatever happened."""
    script = tmp_path / "fake.sh"
    script.write_text(FAKE_SERVICE)
    env = {"FAKE_STATE": str(tmp_path)}

    def held_by(holder: int) -> SharedService:
        return SharedService("fake", script, tmp_path / "fake.lock", env, state=tmp_path / "shared", holder=holder)

    yield held_by
    subprocess.run(["bash", str(script), "stop"], env={**os.environ, **env}, capture_output=True, check=False)


def test_the_last_holder_stops_what_the_tests_started(fake_service: Callable[..., SharedService]) -> None:
    other = subprocess.Popen(["sleep", "300"])  # another test process (an xdist worker) using it too
    try:
        mine, theirs = fake_service(os.getpid()), fake_service(other.pid)
        assert not mine.running()

        assert mine.start().stdout == "ready\n"
        assert theirs.start().returncode == 0
        mine.release()
        assert mine.running(), "stopped while another test process still held it"
        theirs.release()
        assert not mine.running()
    finally:
        other.kill()
        other.wait()


def test_a_holder_that_died_does_not_keep_it_running(fake_service: Callable[..., SharedService]) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()  # killed mid-run: it never released
    mine, theirs = fake_service(os.getpid()), fake_service(dead.pid)
    theirs.start()
    mine.start()

    mine.release()

    assert not mine.running()


def test_a_service_running_before_the_tests_is_left_running(fake_service: Callable[..., SharedService]) -> None:
    by_hand = fake_service(os.getpid())
    started_by_hand = ["bash", str(by_hand.script), "start"]  # an admin's `slurm.sh start`, CI's PostgreSQL
    subprocess.run(started_by_hand, env={**os.environ, **by_hand.env}, capture_output=True, check=True)

    by_hand.start()
    by_hand.release()

    assert by_hand.running()
