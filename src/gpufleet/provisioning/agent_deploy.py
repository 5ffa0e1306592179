"""The agent rollout: install the agent on nodes the head knows, over SSH, through the Ansible runs
(provisioning.ansible), as a task with each node's result (docs/deploy-agents.md).

For each node the run copies the agent's zipapp (`make dist`: gpufleet-agent-VERSION.pyz, from the head)
and the node's control program (deploy.agent_ctl) into /usr/local/lib/gpufleet, writes the agent's unit
(deploy.units, the one renderer `gpufleet agent install-unit` uses), its settings file
/etc/gpufleet/agent.env (mode 0600: the head's URL and a join token whose `:sha256:` suffix pins the
head's CA) and the control program's spec, starts the agent (systemd, or detached where systemd does not
run), waits until it has joined, and removes the join token from the settings file. `root` puts all of it
under a directory instead of / (a trial on one machine, the tests); `{node}` in it is the node's name.

The join token is minted for the rollout (one use per node, an hour) unless the request brings one; it
lives in memory and in the run's private files, which are removed when the run ends, never in the task.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from gpufleet import __version__
from gpufleet.auth import service as auth
from gpufleet.core import tls
from gpufleet.core.clock import Clock
from gpufleet.core.errors import ConfigError, InvalidInput
from gpufleet.deploy import agent_ctl, units
from gpufleet.provisioning import ansible
from gpufleet.tasks import service as tasks
from gpufleet.tasks.models import Task
from gpufleet.tasks.runner import TaskContext

KIND = "agent.deploy"
PLAYBOOK_NAME = "deploy-agent.yml"
CTL_NAME = "gpufleet-agent-ctl.py"
SPEC_NAME = "agent-ctl.json"
TOKEN_EXPIRES_S = 3600
_ZIPAPP = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*\.pyz")
NODE_PLACEHOLDER = "{node}"


class Start(enum.StrEnum):
    """How the agent is started on a node."""

    systemd = "systemd"  # systemctl daemon-reload, enable, restart: systemd must be PID 1
    detached = "detached"  # gpufleet-agent-ctl start: a session of its own, a pid file, no supervision
    none = "none"  # install only; start it yourself


# The playbook: one play over the requested hosts. Every path comes from `gpufleet_deploy[host]`, paths
# the head checked (letters, digits and `_./:@+,=-`: nothing Ansible would read as a template); the files
# come from the run's private directory, so their contents are never templated either.
PLAYBOOK = """\
- name: deploy the gpufleet agent
  hosts: all
  gather_facts: false
  become: "{{ gpufleet_become | bool }}"
  vars:
    d: "{{ gpufleet_deploy[inventory_hostname] }}"
    own: "{{ playbook_dir }}/files/{{ inventory_hostname }}"
  tasks:
    - name: systemd runs this host
      ansible.builtin.stat:
        path: /run/systemd/system
      register: gpufleet_systemd
      when: gpufleet_start == 'systemd'
    - name: refuse a host without systemd
      ansible.builtin.fail:
        msg: >-
          systemd is not running on this host (no /run/systemd/system): deploy with --start detached,
          or --start none
      when: gpufleet_start == 'systemd' and not gpufleet_systemd.stat.exists
    - name: the agent's directory
      ansible.builtin.file:
        path: "{{ d.lib_dir }}"
        state: directory
        mode: "0755"
    - name: the settings directory
      ansible.builtin.file:
        path: "{{ d.etc_dir }}"
        state: directory
        mode: "0755"
    - name: the units directory
      ansible.builtin.file:
        path: "{{ d.unit_dir }}"
        state: directory
        mode: "0755"
    - name: the agent's zipapp
      ansible.builtin.copy:
        src: "{{ gpufleet_zipapp }}"
        dest: "{{ d.zipapp }}"
        mode: "0644"
    - name: the agent's control program
      ansible.builtin.copy:
        src: "{{ playbook_dir }}/files/gpufleet-agent-ctl.py"
        dest: "{{ d.ctl }}"
        mode: "0755"
    - name: the agent's unit
      ansible.builtin.copy:
        src: "{{ own }}/gpufleet-agent.service"
        dest: "{{ d.unit }}"
        mode: "0644"
    - name: the control program's spec
      ansible.builtin.copy:
        src: "{{ own }}/agent-ctl.json"
        dest: "{{ d.spec }}"
        mode: "0644"
    - name: the agent's settings and join token
      ansible.builtin.copy:
        src: "{{ own }}/agent.env"
        dest: "{{ d.env_file }}"
        mode: "0600"
      no_log: true
    - name: start the agent under systemd
      ansible.builtin.systemd_service:
        name: gpufleet-agent
        daemon_reload: true
        enabled: true
        state: restarted
      when: gpufleet_start == 'systemd'
    - name: start the agent detached
      ansible.builtin.command:
        argv: ["{{ gpufleet_python }}", "{{ d.ctl }}", "{{ d.spec }}", "start"]
      when: gpufleet_start == 'detached'
    - name: wait until the agent has joined
      ansible.builtin.command:
        argv:
          - "{{ gpufleet_python }}"
          - "{{ d.ctl }}"
          - "{{ d.spec }}"
          - wait-join
          - --timeout
          - "{{ gpufleet_wait_s }}"
      changed_when: false
      when: gpufleet_wait | bool
    - name: the join token is no longer needed
      ansible.builtin.lineinfile:
        path: "{{ d.env_file }}"
        regexp: "^GPUFLEET_JOIN_TOKEN="
        state: absent
      no_log: true
      when: gpufleet_wait | bool
