"""Users and their tokens through the real CLI: roles and scopes decide, revocation is immediate."""

import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import GPUFLEET, Head, base_env, cli_json, run_cli

pytestmark = pytest.mark.e2e


def test_user_lifecycle_and_scoped_tokens(head: Head, tmp_path: Path) -> None:
    created = subprocess.run(
        [
            *GPUFLEET,
            "--server",
            head.url,
            "--token",
            "gfa_e2e-admin-token-0123456789",
            "user",
            "create",
            "alice",
            "--role",
            "operator",
            "--password-stdin",
            "-o",
            "json",
        ],
        input="a long enough passphrase\n",
        env=base_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert created.returncode == 0, created.stderr
    assert "passphrase" not in created.stdout
    assert cli_json(tmp_path, head.url, "user", "show", "alice")["uid"] == 10000

    write = cli_json(tmp_path, head.url, "token", "create", "--user", "alice", "--expires", "30d")["token"]
    read = cli_json(tmp_path, head.url, "token", "create", "--user", "alice", "--scope", "read")["token"]
    assert run_cli(tmp_path, "node", "add", "gpu001", server=head.url, token=write).returncode == 0
    refused = run_cli(tmp_path, "node", "add", "gpu002", server=head.url, token=read)
    assert refused.returncode == 6
    assert "read-only token" in refused.stderr
    assert run_cli(tmp_path, "node", "list", server=head.url, token=read).returncode == 0
    assert run_cli(tmp_path, "user", "list", server=head.url, token=write).returncode == 6  # operators: no users

    assert run_cli(tmp_path, "user", "disable", "alice", server=head.url).returncode == 0
    assert run_cli(tmp_path, "node", "list", server=head.url, token=write).returncode == 5
    assert run_cli(tmp_path, "user", "update", "alice", "--enable", server=head.url).returncode == 0
    tokens = cli_json(tmp_path, head.url, "token", "list")
    mine = [t for t in tokens if t["user"] == "alice"]
    assert [t["scope"] for t in mine] == ["write", "read"]
    assert run_cli(tmp_path, "token", "revoke", str(mine[0]["id"]), server=head.url).returncode == 0
    assert run_cli(tmp_path, "node", "list", server=head.url, token=write).returncode == 5
    assert run_cli(tmp_path, "user", "delete", "alice", server=head.url).returncode == 0
    assert run_cli(tmp_path, "node", "list", server=head.url, token=read).returncode == 5
    actors = {r["actor"] for r in cli_json(tmp_path, head.url, "audit", "list")}
    assert "user:alice" in actors
