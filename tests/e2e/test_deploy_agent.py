"""The agent rollout end to end: `gpufleet node deploy-agent` against a real head, which runs Ansible
(ansible-runner, ansible-playbook, ssh) to two private sshds standing in for nodes
(scripts/services/ssh-targets.sh: 127.0.0.1 and 127.0.0.2, a port each) and one node where nothing
listens. The agent is the zipapp `make dist` builds (scripts/dist.sh, once per session), installed under
a root directory per node (`--root DIR/{node}`) and started detached (no systemd here). Both agents join
the head with the join token minted for the rollout and are up; the third node fails alone, with
ssh's reason; the settings files keep no join token."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from gpufleet.deploy import units
from tests.conftest import ROOT
from tests.e2e.conftest import ADMIN, GPUFLEET, Head, base_env, wait_for
from tests.services import install_tools, need

pytestmark = [pytest.mark.e2e, pytest.mark.ansible]
SCRIPT = ROOT / "scripts" / "services" / "ssh-targets.sh"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
# The Python the zipapp is built for (its compiled dependencies are this minor version's), as the node runs it
NODE_PYTHON = str(getattr(sys, "_base_executable", sys.executable))


@dataclass(frozen=True)
class Targets:
    """The private sshds: (address, port) each, one client key and known_hosts for them all."""

    hosts: list[tuple[str, int]]
    key: Path
    known_hosts: Path
    user: str


@pytest.fixture(scope="session")
def zipapp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The agent's zipapp, built from this tree as `make dist` builds it."""
    vendor = ROOT / "src" / "gpufleet" / "web" / "static" / "vendor"
    if not (vendor / "htmx.min.js").exists():
        need("make dist", "the dashboard's assets are missing (make assets): scripts/dist.sh refuses to build")
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "dist.sh"), str(out)],
        env=os.environ | {"PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    path = out / units.zipapp_name(VERSION)
    if done.returncode != 0 or not path.exists():
        need("make dist", f"scripts/dist.sh failed: {(done.stderr or done.stdout).strip()[-500:]}")
    return path


@pytest.fixture
def targets(worker_id: str) -> Iterator[Targets]:
    install_tools(("ssh", "sshd", "ssh-keygen"), "ssh-targets.sh")
    index = int(worker_id.removeprefix("gw")) if worker_id.startswith("gw") else 0
    env = os.environ | {
        "GPUFLEET_SSH_TARGETS_STATE": f"/tmp/gpufleet-test-ssh-targets-{worker_id}",
        "GPUFLEET_SSH_TARGETS_PORT": str(12622 + 10 * index),
        "GPUFLEET_SSH_TARGETS": "2",
    }
    done = subprocess.run(
        ["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=120, env=env, check=False
    )
    if done.returncode != 0:
        need("sshd", f"the private sshds did not start: {(done.stderr or done.stdout).strip()[-300:]}")
    *lines, last = done.stdout.strip().splitlines()
    key, known_hosts, user = last.split()
    hosts = [(address, int(port)) for address, port in (line.split() for line in lines)]
    yield Targets(hosts, Path(key), Path(known_hosts), user)
    subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, timeout=60, env=env, check=False)


def _ansible_env(tmp: Path, control: Path, targets: Targets) -> dict[str, str]:
    """How the head's Ansible reaches the targets: their client key and known hosts (checked strictly),
    one connection per host kept open for the run (`control`: a short path, for the socket's name), and
    nothing of the developer's ~/.ansible or ~/.ssh."""
    ssh_args = (
        f"-o UserKnownHostsFile={targets.known_hosts} -o IdentitiesOnly=yes -o ControlMaster=auto -o ControlPersist=20s"
    )
    return {
        "ANSIBLE_PRIVATE_KEY_FILE": str(targets.key),
        "ANSIBLE_SSH_ARGS": ssh_args,
        "ANSIBLE_SSH_CONTROL_PATH_DIR": str(control),
        "ANSIBLE_PIPELINING": "True",
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_HOME": str(tmp / "ansible-home"),
    }


def _ctl(spec: Path, command: str) -> subprocess.CompletedProcess[str]:
    """The node's control program, as it was copied there."""
    ctl = spec.parents[2] / "usr" / "local" / "lib" / "gpufleet" / "gpufleet-agent-ctl.py"
    return subprocess.run(
        [NODE_PYTHON, str(ctl), str(spec), command], capture_output=True, text=True, timeout=60, check=False
    )


def test_deploy_agent_to_two_nodes_and_one_unreachable(
    heavy: None, tmp_path: Path, zipapp: Path, targets: Targets
) -> None:
    control = Path(tempfile.mkdtemp(prefix="gf-ssh-", dir="/tmp"))
    head = Head(tmp_path, env=_ansible_env(tmp_path, control, targets))
    (tmp_path / "head" / "agent").mkdir(parents=True)
    (tmp_path / "head" / "agent" / zipapp.name).write_bytes(zipapp.read_bytes())  # where the head looks first
    head.start()
    nodes_root = tmp_path / "nodes"
    try:
        # Three nodes the head knows, on a network whose addresses are this machine's loopback: tgt1 and
        # tgt2 where the sshds listen (the port from the label Ansible reads), tgt3 where nothing does.
        network = {"name": "lo", "cidr": "127.0.0.0/29", "range_start": "127.0.0.1", "range_end": "127.0.0.3"}
        head.api("POST", "/api/v1/networks", json=network)
        ports = [port for _, port in targets.hosts] + [targets.hosts[-1][1] + 1]
        for i, port in enumerate(ports, start=1):
            labels = {"ansible/port": str(port), "ansible/python-interpreter": NODE_PYTHON}
            node = {"names": [f"tgt{i}"], "network": "lo", "labels": labels}
            head.api("POST", "/api/v1/nodes", json=node)
        hosts = head.api("GET", "/api/v1/ansible/inventory")["_meta"]["hostvars"]
        assert [hosts[f"tgt{i}"]["ansible_host"] for i in (1, 2, 3)] == ["127.0.0.1", "127.0.0.2", "127.0.0.3"]

        args = [
            *GPUFLEET, "--server", head.url, "--token", ADMIN,
            "node", "deploy-agent", "tgt[1-3]", "--ssh-user", targets.user, "--start", "detached",
            "--root", f"{nodes_root}/{{node}}", "--python", NODE_PYTHON, "--wait", "90",
        ]  # fmt: skip
        dry = subprocess.run(
            [*args, "--dry-run"], env=base_env(tmp_path), capture_output=True, text=True, timeout=60, check=False
        )
        assert dry.returncode == 0, dry.stderr
        assert "hosts: tgt[1-3] (3)" in dry.stdout
        assert "--name tgt1" in dry.stdout
        assert "dry run: nothing was started, no join token was made" in dry.stdout
        assert not nodes_root.exists()

        done = subprocess.run(
            [*args, "-o", "json"], env=base_env(tmp_path), capture_output=True, text=True, timeout=240, check=False
        )
        assert done.returncode == 1, done.stderr  # one node failed: so does the command
        task = json.loads(done.stdout)
        details = [(t["target"], t["state"], t["detail"]) for t in task["targets"]]
        assert (task["kind"], task["state"], task["total"], task["failed"]) == ("agent.deploy", "failed", 3, 1), details
        assert task["params"]["start"] == "detached"
        assert task["params"]["join_token"].endswith("(minted: 3 uses, 3600 s)")
        results = {t["target"]: t for t in task["targets"]}
        for name in ("tgt1", "tgt2"):
            assert results[name]["state"] == "ok", results[name]
        broken = results["tgt3"]
        assert broken["state"] == "failed"
        assert broken["detail"].startswith("unreachable: "), broken
        assert "Connection refused" in broken["detail"], broken
        assert broken["data"]["unreachable"] == 1

        # Both agents joined and are up; the unreachable node is as it was.
        def states() -> dict[str, str]:
            return {n["name"]: n["state"] for n in head.nodes()}

        wait_for(lambda: states()["tgt1"] == states()["tgt2"] == "up", 60)
        assert states()["tgt3"] == "new"
        assert not (nodes_root / "tgt3").exists()

        for name in ("tgt1", "tgt2"):
            root = nodes_root / name
            lib = root / "usr" / "local" / "lib" / "gpufleet"
            assert (lib / zipapp.name).read_bytes() == zipapp.read_bytes()
            unit = (root / "etc" / "systemd" / "system" / units.AGENT_UNIT).read_text()
            state_dir = root / "var" / "lib" / "gpufleet-agent"
            assert f"ExecStart={NODE_PYTHON} {lib / zipapp.name} agent --state-dir {state_dir}" in unit
            assert f"--name {name}\n" in unit
            assert "RestartPreventExitStatus=2 5 8" in unit
            env_file = root / "etc" / "gpufleet" / "agent.env"
            assert env_file.stat().st_mode & 0o777 == 0o600
            settings = env_file.read_text()
            assert f"GPUFLEET_SERVER={head.url}\n" in settings
            assert "GPUFLEET_JOIN_TOKEN=" not in settings  # removed once the agent had joined
            credential = json.loads((state_dir / "credential.json").read_text())
            assert credential["node"] == name
            spec = root / "etc" / "gpufleet" / "agent-ctl.json"
            assert _ctl(spec, "status").stdout.startswith("running (pid ")

        # No file holding the join token is left in the run's directory on the head.
        assert not list((tmp_path / "head" / "ansible").glob("task-*/project/files/*/agent.env"))
        audit = head.api("GET", "/api/v1/audit")
        assert any(r["action"] == "agent_deploy.start_deploy" and r["result"] == 202 for r in audit), audit
    finally:
        for spec in nodes_root.glob("*/etc/gpufleet/agent-ctl.json"):
            stopped = _ctl(spec, "stop")
            if stopped.returncode != 0:  # never leave an agent running: kill what the pid file names
                pid_file = spec.parents[2] / "run" / "gpufleet-agent.pid"
                if pid_file.exists():
                    os.kill(int(pid_file.read_text()), signal.SIGKILL)
        head.kill(signal.SIGTERM)
        shutil.rmtree(control, ignore_errors=True)
    # the head is gone; so are the agents it deployed
    for spec in nodes_root.glob("*/etc/gpufleet/agent-ctl.json"):
        assert _ctl(spec, "status").returncode == 3
    with pytest.raises(httpx.HTTPError):
        httpx.get(head.url + "/healthz", timeout=2)
