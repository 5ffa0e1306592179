from pathlib import Path

import pytest

from gpufleet.agent.credentials import Credential, CredentialStore
from gpufleet.core.errors import ConfigError


def test_round_trip_private_and_atomic(tmp_path: Path) -> None:
    store = CredentialStore(tmp_path / "state" / "credential.json")
    assert store.load() is None
    credential = Credential(server="http://h:8080", node="n1", node_id=3, token="gfn_x", heartbeat_interval_s=2.0)
    store.save(credential)
    assert store.load() == credential
    assert store.path.stat().st_mode & 0o777 == 0o600
    assert not list(store.path.parent.glob("*.tmp"))
    store.clear()
    assert store.load() is None


def test_corrupt_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "credential.json"
    path.write_text('{"server": "x"')
    with pytest.raises(ConfigError, match="corrupt credential file"):
        CredentialStore(path).load()
