from pathlib import Path

import pytest

from gpufleet.core.config import load_settings, write_client_file
from gpufleet.core.errors import ConfigError


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in ("GPUFLEET_CONFIG", "GPUFLEET_SERVER", "GPUFLEET_TOKEN", "GPUFLEET_DATABASE_URL", "GPUFLEET_LISTEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("GPUFLEET_CLIENT_CONFIG", str(tmp_path / "client.toml"))


def test_precedence_defaults_file_env_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "gpufleet.toml"
    config.write_text('listen = "0.0.0.0:9000"\nheartbeat_interval_s = 2.0\nserver = "http://file:1"\n')
    settings = load_settings(config)
    assert settings.listen == "0.0.0.0:9000"
    assert settings.heartbeat_interval_s == 2.0
    monkeypatch.setenv("GPUFLEET_SERVER", "http://env:2")
    assert load_settings(config).server == "http://env:2"
    assert load_settings(config, server="http://option:3").server == "http://option:3"


def test_default_database_is_sqlite_under_data_dir(tmp_path: Path) -> None:
    settings = load_settings(data_dir=tmp_path)
    assert settings.effective_database_url == f"sqlite:///{tmp_path / 'gpufleet.db'}"


def test_shown_masks_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_DATABASE_URL", "postgresql+psycopg://fleet:hunter2@db:5432/fleet")
    shown = load_settings(token="gfa_secret_value", bootstrap_token="x" * 20).shown()
    text = repr(shown)
    assert "hunter2" not in text
    assert "gfa_secret_value" not in text
    assert shown["database_url"] == "postgresql+psycopg://fleet:********@db:5432/fleet"
    assert shown["token"] == "********"


def test_client_file_is_read_and_private(tmp_path: Path) -> None:
    path = tmp_path / "client.toml"
    write_client_file(path, "http://head:8080", 'tok"en')
    assert path.stat().st_mode & 0o777 == 0o600
    settings = load_settings()
    assert settings.server == "http://head:8080"
    assert settings.token is not None
    assert settings.token.get_secret_value() == 'tok"en'


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('listen = "nocolon"', "invalid setting listen"),
        ("heartbeat_interval_s = -1", "invalid setting heartbeat_interval_s"),
        ('no_such_key = "x"', "invalid setting no_such_key"),
        ("listen = [", "not valid TOML"),
    ],
)
def test_bad_config_is_one_clear_error(tmp_path: Path, content: str, message: str) -> None:
    config = tmp_path / "gpufleet.toml"
    config.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_settings(config)


def test_missing_explicit_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.toml")


def test_a_toml_table_is_a_prefix(tmp_path: Path) -> None:
    config = tmp_path / "gpufleet.toml"
    config.write_text('[accounts]\nsync = true\ninterval_s = 30\n\n[tls]\ncert = "/etc/c.pem"\nkey = "/etc/k.pem"\n')
    settings = load_settings(config)
    assert settings.accounts_sync is True
    assert settings.accounts_interval_s == 30
    assert settings.tls_cert == Path("/etc/c.pem")
    config.write_text("[accounts]\nsynk = true\n")
    with pytest.raises(ConfigError, match="accounts_synk"):
        load_settings(config)


def test_tls_needs_both_certificate_and_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="both tls_cert and tls_key"):
        load_settings(data_dir=tmp_path, tls_cert=tmp_path / "c.pem").effective_tls()
    assert load_settings(data_dir=tmp_path).effective_tls() is None


def test_every_setting_is_documented() -> None:
    from gpufleet.core.config import Settings

    page = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    missing = [name for name in Settings.model_fields if f"| `{name}` |" not in page]
    assert missing == []
