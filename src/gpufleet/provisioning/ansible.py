"""Ansible: the inventory as Ansible's dynamic inventory, and playbooks run on nodes as recorded tasks.

The inventory is Ansible's *script* inventory shape (what an inventory script prints for `--list`),
with `_meta.hostvars` included so Ansible never calls the script once per host:

- groups `category_<name>` (one per node category) and `state_<state>` (new, up, down), and `all`;
  names are made valid for Ansible (letters, digits and `_`; see `group_name`);
- per host: `ansible_host` (the node's boot address, else its reported hostname), `gpufleet_category`,
  `gpufleet_state`, `gpufleet_labels`, every resolved node setting as `gpufleet_<key>`, and each
  label `ansible/<var>` as the variable `ansible_<var>` (`-`, `.` and `/` read as `_`): that is how
  a node is given `ansible_user`, `ansible_port`, `ansible_connection` or `ansible_python_interpreter`;
- every value that holds a Jinja2 template is marked unsafe, so Ansible keeps it as text (`unsafe`).

A run takes a playbook's text (one file, uploaded by the CLI, at most 1 MiB, a YAML list of plays),
checks it and the hosts before anything is recorded (so a bad request changes nothing), then runs
it as a task of kind `ansible.run` through ansible-runner: a fresh private data directory per run
under the head's data directory, the inventory written there as a file (a snapshot taken with the
request), `--limit` to exactly the requested hosts (from a file, so no host name is ever parsed as a
pattern), argument lists only. Each host's result comes from the play recap (ok, changed, failed,
unreachable, skipped) and its first failure message from the events; a host that fails fails alone,
as Ansible itself goes on with the others.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy.orm import Session

from gpufleet.core import hostlist
from gpufleet.core.clock import Clock
from gpufleet.core.config import Settings
from gpufleet.core.errors import InvalidInput, NotFound, Unavailable
from gpufleet.inventory import categories
from gpufleet.inventory import service as inventory
from gpufleet.inventory.categories import Resolved
from gpufleet.inventory.models import Node
from gpufleet.provisioning import networks
from gpufleet.provisioning.ansible_recap import failure_of, results_from
from gpufleet.tasks import service as tasks
from gpufleet.tasks.models import Task
from gpufleet.tasks.runner import TaskContext

KIND = "ansible.run"
PLAYBOOK_MAX_BYTES = 1024 * 1024
KEEP_RUNS = 50  # private data directories kept for reading a run's full output; older ones are removed
LABEL_PREFIX = "ansible/"
_GROUP_BAD = re.compile(r"[^A-Za-z0-9_]")
_VAR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_TEMPLATE_MARKS = ("{{", "{%", "{#")
# Labels may be set by operators, and a playbook runs with the head's SSH keys: only these variables
# may come from a label, each with the values it may take. `ansible_connection=local` (run on the
# head itself) and `*_args`, `ssh_executable` and the like are never read from a label; local
# connections need the head's `ansible_local_connection` setting (tests, a single-machine trial).
_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
_LABEL_VARS: dict[str, re.Pattern[str]] = {
    "ansible_user": _USER,
    "ansible_become_user": _USER,
    "ansible_port": re.compile(r"[0-9]{1,5}"),
    "ansible_python_interpreter": re.compile(r"/[A-Za-z0-9._/+-]{1,255}"),
    "ansible_connection": re.compile(r"ssh|paramiko"),
}
_LOCAL_CONNECTION = re.compile(r"ssh|paramiko|local")
_PLAY_KEYS = frozenset({"hosts", "import_playbook", "ansible.builtin.import_playbook"})


# The inventory -------------------------------------------------------------------------------------


def group_name(prefix: str, name: str) -> str:
    """A group name Ansible accepts (a Python identifier: letters, digits and `_`): `prefix_name`
    with every other character as `_`. Collisions are told apart by `_groups`."""
    return f"{prefix}_{_GROUP_BAD.sub('_', name)}"


def _groups(prefix: str, names: Iterable[str]) -> dict[str, str]:
    """Each name's group. Two names that read the same once cleaned (`a-b`, `a.b`) each get a short
    digest of the original as a suffix, so no two categories ever share a group."""
    plain = {name: group_name(prefix, name) for name in set(names)}
    counts = Counter(plain.values())
    return {
        name: group if counts[group] == 1 else f"{group}_{hashlib.sha256(name.encode()).hexdigest()[:6]}"
        for name, group in plain.items()
    }


def unsafe(value: Any) -> Any:
    """`value` with every string Ansible would render as a template (one holding `{{`, `{%` or `{#`)
    marked unsafe (`{"__ansible_unsafe": text}`), so Ansible keeps it as text. Without this, whoever
    may set a node's label or setting could run code on the head (`{{ lookup('pipe', ...) }}`)
    the next time an admin runs a playbook."""
    if isinstance(value, str):
        return {"__ansible_unsafe": value} if any(m in value for m in _TEMPLATE_MARKS) else value
    if isinstance(value, dict):
        return {k: unsafe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unsafe(v) for v in value]
    return value


def host_vars(
    node: Node, address: str | None, settings: Mapping[str, Resolved], *, allow_local: bool = False
) -> dict[str, Any]:
    """One host's variables (pure): see the module's docstring. Values that look like templates are
    marked unsafe (see `unsafe`); a label naming a variable or value not in `_LABEL_VARS` is left out."""
    labels = dict(node.labels or {})
    out: dict[str, Any] = {}
    target = address or node.hostname
    if target:
        out["ansible_host"] = target
    out["gpufleet_category"] = node.category
    out["gpufleet_state"] = str(node.state.value)
    out["gpufleet_labels"] = labels
    for key, resolved in settings.items():
        out[f"gpufleet_{key}"] = resolved.value
    for key, value in sorted(labels.items()):
        if key.startswith(LABEL_PREFIX):
            var = "ansible_" + re.sub(r"[-./]", "_", key[len(LABEL_PREFIX) :])
            allowed = _LOCAL_CONNECTION if allow_local and var == "ansible_connection" else _LABEL_VARS.get(var)
            if allowed is not None and isinstance(value, str) and allowed.fullmatch(value):
                out[var] = value
    return {key: unsafe(value) for key, value in out.items()}


def build_inventory(session: Session, *, allow_local: bool = False) -> dict[str, Any]:
    """Every node as Ansible's script inventory (`--list`): groups and `_meta.hostvars`. Nodes may
    ask for `ansible_connection=local` only with `allow_local` (the `ansible_local_connection` setting)."""
    nodes = inventory.list_nodes(session)
    resolved = categories.resolve_many(session, nodes)
    addresses = networks.boot_addresses(session)
    by_category = _groups("category", {n.category for n in nodes if n.category})
    by_state = _groups("state", {str(n.state.value) for n in nodes})
    groups: dict[str, list[str]] = {}
    hostvars: dict[str, dict[str, Any]] = {}
    for node in nodes:  # in name order
        hostvars[node.name] = host_vars(
            node, addresses.get(node.id), resolved.get(node.name, {}), allow_local=allow_local
        )
        if node.category:
            groups.setdefault(by_category[node.category], []).append(node.name)
        groups.setdefault(by_state[str(node.state.value)], []).append(node.name)
    out: dict[str, Any] = {
        "all": {"hosts": [n.name for n in nodes], "children": sorted(groups)},
        **{name: {"hosts": hosts} for name, hosts in sorted(groups.items())},
        "_meta": {"hostvars": hostvars},
    }
    return out


def static_inventory(script: Mapping[str, Any]) -> dict[str, Any]:
    """The script shape as Ansible's static YAML/JSON inventory shape, which a file can hold."""
    hostvars: Mapping[str, Any] = script["_meta"]["hostvars"]
    children: dict[str, Any] = {
        name: {"hosts": {host: {} for host in group["hosts"]}}
        for name, group in script.items()
        if name not in ("all", "_meta")
    }
    return {"all": {"hosts": dict(hostvars), "children": children}}


