"""The README's promise for outside programs (tests/services.py): a test whose program is missing skips,
naming it and how to install it; under GPUFLEET_REQUIRE_SERVICES=1 (CI) that skip is a failure."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import services
from tests.conftest import ROOT
from tests.services import SBIN_DIRS, find_tool, require_tool

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
