"""`gpufleet server`'s process layouts refused before anything is bound or migrated."""

from pathlib import Path

import pytest

from gpufleet.api import server
from gpufleet.core.config import load_settings
from gpufleet.core.errors import ConfigError


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"workers": 2}, "needs PostgreSQL"),
        ({"workers": 2, "agent_listen": "127.0.0.1:9"}, "and, with agent_listen, its channel process"),
        ({"agent_listen": "127.0.0.1:8080", "listen": "127.0.0.1:8080"}, "another address than listen"),
    ],
)
def test_a_layout_sqlite_or_one_address_cannot_serve_is_refused(
    tmp_path: Path, options: dict[str, object], says: str
) -> None:
    settings = load_settings(client_file=tmp_path / "none.toml", data_dir=tmp_path / "head", **options)
    with pytest.raises(ConfigError, match=says):
        server.run(settings, announce=False)
    assert not (tmp_path / "head").exists()  # refused before the data directory or database was touched


def test_agent_listen_must_be_an_address(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"agent_listen.*HOST:PORT"):
        load_settings(client_file=tmp_path / "none.toml", agent_listen="8081")
