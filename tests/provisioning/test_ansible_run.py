"""A real playbook run: the CLI uploads it, the head runs it through ansible-runner and ansible-playbook
(ansible-core) against three nodes of a category over Ansible's `local` connection (set per node by
the label `ansible/connection`), one host is made to fail, and each host's result lands in the task
and the request in the audit log. One run (ansible-playbook takes a few seconds to start), on SQLite:
what is tested here is Ansible, not the database. A second run passes its time limit: its hosts
fail, and no process of it is left behind."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from gpufleet.cli.app import app as cli_app
from gpufleet.cli.state import CliState
from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.inventory import categories
from gpufleet.inventory import service as inventory
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.provisioning import ansible
from gpufleet.tasks import service as tasks
from gpufleet.tasks.runner import TaskRunner
from tests.conftest import cli_through, need

pytestmark = pytest.mark.ansible

PLAYBOOK = """\
- name: mark every host, break one
  hosts: all
  gather_facts: false
  tasks:
    - name: first mark
      ansible.builtin.file:
        path: "{{ out }}/{{ inventory_hostname }}.first"
        state: touch
    - name: break one
      ansible.builtin.fail:
        msg: "{{ inventory_hostname }} is broken on purpose"
      when: inventory_hostname == 'node002'
    - name: second mark, with the node's partition from its category and a label
      ansible.builtin.copy:
        dest: "{{ out }}/{{ inventory_hostname }}.second"
        content: "{{ gpufleet_partition }} {{ gpufleet_labels.note }}\\n"
"""


@pytest.fixture(autouse=True)
def local_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    """The nodes here are this machine: their label ansible/connection=local needs the head's consent."""
    monkeypatch.setenv("GPUFLEET_ANSIBLE_LOCAL_CONNECTION", "true")


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    """SQLite only (overrides the conftest's two backends): one real run is enough."""
    return f"sqlite:///{tmp_path / 'gpufleet.db'}"