"""


@dataclass(frozen=True)
class DeployRequest:
    """What to install where. `server` is the head's URL as the nodes reach it."""

    nodes: str  # a hostlist of nodes the head knows
    server: str
    ssh_user: str | None = None  # None: Ansible's own (the node's ansible/user label, else the head's user)
    become: bool | None = None  # None: when ssh_user is given and is not root
    join_token: str | None = None  # None: minted for the rollout
    zipapp: str | None = None  # a path on the head; None: data_dir/agent/gpufleet-agent-VERSION.pyz
    python: str = units.DEFAULT_PYTHON  # the node's interpreter for the zipapp and the control program
    start: Start = Start.systemd
    root: str | None = None  # everything under this directory instead of /; `{node}` is the node's name
    wait_s: float = 60.0  # how long a node's agent may take to join; 0: do not wait
    token_expires_s: int = TOKEN_EXPIRES_S


@dataclass(frozen=True)
class NodePaths:
    """Where a node's files go (under its root)."""

    root: str  # "" for /
    zipapp_name: str

    def at(self, path: str) -> str:
        return units.check_path(self.root + path, "a path on the node")

    @property
    def lib_dir(self) -> str:
        return self.at(units.AGENT_LIB_DIR)

    @property
    def state_dir(self) -> str:
        return self.at(units.AGENT_STATE_DIR)

    @property
    def env_file(self) -> str:
        return self.at(units.AGENT_ENV_FILE)

    def as_vars(self) -> dict[str, Any]:
        """The node's `gpufleet_deploy` entry in the playbook's variables."""
        etc = self.at("/etc/gpufleet")
        unit_dir = self.at(units.UNIT_DIR)
        return {
            "lib_dir": self.lib_dir,
            "etc_dir": etc,
            "unit_dir": unit_dir,
            "zipapp": f"{self.lib_dir}/{self.zipapp_name}",
            "ctl": f"{self.lib_dir}/{CTL_NAME}",
            "unit": f"{unit_dir}/{units.AGENT_UNIT}",
            "spec": f"{etc}/{SPEC_NAME}",
            "env_file": self.env_file,
        }


