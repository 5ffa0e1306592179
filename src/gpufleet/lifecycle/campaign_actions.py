"""What a maintenance campaign does on each node: the actions' syntax, their checks, and starting each one.

An action is written as the CLI takes it (`--action`, repeatable, run in order on each node):

    sync-image:IMAGE[@REVISION]     bring the node in line with IMAGE by rsync (provisioning.sync)
    packages:install:PKG[,PKG...]   install packages through Ansible (ansible.builtin.package, present)
    packages:upgrade:PKG[,PKG...]   upgrade them to the newest version (state latest)
    ansible:PLAYBOOK                run a playbook (the CLI reads the file and sends its text)
    reboot                          reset through the node's BMC, then wait until the node is up again
    power-cycle                     power off and on through the BMC, then wait until the node is up again
    burn-in:PROFILE                 run a burn-in profile on the node (lifecycle.burnin); it must pass

`sync-image` syncs the image the node's `software_image` setting names (set it on the category first, so
drift reports and later syncs agree), one revision for the whole campaign: the one named, which must be
the image's current revision, or else the one the first node synced (its canary); a change to the image
mid-campaign fails the next node instead of mixing revisions.

Every action but burn-in runs as a task (`gpufleet task`), one per node and action, created by the same
functions the images, power and Ansible routes use; the caller commits the task, then starts its work
(`Launch`). Actions are safe to run again: a task its head dropped (the head stopped) runs again.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core import hostlist
from gpufleet.core.clock import Clock
from gpufleet.core.config import Settings
from gpufleet.core.credentials import head_box
from gpufleet.core.errors import Conflict, InvalidInput, NotFound
from gpufleet.inventory import categories
from gpufleet.inventory.models import Node
from gpufleet.jobs.ports import WorkloadManager
from gpufleet.lifecycle import burnin
from gpufleet.lifecycle.profiles import get_profile
from gpufleet.power import service as power
from gpufleet.power.schemas import PowerAction
from gpufleet.provisioning import ansible, images, sync
from gpufleet.provisioning.images import ImageConfig
from gpufleet.provisioning.runner import ProcessRunner, Runner
from gpufleet.tasks.runner import TaskContext

KINDS = ("sync-image", "packages", "ansible", "reboot", "power-cycle", "burn-in")
POWER = {"reboot": PowerAction.RESET, "power-cycle": PowerAction.CYCLE}
MAX_ACTIONS = 16
_IMAGE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]{0,62})(?:@([0-9]{1,9}))?$")
_PLAYBOOK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_PROFILE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
SYNTAX = (
    "sync-image:IMAGE[@REVISION], packages:install:PKG[,PKG...], packages:upgrade:PKG[,PKG...], "
    "ansible:PLAYBOOK, reboot, power-cycle, burn-in:PROFILE"
)

Work = Callable[[TaskContext], "str | None"]


@dataclass(frozen=True)
class ActionEnv:
    """What starting an action needs from the head; its composition root builds it."""

    sessions: sessionmaker[Session]
    clock: Clock
    settings: Settings
    workload: WorkloadManager
    image_runner: Runner = field(default_factory=ProcessRunner)
    power_connect: power.Connect | None = None  # None: the real Redfish and IPMI clients


@dataclass(frozen=True)
class Launch:
    """A task the caller has to start once the transaction that recorded it has committed."""

    task_id: int
    work: Work
    params: dict[str, Any]


# ---- the syntax -------------------------------------------------------------------------------------


def parse(text: str, playbooks: Mapping[str, str]) -> dict[str, Any]:
    """One action as stored in the campaign (`Campaign.actions`). `playbooks`: the text of each playbook
    an `ansible:NAME` action names. Raises InvalidInput saying what is wrong and what is right."""
    kind, _, rest = text.strip().partition(":")
    if kind not in KINDS:
        raise InvalidInput(f"unknown action {text[:80]!r}: use one of {SYNTAX}")
    if kind in POWER:
        if rest:
            raise InvalidInput(f"{kind} takes no argument (got {text[:80]!r})")
        return {"kind": kind}
    if not rest:
        raise InvalidInput(f"action {kind} needs an argument: {SYNTAX}")
    if kind == "sync-image":
        return _parse_sync(text, rest)
    if kind == "packages":
        mode, _, names = rest.partition(":")
        if mode not in ("install", "upgrade") or not names:
            raise InvalidInput(f"{text[:80]!r}: write packages:install:PKG[,PKG...] or packages:upgrade:PKG[,PKG...]")
        return {"kind": kind, "mode": mode, "packages": images.check_packages(names.split(","))}
    if kind == "ansible":
        return _parse_ansible(text, rest, playbooks)
    if not _PROFILE.match(rest):
        raise InvalidInput(f"{text[:80]!r}: a burn-in profile's name is lowercase letters, digits and '-'")
    return {"kind": kind, "profile": rest}


def _parse_sync(text: str, rest: str) -> dict[str, Any]:
    m = _IMAGE.match(rest)
    if m is None:
        raise InvalidInput(f"{text[:80]!r}: write sync-image:IMAGE or sync-image:IMAGE@REVISION (a number)")
    revision = int(m.group(2)) if m.group(2) else None
    if revision == 0:
        raise InvalidInput(f"{text[:80]!r}: revisions start at 1")
    return {"kind": "sync-image", "image": m.group(1), "revision": revision}


def _parse_ansible(text: str, rest: str, playbooks: Mapping[str, str]) -> dict[str, Any]:
    name = Path(rest).name
    if not _PLAYBOOK_NAME.match(name):
        raise InvalidInput(f"{text[:80]!r}: a playbook's name is letters, digits, '.', '_' and '-'")
    if name not in playbooks:
        raise InvalidInput(f"{text[:80]!r}: the playbook {name} was not sent with the campaign")
    playbook = playbooks[name]
    ansible.check_playbook(playbook)
    # "_playbook": the text the runs need, too long for a one-line description (the views skip "_" keys)
    return {"kind": "ansible", "playbook": name, "sha256": _sha256(playbook), "_playbook": playbook}


def parse_all(texts: Sequence[str], playbooks: Mapping[str, str]) -> list[dict[str, Any]]:
    """Raises InvalidInput for no action, too many, one that is bad, or a playbook sent but not used."""
    if not texts:
        raise InvalidInput(f"name at least one action: {SYNTAX}")
    if len(texts) > MAX_ACTIONS:
        raise InvalidInput(f"at most {MAX_ACTIONS} actions in one campaign")
    actions = [parse(t, playbooks) for t in texts]
    unused = sorted(set(playbooks) - {a["playbook"] for a in actions if a["kind"] == "ansible"})
    if unused:
        raise InvalidInput(f"playbook {', '.join(unused)} was sent but no ansible: action names it")
    return actions


def describe(action: Mapping[str, Any]) -> str:
    """An action as it is written on the command line (the revision once the campaign pinned it)."""
    kind = str(action.get("kind"))
    if kind == "sync-image":
        revision = action.get("revision")
        return f"sync-image:{action['image']}" + (f"@{revision}" if revision else "")
    if kind == "packages":
        return f"packages:{action['mode']}:{','.join(action['packages'])}"
    if kind == "ansible":
        return f"ansible:{action['playbook']}"
    if kind == "burn-in":
        return f"burn-in:{action['profile']}"
    return kind


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def packages_playbook(mode: str, packages: Sequence[str]) -> str:
    """The playbook a packages action runs: the distribution's package manager through Ansible's
    `package` module, present (install) or latest (upgrade)."""
    play = {
        "name": f"gpufleet maintenance: {mode} {' '.join(packages)}",
        "hosts": "all",
        "become": True,
        "tasks": [
            {
                "name": f"{mode} {' '.join(packages)}",
                "ansible.builtin.package": {
                    "name": list(packages),
                    "state": "present" if mode == "install" else "latest",
                },
            }
        ],
    }
    return yaml.safe_dump([play], sort_keys=False)


# ---- checks at creation -----------------------------------------------------------------------------


def check(session: Session, settings: Settings, actions: Sequence[dict[str, Any]], nodes: Sequence[Node]) -> None:
    """Refuse, before anything is recorded, a campaign whose actions cannot run on its nodes: an unknown
    image or profile, nodes whose software_image is another image, a sync target that would be refused,
    a revision that is not the image's current one, nodes without a BMC, a head without Ansible.
    Raises InvalidInput, NotFound, Conflict or Unavailable."""
    for action in actions:
        kind = action["kind"]
        if kind == "sync-image":
            _check_sync(session, settings, action, nodes)
        elif kind in ("packages", "ansible"):
            ansible.playbook_program()  # Unavailable on a head without Ansible
        elif kind in POWER:
            with_bmc = power.power_states(session, [n.id for n in nodes])
            missing = [n.name for n in nodes if n.id not in with_bmc]
            if missing:
                raise Conflict(f"{kind}: no BMC set for {hostlist.collect(missing)} (gpufleet bmc set NODE ...)")
        elif kind == "burn-in":
            get_profile(action["profile"], burnin.profile_dirs(settings.data_dir, settings.burnin_profiles_dir))


def _check_sync(session: Session, settings: Settings, action: Mapping[str, Any], nodes: Sequence[Node]) -> None:
    name = action["image"]
    image = images.get_image(session, name)  # NotFound
    resolved = categories.resolve_many(session, nodes)
    other = [n.name for n in nodes if resolved[n.name]["software_image"].value != name]
    if other:
        raise InvalidInput(
            f"sync-image:{name}: the software_image of {hostlist.collect(other)} is not {name}: set it "
            f"(gpufleet category set CATEGORY software_image={name}) so drift reports and later syncs agree"
        )
    sync.plan(session, nodes, protected=_protected(settings), local_root=settings.image_sync_local_root)
    revision = action.get("revision")
    if revision is not None and revision != image.revision:
        raise InvalidInput(
            f"sync-image:{name}@{revision}: image {name} is at revision {image.revision}; "
            "only its current revision can be synced (leave @REVISION out to sync whatever is current)"
        )


def _protected(settings: Settings) -> list[Path]:
    """What no sync target may overlap: the images, then the head's own state (as the images route)."""
    return [ImageConfig.of(settings).images_dir, settings.data_dir]