def test_a_playbook_runs_on_a_category_and_one_failing_host_fails_alone(
    heavy: None,
    client: TestClient,
    sessions: sessionmaker[Session],
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    if not (Path(sys.executable).parent / "ansible-playbook").exists() and shutil.which("ansible-playbook") is None:
        need("ansible", "ansible-playbook is not installed (pip install -e '.[server]' installs ansible-core)")
    local = {
        "ansible/connection": "local",
        "ansible/python-interpreter": sys.executable,
        "note": "{{ 6 * 7 }}",  # must reach the host as text, never rendered by Ansible on the head
    }
    with transaction(sessions) as s:
        categories.create_category(s, clock, "hgx", settings={"partition": "gpu"})
        inventory.add_nodes(s, clock, ["node[001-003]"], NodeSettings(category="hgx", labels=local))
        inventory.add_nodes(s, clock, ["other001"], NodeSettings(category="cpu", labels=local))
    out = tmp_path / "out"
    out.mkdir()
    playbook = tmp_path / "site.yml"
    playbook.write_text(PLAYBOOK)

    cli_through(client, monkeypatch)
    result = CliRunner().invoke(
        cli_app,
        ["ansible", "run", str(playbook), "--category", "hgx", "-e", f"out={out}", "-o", "json"],
        obj=CliState(),
    )
    assert result.exit_code == 1, result.output  # a host failed: so did the task
    task = json.loads(result.stdout)
    assert (task["kind"], task["state"], task["total"], task["done"], task["failed"]) == (
        "ansible.run",
        "failed",
        3,
        3,
        1,
    )
    assert task["summary"] == "site.yml: 2 ok, 1 failed (ansible-playbook exited 2)"
    assert task["params"]["hosts"] == "node[001-003]"
    assert task["params"]["extra_vars"] == ["out"]  # names only: values may be secrets
    targets = {t["target"]: t for t in task["targets"]}
    assert list(targets) == ["node001", "node002", "node003"]
    for name in ("node001", "node003"):
        assert targets[name]["state"] == "ok"
        assert targets[name]["data"] == {
            "ok": 2,
            "changed": 2,
            "failed": 0,
            "unreachable": 0,
            "skipped": 1,
            "rescued": 0,
            "ignored": 0,
        }
        assert targets[name]["started_at"] is not None  # marked running when Ansible reached it
    broken = targets["node002"]
    assert broken["state"] == "failed"
    assert broken["detail"].startswith("task 'break one' failed: node002 is broken on purpose")
    assert (broken["data"]["ok"], broken["data"]["failed"]) == (1, 1)

    # What Ansible did: the failing host stopped at its failure, the others went on, and the node
    # of another category was never touched (the run is limited to the category's hosts).
    assert sorted(p.name for p in out.iterdir()) == [
        "node001.first",
        "node001.second",
        "node002.first",
        "node003.first",
        "node003.second",
    ]
    # hostvars carry the resolved settings, and the labels as they are: a template in one is text
    assert (out / "node001.second").read_text() == "gpu {{ 6 * 7 }}\n"

    records = [r for r in client.get("/api/v1/audit").json() if r["action"] == "ansible.start_run"]
    assert len(records) == 1
    assert records[0]["result"] == 202
    assert records[0]["target"].startswith(f"task {task['id']}: site.yml (sha256 ")
    assert records[0]["target"].endswith("on category hgx node[001-003]")
    stdout = (tmp_path / "ansible" / f"task-{task['id']}" / "artifacts" / "run" / "stdout").read_text()
    assert "PLAY RECAP" in stdout  # the run's full output is kept with it on the head


def _sleeping(marker: str) -> list[int]:
    """Processes whose command line is `marker` (its arguments separated by NULs in /proc)."""
    argv = marker.replace(" ", "\0").encode() + b"\0"
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes() == argv:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_a_run_past_its_time_limit_fails_its_hosts_and_leaves_no_process_behind(
    heavy: None, sessions: sessionmaker[Session], clock: FakeClock, tmp_path: Path
) -> None:
    if not (Path(sys.executable).parent / "ansible-playbook").exists() and shutil.which("ansible-playbook") is None:
        need("ansible", "ansible-playbook is not installed (pip install -e '.[server]' installs ansible-core)")
    marker = f"sleep {600 + os.getpid() % 300}"  # this worker's own, so no other test's sleep is counted
    local = {"ansible/connection": "local", "ansible/python-interpreter": sys.executable}
    playbook = f"- hosts: all\n  gather_facts: false\n  tasks:\n    - ansible.builtin.command: {marker}\n"
    with transaction(sessions) as s:
        inventory.add_nodes(s, clock, ["node[001-002]"], NodeSettings(labels=local))
        plan = ansible.plan_run(s, ansible.RunRequest(playbook, nodes="node[001-002]"), allow_local=True)
        task_id = ansible.create_run(s, clock, plan, created_by="test").id
    runner = TaskRunner(sessions, clock)
    settings = ansible.RunnerSettings(tmp_path / "runs", timeout_s=5, task_timeout_s=0, forks=5)
    runner.start(task_id, ansible.work(plan, settings))
    seen = False
    deadline = time.monotonic() + 30
    while task_id in runner.running() and time.monotonic() < deadline:
        seen = seen or bool(_sleeping(marker))
        time.sleep(0.2)
    runner.wait(task_id, 30)
    assert seen, "the playbook's command never started: the machine is far too slow for this test"
    assert _sleeping(marker) == []  # Ansible's workers start sessions of their own: killed all the same
    with transaction(sessions, readonly=True) as s:
        task = tasks.get(s, task_id)
        assert (task.state, task.failed, task.summary) == ("failed", 2, "playbook.yml: 0 ok, 2 failed (timed out)")
        assert {t.detail for t in task.targets} == {"the run passed its time limit (5 s)"}
    assert oct((tmp_path / "runs" / f"task-{task_id}").stat().st_mode & 0o777) == "0o700"