@dataclass(frozen=True)
class DeployPlan:
    """A checked rollout: the Ansible run (without its private files) and what each node gets."""

    request: DeployRequest
    run: ansible.RunPlan
    zipapp: Path  # on the head
    paths: dict[str, NodePaths]  # by node

    @property
    def hosts(self) -> list[str]:
        return self.run.hosts

    def unit(self, node: str) -> units.AgentUnit:
        """The node's unit, as `gpufleet agent install-unit --zipapp` would write it there."""
        paths = self.paths[node]
        environment = {}
        if paths.root:  # everything the agent writes stays under the root too
            environment = {
                "GPUFLEET_JOB_SPOOL_DIR": paths.at("/var/lib/gpufleet-agent/jobs"),
                "GPUFLEET_ARTIFACT_CACHE_DIR": paths.at("/var/cache/gpufleet/artifacts"),
                "GPUFLEET_CHECKS_DIR": paths.at("/etc/gpufleet/checks.d"),
                "GPUFLEET_SLURM_JOB_MAP_DIR": paths.at("/run/gpufleet/slurm-jobs"),
            }
        return units.AgentUnit(
            program=units.zipapp_program(f"{paths.lib_dir}/{paths.zipapp_name}", self.request.python),
            state_dir=paths.state_dir,
            env_file=paths.env_file,
            name=node,
            shiv_root=f"{paths.state_dir}/shiv",
            environment=environment,
        )

    def spec(self, node: str) -> dict[str, Any]:
        """The node's control spec (deploy.agent_ctl)."""
        paths, unit = self.paths[node], self.unit(node)
        return {
            "manager": "systemd" if self.request.start is Start.systemd else "detached",
            "unit": units.AGENT_UNIT.removesuffix(".service"),
            "argv": unit.argv(),
            "env_file": paths.env_file,
            "environment": {"SHIV_ROOT": unit.shiv_root, **unit.environment},
            "state_dir": paths.state_dir,
            "pid_file": paths.at("/run/gpufleet-agent.pid"),
            "log_file": paths.at("/var/log/gpufleet-agent.log"),
        }

    def files(self, join_token: str | None) -> dict[str, str]:
        """The run's private files: the control program, and each node's unit, spec and settings."""
        made_by = "gpufleet node deploy-agent"
        out = {f"files/{CTL_NAME}": Path(agent_ctl.__file__).read_text(encoding="utf-8")}
        for node in self.hosts:
            out[f"files/{node}/{units.AGENT_UNIT}"] = self.unit(node).render(made_by)
            out[f"files/{node}/{SPEC_NAME}"] = json.dumps(self.spec(node), indent=2) + "\n"
            out[f"files/{node}/agent.env"] = units.agent_env(self.request.server, join_token)
        return out

    def params(self) -> dict[str, Any]:
        """What the task records (never the join token)."""
        r = self.request
        return {
            "hosts": self.run.params()["hosts"],
            "zipapp": str(self.zipapp),
            "server": r.server,
            "start": r.start.value,
            "root": r.root,
            "ssh_user": r.ssh_user,
            "python": r.python,
        }


def default_zipapp(data_dir: Path) -> Path:
    """Where the head looks for the agent's zipapp when the request names none."""
    return data_dir / "agent" / units.zipapp_name(__version__)


def _check_zipapp(path: Path) -> Path:
    if not path.is_absolute():
        raise InvalidInput(f"the zipapp {path} must be an absolute path on the head")
    if not _ZIPAPP.fullmatch(path.name):
        raise InvalidInput(f"the zipapp's name {path.name!r} must end in .pyz (gpufleet-agent-VERSION.pyz)")
    if not path.is_file() or not zipfile.is_zipfile(path):
        raise InvalidInput(
            f"there is no agent zipapp at {path} on the head: build it with `make dist` "
            f"(dist/{units.zipapp_name()}) and copy it there, or name one with --zipapp"
        )
    units.check_path(str(path), "the zipapp")
    return path


def _check_server(server: str) -> str:
    if not server.startswith(("http://", "https://")):
        raise InvalidInput(f"the server URL {server[:200]!r} must start with http:// or https://")
    try:
        tls.check_plain_http(server, allow_insecure_http=False)
    except ConfigError as exc:
        raise InvalidInput(f"the agents would refuse it: {exc}") from None
    units.env_line("GPUFLEET_SERVER", server)
    return server.rstrip("/")


def _root(template: str | None, node: str) -> str:
    if not template:
        return ""
    root = units.check_path(template.replace(NODE_PLACEHOLDER, node), "--root")
    return "" if root == "/" else root