# Checking a run ------------------------------------------------------------------------------------


class _PlaybookLoader(yaml.SafeLoader):
    """YAML as Ansible reads it, for checking the shape only: its own tags (`!vault`, `!unsafe`) are
    read as the plain value under them."""


def _any_tag(loader: yaml.SafeLoader, _suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return loader.construct_scalar(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node)
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node)
    return None


_PlaybookLoader.add_multi_constructor("!", _any_tag)


def check_playbook(text: str) -> int:
    """Check that `text` is a playbook a single file can be: a non-empty YAML list of plays, each a
    mapping with `hosts`. Returns how many plays. Raises InvalidInput saying what is wrong."""
    if len(text.encode()) > PLAYBOOK_MAX_BYTES:
        raise InvalidInput(f"the playbook is larger than {PLAYBOOK_MAX_BYTES // 1024} KiB")
    try:
        plays = yaml.load(text, Loader=_PlaybookLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        raise InvalidInput(f"the playbook is not valid YAML{line}: {getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(plays, list) or not plays:
        raise InvalidInput("a playbook is a YAML list of plays, e.g. '- hosts: all' followed by its tasks")
    for number, play in enumerate(plays, start=1):
        if not isinstance(play, dict):
            raise InvalidInput(f"play {number} is not a mapping")
        if "import_playbook" in play or "ansible.builtin.import_playbook" in play:
            raise InvalidInput(f"play {number} imports another playbook; a playbook run by gpufleet is one file")
        if not _PLAY_KEYS & set(play):
            raise InvalidInput(f"play {number} names no hosts (every play needs 'hosts:')")
    return len(plays)


@dataclass(frozen=True)
class RunRequest:
    """What to run where. Exactly one of `category` and `nodes` (a hostlist) chooses the hosts."""

    playbook: str
    name: str = "playbook.yml"
    category: str | None = None
    nodes: str | None = None
    check: bool = False  # Ansible's check mode: report what would change, change nothing
    extra_vars: dict[str, Any] = field(default_factory=dict)
    # More files for the playbook, by path under its directory (the agent rollout's units and settings):
    # written 0600 with the run, never recorded with the task (they may hold a join token).
    files: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RunPlan:
    """A checked request: the hosts, in name order, and what ansible-playbook is given."""

    request: RunRequest
    hosts: list[str]
    plays: int
    digest: str  # the playbook's SHA-256, recorded with the task
    inventory: dict[str, Any]  # the snapshot the run uses (script shape)

    def argv(self, data_dir: str = "PRIVATE_DATA_DIR") -> list[str]:
        """The command ansible-runner starts, as it would for this run (`--dry-run` prints it)."""
        argv = ["ansible-playbook", "-i", f"{data_dir}/inventory/hosts.json", "--limit", f"@{data_dir}/limit"]
        if self.request.extra_vars:
            argv += ["-e", f"@{data_dir}/env/extravars"]
        if self.request.check:
            argv.append("--check")
        return [*argv, self.request.name]

    def params(self) -> dict[str, Any]:
        return {
            "playbook": self.request.name,
            "sha256": self.digest,
            "plays": self.plays,
            "category": self.request.category,
            "nodes": self.request.nodes,
            "hosts": hostlist.collect(self.hosts),
            "check": self.request.check,
            "extra_vars": sorted(self.request.extra_vars),  # the names only: values may be secrets
        }


def plan_run(session: Session, request: RunRequest, *, allow_local: bool = False) -> RunPlan:
    """Check a run request against the inventory. Raises InvalidInput (bad playbook, name, hosts or
    variables) or NotFound (an unknown category or node). Reads only."""
    if not _FILE_NAME.match(request.name):
        raise InvalidInput("the playbook's name is letters, digits, '.', '_' and '-', e.g. site.yml")
    if (request.category is None) == (request.nodes is None):
        raise InvalidInput("name the hosts with exactly one of a category and a node list")
    for key in request.extra_vars:
        if not _VAR.match(key):
            raise InvalidInput(f"extra variable {key!r} is not a valid Ansible variable name")
    plays = check_playbook(request.playbook)
    if request.category is not None:
        hosts = [n.name for n in inventory.list_nodes(session) if n.category == request.category]
        if not hosts:
            categories.get_category(session, request.category)  # NotFound for a category that does not exist
            raise InvalidInput(f"category {request.category} has no nodes: nothing to run the playbook on")
    else:
        names = inventory.expand_names([request.nodes or ""])
        if not names:
            raise InvalidInput("the node list is empty")
        found = {n.name for n in inventory.list_nodes(session, names)}
        missing = [n for n in names if n not in found]
        if missing:
            raise NotFound(f"no such node: {hostlist.collect(missing)}")
        hosts = sorted(found)
    return RunPlan(
        request=request,
        hosts=hosts,
        plays=plays,
        digest=hashlib.sha256(request.playbook.encode()).hexdigest(),
        inventory=build_inventory(session, allow_local=allow_local),
    )


def playbook_program() -> str:
    """Where ansible-playbook is: beside this Python (the head's environment), else on PATH.
    Raises Unavailable when ansible-core or ansible-runner is not installed on the head."""
    beside = Path(sys.executable).parent / "ansible-playbook"
    found = str(beside) if beside.exists() else shutil.which("ansible-playbook")
    if found is None or importlib.util.find_spec("ansible_runner") is None:
        raise Unavailable("Ansible is not installed on the head (pip install 'gpufleet[server]')")
    return found


def create_run(
    session: Session, clock: Clock, plan: RunPlan, created_by: str, params: Mapping[str, Any] | None = None
) -> Task:
    """The run's task, one target per host (the caller commits it, then starts `work`). `params` are added
    to the plan's own (a campaign names itself)."""
    return tasks.create(
        session, clock, kind=KIND, targets=plan.hosts, params=plan.params() | dict(params or {}), created_by=created_by
    )


# Running -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunnerSettings:
    """How runs are made on this head (from the head's settings)."""

    runs_dir: Path  # each run's private data directory is made under here
    timeout_s: float  # the whole run; past it ansible-playbook is killed and unfinished hosts fail
    task_timeout_s: int  # one task on one host (Ansible's TASK_TIMEOUT); 0: none
    forks: int  # hosts Ansible works on at once

    @classmethod
    def of(cls, settings: Settings) -> RunnerSettings:
        return cls(
            runs_dir=settings.data_dir / "ansible",
            timeout_s=settings.ansible_timeout_s,
            task_timeout_s=settings.ansible_task_timeout_s,
            forks=settings.ansible_forks,
        )


def _prune(runs_dir: Path, keep: int) -> None:
    old = sorted((p for p in runs_dir.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in old[keep:]:
        shutil.rmtree(path, ignore_errors=True)


def kill_leftovers(artifact_dir: Path) -> int:
    """Kill what a stopped run left behind; returns how many processes. ansible-runner kills
    ansible-playbook's process group at the time limit, but Ansible's forked workers start sessions
    of their own and would go on (with what they started) until their task ends. Every process of
    the run carries the run's artifact directory in its environment (`AWX_ISOLATED_DATA_DIR`, set
    by ansible-runner), so they are found by that in /proc."""
    needle = f"AWX_ISOLATED_DATA_DIR={artifact_dir}".encode()
    killed = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
        except (OSError, ValueError):  # gone already, or not ours to read
            continue
    return killed


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(line for line in text.strip().splitlines()[-lines:] if line.strip())


def work(plan: RunPlan, settings: RunnerSettings) -> Callable[[TaskContext], str]:
    """The task's work: run the playbook once over all the hosts and record each host's result."""

    def run(ctx: TaskContext) -> str:
        import ansible_runner  # the head's extra only; the CLI and the agent never load it

        base = settings.runs_dir / f"task-{ctx.task_id}"
        shutil.rmtree(base, ignore_errors=True)  # fresh: a reused id never sees another run's files
        base.mkdir(parents=True, mode=0o700)
        base.chmod(0o700)  # whatever the umask: the extra variables are kept in here
        for sub in ("project", "inventory", "env", "tmp"):
            (base / sub).mkdir(mode=0o700)
        (base / "project" / plan.request.name).write_text(plan.request.playbook)
        for relative, text in plan.request.files.items():
            _write_private(base / "project", relative, text)
        (base / "inventory" / "hosts.json").write_text(json.dumps(static_inventory(plan.inventory)))
        (base / "limit").write_text("".join(f"{h}\n" for h in plan.hosts))
        _prune(settings.runs_dir, KEEP_RUNS)

        wanted = set(plan.hosts)
        started: set[str] = set()
        failures: dict[str, str] = {}

        def on_event(event: dict[str, Any]) -> bool:
            data = event.get("event_data") or {}
            host = data.get("host")
            if isinstance(host, str) and host in wanted and host not in started:
                started.add(host)
                ctx.running(host)
            found = failure_of(event)
            if found is not None:
                failures.setdefault(*found)
            return True  # keep the event's file in the artifacts

        envvars = {
            # the ansible-playbook found first, whatever PATH the head started with
            "PATH": os.pathsep.join([str(Path(playbook_program()).parent), os.environ.get("PATH", os.defpath)]),
            "ANSIBLE_LOCAL_TEMP": str(base / "tmp"),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_RETRY_FILES_ENABLED": "0",
            "ANSIBLE_TASK_TIMEOUT": str(settings.task_timeout_s),
        }
        result = ansible_runner.run(
            private_data_dir=str(base),
            ident="run",
            playbook=plan.request.name,
            inventory=str(base / "inventory" / "hosts.json"),
            limit=f"@{base / 'limit'}",
            extravars=plan.request.extra_vars or None,
            cmdline="--check" if plan.request.check else None,
            forks=settings.forks,
            envvars=envvars,
            timeout=max(1, int(settings.timeout_s)),
            event_handler=on_event,
            quiet=True,
        )
        if result.status != "successful":
            kill_leftovers(base / "artifacts" / "run")
        return record(ctx, plan, result.status, result.rc, result.stats, failures, _stdout(base), settings.timeout_s)

    return run


def _write_private(project: Path, relative: str, text: str) -> None:
    """One of a request's `files`, readable by the head's user alone, never outside `project`."""
    path = project / relative
    if project.resolve() not in path.resolve().parents:
        raise InvalidInput(f"a run's file {relative!r} lies outside its directory")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)


def _stdout(base: Path) -> str:
    path = base / "artifacts" / "run" / "stdout"
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def record(
    ctx: TaskContext,
    plan: RunPlan,
    status: str,
    rc: int | None,
    stats: Mapping[str, Mapping[str, int]] | None,
    failures: Mapping[str, str],
    stdout: str,
    timeout_s: float,
) -> str:
    """Record every host's result on the task and return the summary."""
    results = results_from(stats, failures)
    early = not results and status != "successful"  # ansible-playbook stopped before any host ran
    counts: Counter[str] = Counter()
    for host in plan.hosts:
        got = results.get(host)
        if got is not None:  # after a timeout, only the hosts with a failure reported so far
            ctx.finished(host, not got.failed, got.detail(), dict(got.counts))
            counts["failed" if got.failed else "ok"] += 1
        elif status == "timeout":
            ctx.finished(host, False, f"the run passed its time limit ({timeout_s:g} s)")
            counts["failed"] += 1
        elif early:
            ctx.finished(host, False, _tail(stdout) or f"ansible-playbook exited {rc}", {"rc": rc})
            counts["failed"] += 1
        else:
            ctx.skipped(host, "no play of the playbook matched this host")
            counts["skipped"] += 1
    parts = [f"{counts[k]} {k}" for k in ("ok", "failed", "skipped") if counts[k] or k != "skipped"]
    ending = {"successful": "", "timeout": " (timed out)"}.get(status, f" (ansible-playbook exited {rc})")
    return f"{plan.request.name}: " + ", ".join(parts) + ending


def host_of(script: Mapping[str, Any], name: str) -> dict[str, Any]:
    """One host's variables from the inventory (`--host`). Raises NotFound for an unknown node."""
    hostvars: Mapping[str, Any] = script["_meta"]["hostvars"]
    if name not in hostvars:
        raise NotFound(f"no such node: {name}")
    return dict(hostvars[name])
