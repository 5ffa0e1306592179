"""The node-check settings: read from TOML and the environment, and refused when they could not name a check."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.core.config import load_settings
from gpufleet.core.errors import ConfigError


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in ("GPUFLEET_CONFIG", "GPUFLEET_REQUIRED_SERVICES", "GPUFLEET_REQUIRED_MOUNTS", "GPUFLEET_CHECKS_DIR"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("GPUFLEET_CLIENT_CONFIG", str(tmp_path / "client.toml"))


def test_defaults() -> None:
    settings = load_settings()

    assert settings.checks_dir == Path("/etc/gpufleet/checks.d")
    assert (settings.checks_interval_s, settings.checks_timeout_s) == (60.0, 10.0)
    assert (settings.required_services, settings.required_mounts) == ([], [])


def test_from_a_toml_table_and_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "gpufleet.toml"
    config.write_text(
        '[checks]\ndir = "/opt/nhc/checks"\ninterval_s = 300\ntimeout_s = 30\n\n'
        '[required]\nservices = ["sshd", "munge.service", "sshd"]\nmounts = ["/home", "//scratch/fast/"]\n'
    )

    settings = load_settings(config)

    assert settings.checks_dir == Path("/opt/nhc/checks")
    assert (settings.checks_interval_s, settings.checks_timeout_s) == (300.0, 30.0)
    assert settings.required_services == ["sshd", "munge.service"]
    assert settings.required_mounts == ["/home", "/scratch/fast"]
    monkeypatch.setenv("GPUFLEET_REQUIRED_SERVICES", '["slurmd"]')
    assert load_settings(config).required_services == ["slurmd"]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("required_services", ["-H evil"]),
        ("required_services", ["a b"]),
        ("required_mounts", ["home"]),
        ("required_mounts", ["/scratch space"]),
        ("checks_dir", Path("checks.d")),
        ("checks_timeout_s", 0),
    ],
)
def test_values_that_cannot_name_a_check_are_refused(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=key):
        load_settings(**{key: value})
