"""Ansible without running it: the dynamic inventory's shape (groups per category and state, host
variables, names Ansible accepts), the checks a run passes before anything is recorded, how a run's
outcome becomes each host's result, and the CLI's inventory and --dry-run. The real run through
ansible-runner is in test_ansible_run.py."""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from gpufleet.cli.app import app as cli_app
from gpufleet.cli.state import CliState
from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.core.errors import InvalidInput, NotFound
from gpufleet.inventory import categories
from gpufleet.inventory import service as inventory
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.inventory.states import NodeState
from gpufleet.provisioning import ansible, networks
from gpufleet.provisioning.networks import NetworkSpec
from tests.conftest import cli_through

PLAYBOOK = "- hosts: all\n  gather_facts: false\n  tasks:\n    - ansible.builtin.ping:\n"


def _cluster(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    """node001-003 in hgx-h200 (booting on `internal`), node004 in a.b, node005 in a-b, node006 in none."""
    with transaction(sessions) as s:
        categories.create_category(s, clock, "hgx-h200", settings={"partition": "gpu", "expected_gpus": 8})
        nodes = inventory.add_nodes(
            s, clock, ["node[001-003]"], NodeSettings(category="hgx-h200", labels={"ansible/connection": "local"})
        )
        inventory.add_nodes(s, clock, ["node004"], NodeSettings(category="a.b"))
        labels = {"rack": "r1", "note": "{{ lookup('pipe', 'id') }}"}
        inventory.add_nodes(s, clock, ["node005"], NodeSettings(category="a-b", labels=labels))
        risky = {
            "ansible/python-interpreter": "/usr/bin/py",
            "ansible/user": "root",
            "ansible/ssh-common-args": "-o ProxyCommand=touch /tmp/pwned",  # never read from a label
            "ansible/port": "22; id",  # not a port
        }
        inventory.add_nodes(s, clock, ["node006"], NodeSettings(labels=risky))
        networks.create_network(s, NetworkSpec("ipmi", "10.142.0.0/24"))
        networks.create_network(s, NetworkSpec("internal", "10.141.0.0/24", boot_server="10.141.0.1"))
        networks.assign(s, nodes, networks.get_network(s, "ipmi"))
        networks.assign(s, nodes, networks.get_network(s, "internal"))
        node2 = inventory.get_node(s, "node002")
        categories.update_node_settings(s, node2, set_={"partition": "debug"})
        inventory.transition(s, clock, node2.id, NodeState.NEW, NodeState.UP, "test")
        inventory.get_node(s, "node004").hostname = "node004.cluster.local"


def test_the_inventory_has_groups_per_category_and_state_and_every_host_s_variables(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    _cluster(sessions, clock)
    with transaction(sessions, readonly=True) as s:
        script = ansible.build_inventory(s, allow_local=True)
        strict = ansible.build_inventory(s)
    suffix = {name: ansible._groups("category", ["a.b", "a-b"])[name] for name in ("a.b", "a-b")}
    assert suffix["a.b"] != suffix["a-b"]  # the same once cleaned: told apart, never merged
    assert all(g.startswith("category_a_b_") for g in suffix.values())
    assert script["category_hgx_h200"] == {"hosts": ["node001", "node002", "node003"]}
    assert script[suffix["a.b"]] == {"hosts": ["node004"]}
    assert script[suffix["a-b"]] == {"hosts": ["node005"]}
    assert script["state_new"] == {"hosts": ["node001", "node003", "node004", "node005", "node006"]}
    assert script["state_up"] == {"hosts": ["node002"]}
    assert script["all"]["hosts"] == [f"node00{i}" for i in range(1, 7)]
    assert sorted(script["all"]["children"]) == sorted(k for k in script if k not in ("all", "_meta"))
    assert all(k.isidentifier() for k in script if k != "_meta")  # Ansible's rule for group names

    hostvars = script["_meta"]["hostvars"]
    assert set(hostvars) == set(script["all"]["hosts"])  # _meta present: Ansible never asks --host
    one, two = hostvars["node001"], hostvars["node002"]
    assert one["ansible_host"] == "10.141.0.2"  # the booting network's address, not the ipmi one
    assert one["ansible_connection"] == "local"  # from the label ansible/connection
    # Operators set labels and playbooks run with the head's keys: only some variables come from one,
    # a local connection (on the head) only with the head's ansible_local_connection setting.
    assert "ansible_connection" not in strict["_meta"]["hostvars"]["node001"]
    six = {k: v for k, v in hostvars["node006"].items() if k.startswith("ansible_")}
    assert six == {"ansible_python_interpreter": "/usr/bin/py", "ansible_user": "root"}
    assert (one["gpufleet_category"], one["gpufleet_state"]) == ("hgx-h200", "new")
    assert (one["gpufleet_partition"], one["gpufleet_expected_gpus"]) == ("gpu", 8)  # from the category
    assert (two["gpufleet_partition"], two["gpufleet_state"]) == ("debug", "up")  # the node's own value wins
    assert one["gpufleet_software_image"] is None  # defaults too
    assert hostvars["node004"]["ansible_host"] == "node004.cluster.local"  # no address: the hostname
    assert "ansible_host" not in hostvars["node005"]  # neither: Ansible uses the inventory name
    # a template in a label stays text: Ansible would otherwise run it on the head
    assert hostvars["node005"]["gpufleet_labels"] == {
        "rack": "r1",
        "note": {"__ansible_unsafe": "{{ lookup('pipe', 'id') }}"},
    }
    assert hostvars["node006"]["ansible_python_interpreter"] == "/usr/bin/py"
    assert hostvars["node006"]["gpufleet_category"] is None

    static = ansible.static_inventory(script)  # what the run writes for ansible-playbook
    assert static["all"]["hosts"]["node001"] == one
    assert static["all"]["children"]["category_hgx_h200"] == {"hosts": {f"node00{i}": {} for i in (1, 2, 3)}}
    assert ansible.host_of(script, "node002") == two
    with pytest.raises(NotFound):
        ansible.host_of(script, "nope")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- hosts: all\n  tasks: [\n", "not valid YAML"),
        ("hosts: all\n", "a YAML list of plays"),
        ("[]\n", "a YAML list of plays"),
        ("", "a YAML list of plays"),
        ("- just a string\n", "play 1 is not a mapping"),
        ("- hosts: all\n- tasks: []\n", "play 2 names no hosts"),
        ("- import_playbook: other.yml\n", "imports another playbook"),
        ("- hosts: all\n  vars: {x: '" + "a" * ansible.PLAYBOOK_MAX_BYTES + "'}\n", "larger than 1024 KiB"),
    ],
)
def test_a_playbook_that_is_not_one_file_of_plays_is_refused(text: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        ansible.check_playbook(text)


def test_ansible_s_own_tags_are_accepted() -> None:
    vaulted = (
        "- hosts: all\n  vars:\n    secret: !vault |\n      $ANSIBLE_VAULT;1.1;AES256\n      6162\n"
        "    x: !unsafe '{{'\n"
    )
    assert ansible.check_playbook(vaulted + "- hosts: category_hgx\n  roles: [common]\n") == 2


def test_a_run_names_real_hosts_or_is_refused(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    _cluster(sessions, clock)
    with transaction(sessions) as s:
        categories.create_category(s, clock, "empty")
    cases: list[tuple[ansible.RunRequest, type[Exception], str]] = [
        (ansible.RunRequest(PLAYBOOK, category="empty"), InvalidInput, "category empty has no nodes"),
        (ansible.RunRequest(PLAYBOOK, category="nope"), NotFound, "no such category"),
        (ansible.RunRequest(PLAYBOOK, nodes="node[001-009]"), NotFound, "no such node: node\\[007-009\\]"),
        (ansible.RunRequest(PLAYBOOK), InvalidInput, "exactly one of"),
        (ansible.RunRequest(PLAYBOOK, category="a.b", nodes="node001"), InvalidInput, "exactly one of"),
        (ansible.RunRequest(PLAYBOOK, name="../site.yml", nodes="node001"), InvalidInput, "playbook's name"),
        (ansible.RunRequest(PLAYBOOK, nodes="node001", extra_vars={"a-b": 1}), InvalidInput, "extra variable"),
        (ansible.RunRequest("- tasks: []\n", nodes="node001"), InvalidInput, "names no hosts"),
    ]
    with transaction(sessions, readonly=True) as s:
        for request, error, message in cases:
            with pytest.raises(error, match=message):
                ansible.plan_run(s, request)
        plan = ansible.plan_run(s, ansible.RunRequest(PLAYBOOK, "site.yml", category="hgx-h200", check=True))
    assert plan.hosts == ["node001", "node002", "node003"]
    argv = ["ansible-playbook", "-i", "D/inventory/hosts.json", "--limit", "@D/limit", "--check", "site.yml"]
    assert plan.argv("D") == argv
    assert plan.params()["hosts"] == "node[001-003]"


@dataclass
class _Recorder:
    """A TaskContext stand-in that keeps what a run recorded."""

    results: dict[str, tuple[str, str, dict[str, Any] | None]] = field(default_factory=dict)

    def finished(self, target: str, ok: bool, detail: str = "", data: dict[str, Any] | None = None) -> None:
        self.results[target] = ("ok" if ok else "failed", detail, data)

    def skipped(self, target: str, detail: str) -> None:
        self.results[target] = ("skipped", detail, None)


def _plan(hosts: list[str]) -> ansible.RunPlan:
    return ansible.RunPlan(ansible.RunRequest(PLAYBOOK, "site.yml", nodes="x"), hosts, 1, "0" * 64, {})


def test_each_host_s_result_comes_from_the_recap_and_its_first_failure() -> None:
    stats = {
        "ok": {"a": 3, "b": 1},
        "changed": {"a": 1},
        "failures": {"b": 1},
        "dark": {"c": 1},
        "skipped": {"a": 1},
        "processed": {"a": 1, "b": 1, "c": 1},
    }
    failures = {"b": "task 'fail' failed: boom", "c": "unreachable: ssh: connect refused"}
    ctx = _Recorder()
    summary = ansible.record(ctx, _plan(["a", "b", "c", "d"]), "failed", 2, stats, failures, "", 60)  # type: ignore[arg-type]
    assert ctx.results["a"] == (
        "ok",
        "ok=3, changed=1, failed=0, unreachable=0, skipped=1",
        {"ok": 3, "changed": 1, "failed": 0, "unreachable": 0, "skipped": 1, "rescued": 0, "ignored": 0},
    )
    assert ctx.results["b"][:2] == (
        "failed",
        "task 'fail' failed: boom (ok=1, changed=0, failed=1, unreachable=0, skipped=0)",
    )
    assert ctx.results["c"][0] == "failed"
    assert ctx.results["c"][2] == {
        "ok": 0,
        "changed": 0,
        "failed": 0,
        "unreachable": 1,
        "skipped": 0,
        "rescued": 0,
        "ignored": 0,
    }
    assert ctx.results["d"] == ("skipped", "no play of the playbook matched this host", None)
    assert summary == "site.yml: 1 ok, 2 failed, 1 skipped (ansible-playbook exited 2)"


def test_a_run_that_stops_early_or_times_out_fails_the_hosts_it_did_not_finish() -> None:
    ctx = _Recorder()
    stdout = "ERROR! couldn't resolve module/action 'nosuch.module'\n\nThe error appears to be in 'site.yml'\n"
    summary = ansible.record(ctx, _plan(["a", "b"]), "failed", 4, None, {}, stdout, 60)  # type: ignore[arg-type]
    assert {h: r[0] for h, r in ctx.results.items()} == {"a": "failed", "b": "failed"}
    assert "couldn't resolve module/action 'nosuch.module'" in ctx.results["a"][1]
    assert summary == "site.yml: 0 ok, 2 failed (ansible-playbook exited 4)"

    ctx = _Recorder()
    summary = ansible.record(ctx, _plan(["a", "b"]), "timeout", 254, None, {"a": "task 'x' failed: no"}, "", 30)  # type: ignore[arg-type]
    assert ctx.results["a"][:2] == (
        "failed",
        "task 'x' failed: no (ok=0, changed=0, failed=1, unreachable=0, skipped=0)",
    )
    assert ctx.results["b"][:2] == ("failed", "the run passed its time limit (30 s)")
    assert summary.endswith("(timed out)")


@pytest.mark.one_database  # the refusals themselves run on both above
def test_bad_requests_change_nothing_and_are_audited(
    client: TestClient,
    sessions: sessionmaker[Session],
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    _cluster(sessions, clock)
    bad = [
        ({"playbook": "- hosts: [", "category": "hgx-h200"}, 400, "not valid YAML"),
        ({"playbook": PLAYBOOK, "category": "nope"}, 404, "no such category"),
        ({"playbook": PLAYBOOK, "nodes": "node[001-002],ghost"}, 404, "no such node: ghost"),
        ({"playbook": PLAYBOOK}, 400, "exactly one of"),
        ({"playbook": PLAYBOOK, "category": "a.b", "shell": "rm -rf /"}, 422, "shell"),
    ]
    for body, status, message in bad:
        answer = client.post("/api/v1/ansible/runs", json=body)
        assert answer.status_code == status, answer.text
        assert message in answer.text
    assert client.get("/api/v1/tasks").json() == []  # nothing was recorded, nothing started
    records = [r for r in client.get("/api/v1/audit").json() if r["action"] == "ansible.start_run"]
    assert sorted(r["result"] for r in records) == [400, 400, 404, 404, 422]
    big = client.post("/api/v1/ansible/runs", json={"playbook": "#" * (ansible.PLAYBOOK_MAX_BYTES + 1), "nodes": "n"})
    assert big.status_code == 400
    assert "larger than 1024 KiB" in big.text  # past the 64 KiB request limit, for this route only

    # A head without Ansible says so, and records no task it could never run.
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.setattr(shutil, "which", lambda *_a, **_k: None)
    missing = client.post("/api/v1/ansible/runs", json={"playbook": PLAYBOOK, "category": "hgx-h200"})
    assert missing.status_code == 503
    assert "Ansible is not installed on the head" in missing.text
    assert client.get("/api/v1/tasks").json() == []


@pytest.mark.one_database  # the CLI over the API: one backend is enough
def test_the_cli_prints_the_inventory_for_ansible_and_a_dry_run_starts_nothing(
    client: TestClient,
    sessions: sessionmaker[Session],
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    _cluster(sessions, clock)
    cli_through(client, monkeypatch)
    listed = CliRunner().invoke(cli_app, ["ansible", "inventory", "--list"], obj=CliState())
    assert listed.exit_code == 0, listed.output
    script = json.loads(listed.stdout)
    assert script["category_hgx_h200"]["hosts"] == ["node001", "node002", "node003"]
    host = CliRunner().invoke(cli_app, ["ansible", "inventory", "--host", "node001"], obj=CliState())
    assert json.loads(host.stdout) == script["_meta"]["hostvars"]["node001"]
    people = CliRunner().invoke(cli_app, ["ansible", "inventory"], obj=CliState())
    assert people.exit_code == 0, people.output
    assert "category_hgx_h200" in people.stdout
    assert "10.141.0.2" in people.stdout

    playbook = tmp_path / "site.yml"
    playbook.write_text(PLAYBOOK)
    dry = CliRunner().invoke(
        cli_app,
        ["ansible", "run", str(playbook), "--category", "hgx-h200", "-e", "out=/tmp/x", "--dry-run"],
        obj=CliState(),
    )
    assert dry.exit_code == 0, dry.output
    assert "node[001-003]" in dry.stdout
    assert "ansible-playbook -i PRIVATE_DATA_DIR/inventory/hosts.json --limit @PRIVATE_DATA_DIR/limit" in dry.stdout
    assert "dry run: nothing was started" in dry.stdout
    as_json = CliRunner().invoke(
        cli_app, ["ansible", "run", str(playbook), "--nodes", "node00[4-5]", "--dry-run", "-o", "json"], obj=CliState()
    )
    assert json.loads(as_json.stdout)["hosts"] == ["node004", "node005"]
    assert client.get("/api/v1/tasks").json() == []
    both = CliRunner().invoke(cli_app, ["ansible", "run", str(playbook)], obj=CliState())
    assert isinstance(both.exception, InvalidInput)  # the console script prints it as one line, exit 2
    assert "exactly one of --category and --nodes" in str(both.exception)
