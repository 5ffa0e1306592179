"""The systemd units: `gpufleet server install-unit` and `gpufleet agent install-unit` in process, the
rendered units checked by the real `systemd-analyze verify` (with the ExecStart programs that exist
here), and every refusal leaving the unit directory as it was."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet import entry  # registers `server` and `agent` on the root command
from gpufleet.cli.app import app
from gpufleet.cli.state import CliState
from gpufleet.cli.units import running_program
from gpufleet.core.errors import GpufleetError, InvalidInput
from gpufleet.deploy import units
from tests.services import require_tool

# the running gpufleet's script: a file that exists, as systemd-analyze verify wants ExecStart's to
GPUFLEET = str(Path(sys.executable).parent / "gpufleet")
assert callable(entry.main)  # imported for its registrations


@pytest.fixture(autouse=True)
def _no_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Neither the developer's settings nor a GPUFLEET_* variable reaches the commands' defaults."""
    for key in list(os.environ):
        if key.startswith("GPUFLEET_"):
            monkeypatch.delenv(key)
    config = tmp_path / "config"
    config.mkdir()
    (config / "gpufleet.toml").write_text("")
    monkeypatch.setenv("GPUFLEET_CLIENT_CONFIG", str(config / "client.toml"))
    monkeypatch.setenv("GPUFLEET_CONFIG", str(config / "gpufleet.toml"))


@pytest.fixture
def unit_dir(tmp_path: Path) -> Path:
    """Where the tests install units (systemd's /etc/systemd/system)."""
    path = tmp_path / "units"
    path.mkdir()
    return path


def _cli(*args: str) -> tuple[int, str, str]:
    """Exit code, stdout and stderr, a GpufleetError as `main` turns it into them."""
    result = CliRunner().invoke(app, list(args), obj=CliState())
    if isinstance(result.exception, GpufleetError):
        return result.exception.exit_code, result.stdout, result.stderr + f"gpufleet: error: {result.exception}\n"
    return result.exit_code, result.stdout, result.stderr


