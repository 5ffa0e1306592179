"""The CLI against a real head node: output formats, one-line errors, exit codes."""

from pathlib import Path

import pytest

from tests.e2e.conftest import ADMIN, Head, cli_json, run_cli

pytestmark = pytest.mark.e2e


def test_node_commands_round_trip(head: Head, tmp_path: Path) -> None:
    added = run_cli(
        tmp_path, "node", "add", "gpu[001-004]", "--category", "h200", "--label", "rack=r1", server=head.url
    )
    assert added.returncode == 0, added.stderr
    assert "added 4 node(s): gpu[001-004]" in added.stdout
    listed = cli_json(tmp_path, head.url, "node", "list")
    assert [(n["name"], n["state"], n["gpu_count"]) for n in listed] == [(f"gpu00{i}", "new", 0) for i in range(1, 5)]
    shown = cli_json(tmp_path, head.url, "node", "show", "gpu001")
    assert shown["labels"] == {"rack": "r1"}
    assert shown["category"] == "h200"
    cloned = cli_json(tmp_path, head.url, "node", "clone", "gpu001", "gpu[005-006]")
    assert [(n["name"], n["category"]) for n in cloned] == [("gpu005", "h200"), ("gpu006", "h200")]
    dry = run_cli(tmp_path, "node", "remove", "gpu[001-002]", "--dry-run", server=head.url)
    assert "would remove 2 node(s): gpu[001-002]" in dry.stdout
    assert len(cli_json(tmp_path, head.url, "node", "list")) == 6
    removed = run_cli(tmp_path, "node", "remove", "gpu[001-002]", server=head.url)
    assert removed.returncode == 0
    assert [n["name"] for n in cli_json(tmp_path, head.url, "node", "list")] == [f"gpu00{i}" for i in range(3, 7)]
    table = run_cli(tmp_path, "node", "list", server=head.url)
    assert "gpu003" in table.stdout
    assert "State" in table.stdout


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("node", "add", "gpu003"), 4, "already exists: gpu003"),
        (("node", "add", "gpu[1-"), 2, "invalid hostlist"),
        (("node", "show", "nope"), 3, "no such node: nope"),
        (("node", "remove", "nope"), 3, "no such node: nope"),
        (("node", "add", "x", "--label", "nolabel"), 2, "invalid label"),
        (("token", "create", "--expires", "soon"), 2, "invalid duration"),
    ],
)
def test_user_errors_are_one_line_and_change_nothing(
    head: Head, tmp_path: Path, args: tuple[str, ...], code: int, message: str
) -> None:
    assert run_cli(tmp_path, "node", "add", "gpu003", server=head.url).returncode == 0
    result = run_cli(tmp_path, *args, server=head.url)
    assert result.returncode == code, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert [n["name"] for n in cli_json(tmp_path, head.url, "node", "list")] == ["gpu003"]


def test_auth_and_unreachable_errors(head: Head, tmp_path: Path) -> None:
    bad = run_cli(tmp_path, "node", "list", server=head.url, token="gfa_wrong")
    assert bad.returncode == 5
    assert "unknown token" in bad.stderr
    down = run_cli(tmp_path, "node", "list", server="http://127.0.0.1:9")
    assert down.returncode == 7
    assert "cannot reach the head node" in down.stderr
    assert "Traceback" not in down.stderr + bad.stderr


def test_token_create_json_and_config_show_masks(head: Head, tmp_path: Path) -> None:
    created = cli_json(tmp_path, head.url, "token", "create", "--expires", "1h", "--uses", "3")
    assert created["token"].startswith("gfj_")
    assert created["uses"] == 3
    shown = cli_json(tmp_path, head.url, "config", "show")
    assert shown["token"] == "********"
    assert shown["server"] == head.url
    assert "gfa_" not in str(shown)


def test_login_saves_a_private_client_file(head: Head, tmp_path: Path) -> None:
    result = run_cli(tmp_path, "login", "--server", head.url, "--token", "gfa_e2e-admin-token-0123456789", token=None)
    assert result.returncode == 0, result.stderr
    saved = tmp_path / "client.toml"
    assert saved.stat().st_mode & 0o777 == 0o600
    listed = run_cli(tmp_path, "node", "list", "-o", "json", token=None)  # no --server/--token: from the file
    assert listed.returncode == 0, listed.stderr
    failed = run_cli(tmp_path, "login", "--server", head.url, "--token", "gfa_wrong", token=None)
    assert failed.returncode == 5


def test_agent_with_a_bad_join_token_exits_clearly(head: Head, tmp_path: Path) -> None:
    result = run_cli(
        tmp_path,
        "agent",
        "--server",
        head.url,
        "--join-token",
        "gfj_unknown",
        "--name",
        "n1",
        "--state-dir",
        str(tmp_path / "agent"),
        token=None,
    )
    assert result.returncode == 5
    assert "unknown token" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "agent" / "credential.json").exists()


def test_server_start_errors_are_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run_cli(tmp_path, "server", "--data-dir", str(blocker / "sub"), "--listen", "127.0.0.1:1", token=None)
    assert result.returncode == 2
    assert "cannot create the data directory" in result.stderr
    assert "Traceback" not in result.stderr


def test_login_never_sends_a_saved_token_to_another_server(head: Head, tmp_path: Path) -> None:
    assert run_cli(tmp_path, "login", "--server", head.url, "--token", ADMIN, token=None).returncode == 0
    other = run_cli(tmp_path, "login", "--server", "http://127.0.0.1:9", token=None)  # no token given: prompt
    # It asks for a token (and stops, with no input to read) instead of trying the saved one on the new server.
    assert "API token" in other.stdout + other.stderr
    assert "cannot reach" not in other.stderr
    assert other.returncode not in (0, 7)


def test_audit_list_shows_a_scripted_cli_run(head: Head, tmp_path: Path) -> None:
    assert run_cli(tmp_path, "node", "add", "gpu[001-002]", server=head.url).returncode == 0
    assert run_cli(tmp_path, "token", "create", "--expires", "1h", server=head.url).returncode == 0
    assert run_cli(tmp_path, "node", "add", "gpu001", server=head.url).returncode == 4
    records = cli_json(tmp_path, head.url, "audit", "list", "--since", "1h")
    rows = [(r["actor"], r["action"], r["target"], r["result"]) for r in reversed(records)]
    actor = "token:bootstrap#1"
    assert rows == [
        (actor, "nodes.add_nodes", "gpu[001-002]", 201),
        (actor, "tokens.create_join_token", "join token #2 (uses 1, expires in 3600s)", 201),
        (actor, "nodes.add_nodes", "gpu001", 409),
    ]
    assert all(r["source"] == "127.0.0.1" for r in records)
    table = run_cli(tmp_path, "audit", "list", server=head.url)
    assert "3 audit records" in table.stdout