# ---- starting an action on one node ---------------------------------------------------------------


def start(
    session: Session,
    env: ActionEnv,
    *,
    campaign: str,
    campaign_id: int,
    actor: str,
    action: Mapping[str, Any],
    index: int,
    node: Node,
) -> tuple[Launch | None, int | None]:
    """Start `action` on `node`: (the task to start after commit, None) or, for burn-in, (None, the run's
    id). Raises a GpufleetError when it cannot start (the node fails with its message)."""
    kind = action["kind"]
    params = {"campaign": campaign}
    settings = env.settings
    if kind == "sync-image":
        plans = sync.plan(
            session,
            [node],
            image=action["image"],
            protected=_protected(settings),
            local_root=settings.image_sync_local_root,
        )
        task = sync.create_task(session, env.clock, plans, dry_run=False, limit=1, actor=actor, params=params)
        revision = action.get("revision")
        work = sync.work(
            env.sessions,
            env.clock,
            env.image_runner,
            ImageConfig.of(settings),
            sync.SyncConfig.of(settings),
            plans=plans,
            dry_run=False,
            limit=1,
            actor=actor,
            expect={action["image"]: revision} if revision is not None else None,
        )
        return Launch(task.id, work, dict(task.params)), None
    if kind in ("packages", "ansible"):
        if kind == "packages":
            text, name = packages_playbook(action["mode"], action["packages"]), f"packages-{action['mode']}.yml"
        else:
            text, name = action["_playbook"], action["playbook"]
        request = ansible.RunRequest(playbook=text, name=name, nodes=node.name)
        run_plan = ansible.plan_run(session, request, allow_local=settings.ansible_local_connection)
        task = ansible.create_run(session, env.clock, run_plan, actor, params)
        return Launch(task.id, ansible.work(run_plan, ansible.RunnerSettings.of(settings)), dict(task.params)), None
    if kind in POWER:
        power_settings = power.power_settings(settings)
        box = head_box(settings)
        power_plan = power.plan(session, box, power_settings, POWER[kind], [node.name])
        task = power.create_task(session, env.clock, power_plan, actor, params)
        connect = env.power_connect or power.connector(power_settings)
        work = power.work(power_plan, sessions=env.sessions, clock=env.clock, settings=power_settings, connect=connect)
        return Launch(task.id, work, dict(task.params)), None
    if kind == "burn-in":
        profile = get_profile(action["profile"], burnin.profile_dirs(settings.data_dir, settings.burnin_profiles_dir))
        # One batch per campaign and action: nodes burned in at the same time pair for the pair steps; a
        # node alone (the canary) skips them.
        batch = f"campaign-{campaign_id}-{index}"
        (run,) = burnin.start(
            session,
            env.clock,
            env.workload,
            [node],
            profile,
            actor,
            resume_on_pass=False,
            campaign_id=campaign_id,
            batch=batch,
        )
        return None, run.id
    raise NotFound(f"unknown action {kind!r}")