def _verify(path: Path) -> None:
    """`systemd-analyze verify` accepts the unit: exit 0 and no word about it (an unknown key or a bad
    value is a warning with exit 0, so the output is checked too)."""
    analyze = require_tool("systemd-analyze")
    done = subprocess.run(
        [analyze, "verify", "--man=no", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert path.name not in said, said


def _directives(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


@pytest.mark.parametrize("user", ["gpufleet", "root"])
def test_the_server_unit_verifies_and_is_hardened(unit_dir: Path, user: str) -> None:
    code, out, err = _cli(
        "server", "install-unit", "--unit-dir", str(unit_dir), "--user", user, "--program", GPUFLEET,
        "--read-write", "/srv/gpufleet-images",
    )  # fmt: skip
    assert code == 0, err
    unit = unit_dir / units.SERVER_UNIT
    assert out.splitlines() == [
        f"wrote {unit}",
        "then: systemctl daemon-reload && systemctl enable --now gpufleet-server",
    ]
    assert unit.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in unit_dir.iterdir()] == [units.SERVER_UNIT]  # no temporary file left behind
    _verify(unit)
    d = _directives(unit.read_text())
    assert d["ExecStart"] == [f"{GPUFLEET} server"]
    assert d["User"] == [user]
    assert d["EnvironmentFile"] == ["-/etc/gpufleet/server.env"]
    assert d["Environment"] == ["GPUFLEET_DATA_DIR=/var/lib/gpufleet"]
    assert d["ProtectSystem"] == ["strict"]
    assert d["ReadWritePaths"] == ["/var/lib/gpufleet /srv/gpufleet-images"]
    assert d["StateDirectory"] == ["gpufleet"]
    for option in ("NoNewPrivileges", "PrivateTmp", "ProtectKernelModules", "ProtectControlGroups"):
        assert d[option] == ["yes"], option
    assert d["Restart"] == ["on-failure"]
    assert (d["StartLimitIntervalSec"], d["StartLimitBurst"]) == (["300"], ["5"])
    # root's home holds the head's ~/.ssh, and image builds need device nodes and setuid files
    assert ("ProtectHome" in d) is (user != "root")
    assert ("PrivateDevices" in d) is (user != "root")
    assert ("RestrictSUIDSGID" in d) is (user != "root")


def test_the_agent_unit_verifies_restarts_but_never_into_a_refusal(unit_dir: Path) -> None:
    code, _, err = _cli("agent", "install-unit", "--unit-dir", str(unit_dir), "--name", "gpu001")
    assert code == 0, err
    unit = unit_dir / units.AGENT_UNIT
    _verify(unit)
    d = _directives(unit.read_text())
    assert d["ExecStart"] == [f"{' '.join(running_program())} agent --state-dir /var/lib/gpufleet-agent --name gpu001"]
    assert d["User"] == ["root"]
    assert d["EnvironmentFile"] == ["-/etc/gpufleet/agent.env"]
    assert d["Restart"] == ["on-failure"]
    assert d["RestartPreventExitStatus"] == ["2 5 8"]  # 5: refused for good (docs/agent.md)
    assert (d["StartLimitIntervalSec"], d["StartLimitBurst"]) == (["300"], ["5"])
    assert d["StateDirectory"] == ["gpufleet-agent"]
    assert (d["OOMPolicy"], d["TasksMax"], d["LimitMEMLOCK"]) == (["continue"], ["infinity"], ["infinity"])
    assert d["ProtectSystem"] == ["true"]  # /usr and /boot only: jobs inherit the rest
    for option in ("NoNewPrivileges", "PrivateTmp", "ProtectHome", "PrivateDevices", "ProtectKernelLogs"):
        assert option not in d, option
    assert "note: write /etc/gpufleet/agent.env" in err or Path("/etc/gpufleet/agent.env").exists()


def test_the_agent_unit_from_a_zipapp(unit_dir: Path) -> None:
    zipapp = f"{units.AGENT_LIB_DIR}/{units.zipapp_name()}"
    code, out, err = _cli("agent", "install-unit", "--print", "--zipapp", zipapp, "--state-dir", "/var/lib/ga")
    assert code == 0, err
    assert list(unit_dir.iterdir()) == []
    d = _directives(out)
    assert d["ExecStart"] == [f"/usr/bin/python3 {zipapp} agent --state-dir /var/lib/ga"]
    assert d["Environment"] == ["SHIV_ROOT=/var/lib/ga/shiv"]  # not ~/.shiv of a root with no home
    (unit_dir / units.AGENT_UNIT).write_text(out)
    _verify(unit_dir / units.AGENT_UNIT)  # /usr/bin/python3 is the program systemd checks


def test_print_writes_nothing_and_prints_what_install_writes(unit_dir: Path) -> None:
    code, printed, _ = _cli("server", "install-unit", "--print", "--unit-dir", str(unit_dir), "--program", GPUFLEET)
    assert code == 0
    assert list(unit_dir.iterdir()) == []
    assert _cli("server", "install-unit", "--unit-dir", str(unit_dir), "--program", GPUFLEET)[0] == 0
    assert (unit_dir / units.SERVER_UNIT).read_text() == printed


def test_a_different_unit_is_kept_without_force(unit_dir: Path) -> None:
    unit = unit_dir / units.AGENT_UNIT
    unit.write_text("[Service]\nExecStart=/opt/theirs\n")
    os.utime(unit, (1_000_000, 1_000_000))
    code, out, err = _cli("agent", "install-unit", "--unit-dir", str(unit_dir))
    assert code == 4, out  # Conflict
    assert f"{unit} exists and differs from the unit to install; nothing was changed" in err
    assert "--force" in err
    assert unit.read_text() == "[Service]\nExecStart=/opt/theirs\n"
    assert unit.stat().st_mtime == 1_000_000
    assert [p.name for p in unit_dir.iterdir()] == [units.AGENT_UNIT]

    code, out, err = _cli("agent", "install-unit", "--unit-dir", str(unit_dir), "--force")
    assert code == 0, err
    assert "ExecStart=/opt/theirs" not in unit.read_text()
    # the same unit again: nothing to do, and no --force needed
    code, out, _ = _cli("agent", "install-unit", "--unit-dir", str(unit_dir))
    assert code == 0
    assert out.splitlines()[0] == f"{unit} is up to date (unchanged)"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["server", "install-unit", "--data-dir", "/var/lib/my gpufleet"], "the data directory"),
        (["server", "install-unit", "--data-dir", "relative/dir"], "must be an absolute path"),
        (["server", "install-unit", "--user", "Bad User"], "is not a user name"),
        (["server", "install-unit", "--program", "/opt/gpu%fleet"], "--program"),
        (["agent", "install-unit", "--name", "-bad"], "node name"),
        (["agent", "install-unit", "--state-dir", "/var/lib/../etc"], "may not hold '..'"),
        (["agent", "install-unit", "--zipapp", "/x.pyz", "--program", GPUFLEET], "not both"),
        (["agent", "install-unit", "--zipapp", "/x.pyz", "--python", "python3"], "interpreter"),
    ],
)
def test_refusals_change_nothing(unit_dir: Path, args: list[str], message: str) -> None:
    code, _, err = _cli(*args, "--unit-dir", str(unit_dir))
    assert code == 2, err
    assert message in err
    assert list(unit_dir.iterdir()) == []


def test_a_missing_unit_directory_is_refused(unit_dir: Path) -> None:
    code, _, err = _cli("server", "install-unit", "--unit-dir", str(unit_dir / "nope"), "--program", GPUFLEET)
    assert code == 2
    assert f"no such directory: {unit_dir / 'nope'}" in err


def test_the_agent_command_still_runs_the_agent() -> None:
    """`gpufleet agent` is a group now (for install-unit); without a subcommand it is the agent."""
    code, _, err = _cli("agent", "--name", "not a name", "--server", "http://127.0.0.1:9")
    assert code == 2
    assert "pass --name" in err


def test_home_rule_and_paths() -> None:
    assert units.home_is_protected("/root")
    assert units.home_is_protected("/home/gpufleet")
    assert not units.home_is_protected("/var/lib/gpufleet")
    assert not units.home_is_protected(None)
    assert units.state_directory("/var/lib/gpufleet") == "gpufleet"
    assert units.state_directory("/srv/gpufleet") is None
    assert units.check_path("/a//b/./c", "x") == "/a/b/c"
    with pytest.raises(InvalidInput):
        units.env_line("GPUFLEET_SERVER", "http://x/$HOME")
    text = units.agent_env("https://head:8443/", "gfj_abc:sha256:" + "0" * 64)
    assert "GPUFLEET_SERVER=https://head:8443\n" in text
    assert f"GPUFLEET_JOIN_TOKEN=gfj_abc:sha256:{'0' * 64}\n" in text
