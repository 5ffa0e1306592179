"""Where `gpufleet sim` keeps its nodes' credentials by default: per user, in the XDG state directory,
never the working directory (a run from another directory would otherwise join every node again)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest
from typer.testing import CliRunner

from gpufleet.cli.app import app
from gpufleet.sim.runner import SimOptions, default_state_dir


def test_the_state_directory_is_the_users_xdg_state_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert default_state_dir() == tmp_path / "state" / "gpufleet" / "sim"
    assert SimOptions(server="http://127.0.0.1:9", join_token=None, nodes=1).state_dir == default_state_dir()


@pytest.mark.parametrize("xdg", [None, "", "relative/state"])  # unset, empty, or relative: the spec's fallback
def test_without_a_usable_xdg_state_home_it_is_under_the_home_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, xdg: str | None
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    if xdg is None:
        monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_STATE_HOME", xdg)
    assert default_state_dir() == tmp_path / ".local" / "state" / "gpufleet" / "sim"


class RecordedSimulation:
    """Stands in for Simulation: keeps the options `gpufleet sim` built and runs nothing."""

    built: ClassVar[list[SimOptions]] = []

    def __init__(self, options: SimOptions) -> None:
        self.built.append(options)

    def build(self) -> None:
        pass

    async def run(self) -> None:
        pass


def test_gpufleet_sim_keeps_its_state_there_unless_told(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import gpufleet.entry  # noqa: F401  (adds `sim` to the CLI)
    from gpufleet.sim import runner

    monkeypatch.setattr(runner, "Simulation", RecordedSimulation)
    monkeypatch.setattr(RecordedSimulation, "built", [])
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("GPUFLEET_CLIENT_CONFIG", str(tmp_path / "client.toml"))
    monkeypatch.chdir(tmp_path)
    argv = ["sim", "--server", "http://127.0.0.1:9", "--nodes", "1"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(app, [*argv, "--state-dir", str(tmp_path / "chosen")])
    assert result.exit_code == 0, result.output
    assert [o.state_dir for o in RecordedSimulation.built] == [
        tmp_path / "state" / "gpufleet" / "sim",
        tmp_path / "chosen",
    ]
    assert not (tmp_path / "gpufleet-sim").exists()