def plan(session: Session, request: DeployRequest, default: Path, *, allow_local: bool = False) -> DeployPlan:
    """Check a rollout against the inventory and the head's files. Raises InvalidInput (a bad option,
    no zipapp) or NotFound (an unknown node). Reads only."""
    if request.ssh_user is not None:
        units.check_user(request.ssh_user)
    if request.root and request.start is Start.systemd:
        raise InvalidInput(
            "--root writes under a directory systemd does not read: use --start detached (or none) with it"
        )
    if request.root and not request.root.startswith("/"):
        raise InvalidInput("--root must be an absolute path")
    if not 0 <= request.wait_s <= 600:
        raise InvalidInput("--wait is 0 to 600 seconds")
    if not 60 <= request.token_expires_s <= 7 * 86400:
        raise InvalidInput("the join token's expiry is 60 s to 7 days")
    units.check_path(request.python, "--python")
    server = _check_server(request.server)
    if request.join_token is not None:
        try:
            tls.split_join_token(request.join_token)
        except ConfigError as exc:
            raise InvalidInput(str(exc)) from None
        units.env_line("GPUFLEET_JOIN_TOKEN", request.join_token)
    zipapp = _check_zipapp(Path(request.zipapp) if request.zipapp else default)
    become = request.become
    if become is None:
        become = request.ssh_user is not None and request.ssh_user != "root"
    extra_vars: dict[str, Any] = {
        "gpufleet_become": become,
        "gpufleet_start": request.start.value,
        "gpufleet_python": request.python,
        "gpufleet_zipapp": str(zipapp),
        "gpufleet_wait_s": f"{request.wait_s:g}",
        # no wait with --start none or --wait 0: then the join token stays until the agent is started
        "gpufleet_wait": request.start is not Start.none and request.wait_s > 0,
    }
    if request.ssh_user is not None:
        extra_vars["ansible_user"] = request.ssh_user
    run_request = ansible.RunRequest(playbook=PLAYBOOK, name=PLAYBOOK_NAME, nodes=request.nodes, extra_vars=extra_vars)
    run = ansible.plan_run(session, run_request, allow_local=allow_local)
    paths = {node: NodePaths(_root(request.root, node), zipapp.name) for node in run.hosts}
    extra_vars["gpufleet_deploy"] = {node: p.as_vars() for node, p in paths.items()}
    run = dataclasses.replace(run, request=dataclasses.replace(run.request, extra_vars=extra_vars))
    deploy = DeployPlan(dataclasses.replace(request, server=server), run, zipapp, paths)
    for node in run.hosts:  # every unit renders (a name or path systemd would need quoted refuses here)
        deploy.unit(node).render()
    return deploy


def create(
    session: Session, clock: Clock, deploy: DeployPlan, created_by: str, ca_fingerprint: str | None
) -> tuple[Task, str]:
    """The rollout's task (one target per node) and the join token its agents use: the request's, else
    one minted now for one use per node (pinned to the head's CA). The caller commits, then starts `work`."""
    params = deploy.params()
    token = deploy.request.join_token
    source = "the request's"
    if token is None:
        secret, row = auth.create_join_token(session, clock, deploy.request.token_expires_s, len(deploy.hosts))
        token = tls.pin_join_token(secret, ca_fingerprint)
        source = f"#{row.id} (minted: {len(deploy.hosts)} uses, {deploy.request.token_expires_s} s)"
    params["join_token"] = source
    task = tasks.create(session, clock, kind=KIND, targets=deploy.hosts, params=params, created_by=created_by)
    return task, token


def work(deploy: DeployPlan, join_token: str, settings: ansible.RunnerSettings) -> Callable[[TaskContext], str]:
    """The task's work: the Ansible run with the nodes' files; the files holding the join token are
    removed from the run's directory when it ends."""
    request = dataclasses.replace(deploy.run.request, files=deploy.files(join_token))
    run = ansible.work(dataclasses.replace(deploy.run, request=request), settings)

    def deploy_work(ctx: TaskContext) -> str:
        try:
            return run(ctx)
        finally:
            for env in (settings.runs_dir / f"task-{ctx.task_id}" / "project" / "files").glob("*/agent.env"):
                env.unlink(missing_ok=True)

    return deploy_work
