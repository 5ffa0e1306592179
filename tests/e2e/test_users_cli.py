"""Users and their tokens through the real CLI: roles and scopes decide, revocation is immediate."""

from pathlib import Path

import pytest

from tests.e2e.conftest import Head, cli_json, run_cli

pytestmark = pytest.mark.e2e


def test_user_lifecycle_and_scoped_tokens(head: Head, tmp_path: Path) -> None:
    created = run_cli(
        tmp_path,
        *("user", "create", "alice", "--role", "operator", "--password-stdin", "-o", "json"),
        server=head.url,
        stdin="a long enough passphrase\n",
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


def test_project_commands(head: Head, tmp_path: Path) -> None:
    assert run_cli(tmp_path, "user", "create", "bob", "--no-password", server=head.url).returncode == 0
    assert (
        run_cli(tmp_path, "project", "create", "vision", "--description", "image models", server=head.url).returncode
        == 0
    )
    assert run_cli(tmp_path, "project", "add-member", "vision", "bob", server=head.url).returncode == 0
    shown = cli_json(tmp_path, head.url, "project", "set-quota", "vision", "--max-gpus", "16", "--gpu-hours", "5000")
    assert (shown["members"], shown["max_gpus"], shown["gpu_hours_budget"]) == (["bob"], 16, 5000.0)
    lifted = cli_json(tmp_path, head.url, "project", "set-quota", "vision", "--gpu-hours", "none")
    assert (lifted["max_gpus"], lifted["gpu_hours_budget"]) == (16, None)
    bad = run_cli(tmp_path, "project", "set-quota", "vision", "--max-gpus", "-3", server=head.url)
    assert bad.returncode == 2
    assert cli_json(tmp_path, head.url, "project", "list")[0]["max_gpus"] == 16


def test_login_with_a_password_saves_a_user_token_not_the_password(head: Head, tmp_path: Path) -> None:
    cli_json(tmp_path, head.url, "user", "create", "carol", "--role", "viewer", "--no-password")
    passphrase = "her long secret passphrase"
    changed = run_cli(tmp_path, "user", "update", "carol", "--password-stdin", server=head.url, stdin=passphrase + "\n")
    assert changed.returncode == 0, changed.stderr
    wrong = {"GPUFLEET_PASSWORD": "wrong passphrase!!"}
    refused = run_cli(tmp_path, "login", "--server", head.url, "--user", "carol", token=None, env=wrong)
    assert refused.returncode == 5
    assert "unknown user name or wrong password" in refused.stderr
    logged_in = run_cli(
        tmp_path,
        *("login", "--server", head.url, "--user", "carol", "--expires", "1d"),
        token=None,
        env={"GPUFLEET_PASSWORD": passphrase},
    )
    assert logged_in.returncode == 0, logged_in.stderr
    assert "as user carol" in logged_in.stdout
    saved = (tmp_path / "client.toml").read_text()
    assert "gfa_" in saved
    assert passphrase not in saved
    listed = run_cli(tmp_path, "node", "list", "-o", "json", token=None)  # uses the saved token
    assert listed.returncode == 0, listed.stderr
    denied = run_cli(tmp_path, "node", "add", "x1", token=None)
    assert denied.returncode == 6  # a viewer


def test_audit_names_the_user_behind_a_scripted_cli_run(head: Head, tmp_path: Path) -> None:
    """The issue's must-show: node additions and token creations, with the acting user."""
    created = run_cli(
        tmp_path,
        *("user", "create", "olivia", "--role", "operator", "--password-stdin"),
        server=head.url,
        stdin="operators passphrase\n",
    )
    assert created.returncode == 0, created.stderr
    as_olivia = tmp_path / "olivia"
    as_olivia.mkdir()
    password = {"GPUFLEET_PASSWORD": "operators passphrase"}
    login = run_cli(as_olivia, "login", "--server", head.url, "--user", "olivia", token=None, env=password)
    assert login.returncode == 0, login.stderr
    assert run_cli(as_olivia, "node", "add", "gpu[001-004]", token=None).returncode == 0
    assert run_cli(as_olivia, "token", "create", "--uses", "4", token=None).returncode == 0
    assert run_cli(as_olivia, "user", "create", "mallory", "--no-password", token=None).returncode == 6
    records = cli_json(tmp_path, head.url, "audit", "list", "--actor", "user:olivia")
    rows = [(r["action"], r["target"], r["result"]) for r in reversed(records)]
    assert rows == [
        ("tokens.password_login", "user olivia", 201),
        ("nodes.add_nodes", "gpu[001-004]", 201),
        ("tokens.create_join_token", rows[2][1], 201),
        ("users.create_user", "/api/v1/users", 403),
    ]
    assert rows[2][1].startswith("join token #")
    assert "uses 4" in rows[2][1]
