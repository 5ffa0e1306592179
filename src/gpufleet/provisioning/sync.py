"""Image sync: a node (or a directory standing in for one) brought in line with its image by rsync.

Each node's image comes from its settings (`software_image`, defaults < category < node) unless the
request names one, and where to write it from `sync_target` ("root@{address}:/" by default: `{node}`
and `{address}`, the node's boot address, are filled in). A target is a local directory (an absolute
path: chroots, tests), `[user@]host:/path` over SSH, or `rsync://host/module/path` (an rsync daemon).

rsync runs with `--delete`, so a node ends up with exactly the image's files, except under the
exclusions: what a running node owns (`/proc`, `/sys`, `/dev`, `/run`, `/tmp`, `/var/log`, gpufleet's
own state, its host keys and identity, mount points for site file systems), the `image_sync_excludes`
setting and the image's own exclude file. An excluded path is neither written nor deleted.

Three modes share one argv builder: a sync, a dry run (`-n --itemize-changes`: what a sync would
change, as Bright's `imageupdate -n`) and a drift report (`-n --checksum` without times: files whose
content, mode or owner differ from the image, files missing, files extra). A sync over many nodes is a
task whose fan-out limit is the number of nodes written at once; each node's result holds what
changed (files, bytes, deletions from `--stats`).
"""

from __future__ import annotations

import os
import re
import shlex
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import Clock
from gpufleet.core.config import Settings
from gpufleet.core.db import transaction
from gpufleet.core.errors import Conflict, InvalidInput
from gpufleet.inventory import categories
from gpufleet.inventory.models import Node
from gpufleet.provisioning import images, networks
from gpufleet.provisioning.image_models import Image
from gpufleet.provisioning.images import ImageConfig
from gpufleet.provisioning.runner import Runner, Step
from gpufleet.tasks import service as tasks
from gpufleet.tasks.models import Task
from gpufleet.tasks.runner import TargetResult, TaskContext

# What no sync writes or deletes on a node. "DIR/*" keeps the directory itself in line with the
# image (its mode) and leaves what is inside alone; a plain path leaves the whole entry alone.
BUILT_IN_EXCLUDES: tuple[str, ...] = (
    "/proc/*",
    "/sys/*",
    "/dev/*",
    "/run/*",
    "/tmp/*",  # noqa: S108 (a pattern, not a file we use)
    "/var/tmp/*",  # noqa: S108
    "/var/log/*",
    "/var/lib/gpufleet",  # the head's state, when a head is synced
    "/var/lib/gpufleet-agent",  # the agent's credential: a sync must not make a node forget who it is
    "/var/lib/dhcp/*",
    "/lost+found",
    "/mnt/*",
    "/media/*",
    "/home/*",  # often a shared file system: --delete must never reach into it
    "/boot/efi/*",
    "/etc/hostname",
    "/etc/machine-id",
    "/etc/ssh/ssh_host_*",
)
MAX_LISTED = 500  # changes kept per node in a task's result; the counts are always complete
DRIFT_TIMEOUT_S = 120.0  # a drift report runs in the request: never as long as a sync may
_ITEM = re.compile(r"^(\*deleting|[<>ch.][fdLDS][^ ]{9}) +(.*)$")
_STAT = re.compile(
    r"^(Number of [a-z ]*files(?: transferred)?|Total [a-z ]+size|Literal data|Total bytes sent): ([\d,]+)"
)
_SSH = re.compile(r"^(?:([A-Za-z0-9._-]{1,64})@)?([A-Za-z0-9.-]{1,253}|\[[0-9A-Fa-f:.]+\]):(/.*)$")
_DAEMON = re.compile(r"^rsync://(?:[A-Za-z0-9._-]{1,64}@)?[A-Za-z0-9.-]{1,253}(?::\d{1,5})?/[^\s]+$")
_SSH_OPTION = re.compile(r"^[A-Za-z][A-Za-z0-9]*=[^\n]+$")
_FIELD = re.compile(r"{([^}]*)}")


@dataclass(frozen=True)
class SyncConfig:
    excludes: tuple[str, ...] = ()
    timeout_s: float = 3600.0
    drift_timeout_s: float = DRIFT_TIMEOUT_S  # capped by timeout_s too
    limit: int = 8
    ssh_key: Path | None = None
    ssh_port: int = 22
    ssh_options: tuple[str, ...] = ("BatchMode=yes", "StrictHostKeyChecking=accept-new")

    @classmethod
    def of(cls, settings: Settings) -> SyncConfig:
        for option in settings.image_sync_ssh_options:
            if not _SSH_OPTION.match(option):
                raise InvalidInput(f"image_sync_ssh_options: {option[:60]!r} is not KEY=VALUE")
        return cls(
            excludes=tuple(settings.image_sync_excludes),
            timeout_s=settings.image_sync_timeout_s,
            drift_timeout_s=settings.image_drift_timeout_s,
            limit=settings.image_sync_limit,
            ssh_key=settings.image_sync_ssh_key,
            ssh_port=settings.image_sync_ssh_port,
            ssh_options=tuple(settings.image_sync_ssh_options),
        )

    def ssh_command(self) -> str:
        """The remote shell for `rsync -e`. rsync splits it itself, honouring quotes: no shell sees it."""
        argv = ["ssh", "-p", str(self.ssh_port)]
        if self.ssh_key is not None:
            argv += ["-i", str(self.ssh_key), "-o", "IdentitiesOnly=yes"]
        for option in self.ssh_options:
            argv += ["-o", option]
        return shlex.join(argv)


@dataclass(frozen=True)
class Target:
    """Where a node's image is written: the rsync destination, ending in '/' (its contents)."""

    text: str
    kind: str  # "local", "ssh" or "daemon"


def render_target(template: str, *, node: str, address: str | None) -> Target:
    """`sync_target` with {node} and {address} filled in, checked. Raises InvalidInput for an unknown
    field, a missing address or a destination that is none of the three kinds."""
    for name in _FIELD.findall(template):
        if name not in ("node", "address"):
            raise InvalidInput(f"sync target {template!r}: unknown field {{{name}}} (use {{node}} and {{address}})")
    if "{address}" in template and not address:
        raise InvalidInput(f"node {node} has no address on any network, and its sync target {template!r} needs one")
    return parse_target(template.replace("{node}", node).replace("{address}", address or ""))


def parse_target(text: str) -> Target:
    """Raises InvalidInput unless `text` is an absolute path, [user@]host:/path or rsync://host/module/..."""
    if any(ord(c) < 32 for c in text) or ".." in text.split("/"):
        raise InvalidInput(f"sync target {text[:80]!r}: no control characters or '..' components")
    if text.startswith("/"):
        kind = "local"
    elif _DAEMON.match(text):
        kind = "daemon"
    elif _SSH.match(text) and "::" not in text:
        kind = "ssh"
    else:
        raise InvalidInput(
            f"sync target {text[:80]!r} is not an absolute path, [user@]host:/path or rsync://host/module/path"
        )
    return Target(text if text.endswith("/") else text + "/", kind)


def check_local(target: Target, protected: Sequence[Path], local_root: Path | None) -> None:
    """Refuse a local target unless it lies strictly under `local_root` (the image_sync_local_root
    setting; None refuses every local target), links and '..' resolved: a sync is rsync --delete as
    the head's user (root), so "/etc/" would wipe the head's own files. Also refuses a target that
    is the head's own root, holds a protected directory (the head's state, the images) or lies inside
    the images (the first protected directory), whatever the root says. Raises InvalidInput."""
    path = os.path.realpath(target.text)
    if path == "/":
        raise InvalidInput("a local sync target cannot be / (that is the head itself)")
    if local_root is None:
        raise InvalidInput(
            f"sync target {target.text}: local directory targets are refused unless the head's "
            "image_sync_local_root setting names a directory for them"
        )
    root = os.path.realpath(local_root)
    if root == "/":
        raise InvalidInput("image_sync_local_root cannot be / (every directory of the head would be a target)")
    if path == root or os.path.commonpath([path, root]) != root:
        raise InvalidInput(f"sync target {target.text} is not inside {local_root} (image_sync_local_root)")
    for i, guarded in enumerate(protected):
        real = os.path.realpath(guarded)
        common = os.path.commonpath([path, real])
        if common == path or (i == 0 and common == real):
            raise InvalidInput(f"sync target {target.text} overlaps {guarded}, which image sync never writes")


def excludes(config: SyncConfig) -> list[str]:
    return [*BUILT_IN_EXCLUDES, *config.excludes]


def rsync_argv(
    source: Path,
    target: Target,
    config: SyncConfig,
    *,
    mode: str = "sync",
    exclude_file: Path | None = None,
) -> tuple[str, ...]:
    """The rsync command for one node. `mode`: "sync" (write), "dry-run" (list what a sync would
    change) or "drift" (list what differs from the image, by content, without writing).

    Archive mode with hard links, ACLs and extended attributes, numeric ids (an image's owners are
    numbers: the head's user names mean nothing on a node), sparse files, and --delete."""
    if mode not in ("sync", "dry-run", "drift"):
        raise InvalidInput(f"unknown sync mode {mode!r}")
    argv = ["rsync"]
    if mode == "drift":
        # everything --archive means but the times: a file only touched is no drift
        argv += ["--recursive", "--links", "--perms", "--owner", "--group", "--devices", "--specials", "--checksum"]
    else:
        argv += ["--archive", "--sparse"]
    argv += ["--hard-links", "--acls", "--xattrs", "--numeric-ids", "--delete"]
    if mode != "sync":
        argv.append("--dry-run")
    argv += ["--itemize-changes", "--out-format=%i %n", "--stats"]
    argv += [f"--exclude={pattern}" for pattern in excludes(config)]
    if exclude_file is not None:
        argv.append(f"--exclude-from={exclude_file}")
    if target.kind == "ssh":
        argv += ["--rsh", config.ssh_command()]
    argv += [str(source).rstrip("/") + "/", target.text]
    return tuple(argv)


# ---- what rsync says ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    kind: str  # create, update, attrs, delete
    path: str
    item: str  # rsync's itemized flags, e.g. ">f.st......"


def parse_changes(lines: Iterable[str]) -> list[Change]:
    """The itemized changes of `rsync -i --out-format='%i %n'`; other lines (stats) are skipped."""
    out = []
    for line in lines:
        m = _ITEM.match(line)
        if m is None:
            continue
        item, path = m.group(1), m.group(2)
        if path == "./":
            continue  # the target's own top directory: created or touched, never news
        if item == "*deleting":
            kind = "delete"
        elif item[2:].strip("+") == "":
            kind = "create"
        elif item[0] in "<>" or (item[1] == "L" and item[2] == "c"):
            kind = "update"
        elif item[0] == "." and item[2:].strip(".") == "":
            continue  # nothing changes (shown for -vv and for directories rsync only visits)
        else:
            kind = "attrs"
        out.append(Change(kind, path, item))
    return out


def parse_stats(text: str) -> dict[str, int]:
    """`--stats` as numbers: files, created, deleted, transferred, total_bytes, transferred_bytes,
    literal_bytes, sent_bytes."""
    names = {
        "Number of files": "files",
        "Number of created files": "created",
        "Number of deleted files": "deleted",
        "Number of regular files transferred": "transferred",
        "Total file size": "total_bytes",
        "Total transferred file size": "transferred_bytes",
        "Literal data": "literal_bytes",
        "Total bytes sent": "sent_bytes",
    }
    out: dict[str, int] = {}
    for line in text.splitlines():
        m = _STAT.match(line.strip())
        if m and m.group(1) in names:
            out[names[m.group(1)]] = int(m.group(2).replace(",", ""))
    return out


@dataclass
class NodeSync:
    """What one node's rsync did (or, in a dry run, would do)."""

    node: str
    target: str
    changes: list[Change]
    stats: dict[str, int]
    seconds: float

    def counts(self) -> dict[str, int]:
        out = {"create": 0, "update": 0, "attrs": 0, "delete": 0}
        for change in self.changes:
            out[change.kind] += 1
        return out

    def data(self, *, image: str, revision: int, dry_run: bool) -> dict[str, Any]:
        listed = self.changes if dry_run else [c for c in self.changes if c.kind != "attrs"]
        return {
            "image": image,
            "revision": revision,
            "target": self.target,
            "dry_run": dry_run,
            "seconds": round(self.seconds, 3),
            "counts": self.counts(),
            "files_transferred": self.stats.get("transferred", 0),
            "bytes_transferred": self.stats.get("transferred_bytes", 0),
            "bytes_sent": self.stats.get("sent_bytes", 0),
            "deleted": self.stats.get("deleted", 0),
            "changes": [[c.kind, c.path] for c in listed[:MAX_LISTED]],
            "changes_total": len(listed),
        }

    def detail(self, dry_run: bool) -> str:
        c = self.counts()
        parts = f"{c['create']} new, {c['update']} changed, {c['delete']} deleted, {c['attrs']} attributes"
        if dry_run:
            return f"would change {sum(c.values())}: {parts}"
        mb = self.stats.get("transferred_bytes", 0) / 1e6
        return f"{parts}; {self.stats.get('transferred', 0)} files, {mb:.1f} MB in {self.seconds:.1f} s"


def sync_one(
    runner: Runner,
    config: SyncConfig,
    *,
    node: str,
    source: Path,
    target: Target,
    exclude_file: Path | None = None,
    dry_run: bool = False,
) -> NodeSync:
    """Bring one target in line with the image at `source` (or, dry, list what that would change).
    Raises CommandFailed with rsync's last words."""
    argv = rsync_argv(source, target, config, mode="dry-run" if dry_run else "sync", exclude_file=exclude_file)
    if target.kind == "local" and not dry_run:
        # rsync makes the target's last directory only (a chroot's parent may not exist yet)
        Path(target.text).parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    done = runner.run(Step(argv, config.timeout_s))
    return NodeSync(
        node, target.text, parse_changes(done.stdout.splitlines()), parse_stats(done.stdout), time.monotonic() - started
    )


@dataclass
class Drift:
    """Files on a node that differ from its image: by content, missing, extra, or only in mode or owner."""

    node: str
    image: str
    revision: int
    target: str
    differs: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    attributes: list[str] = field(default_factory=list)

    @property
    def in_line(self) -> bool:
        return not (self.differs or self.missing or self.extra or self.attributes)


def drift(
    runner: Runner,
    config: SyncConfig,
    *,
    node: str,
    image: str,
    revision: int,
    source: Path,
    target: Target,
    exclude_file: Path | None = None,
) -> Drift:
    """Compare a target with its image by content (`rsync -n --checksum`); writes nothing. It runs
    in a request, so its timeout is the drift one (`drift_timeout_s`, at most `timeout_s`). Raises
    CommandFailed with rsync's last words."""
    argv = rsync_argv(source, target, config, mode="drift", exclude_file=exclude_file)
    done = runner.run(Step(argv, min(config.timeout_s, config.drift_timeout_s)))
    report = Drift(node, image, revision, target.text)
    for change in parse_changes(done.stdout.splitlines()):
        if change.kind == "delete":
            report.extra.append(change.path)
        elif change.kind == "create":
            report.missing.append(change.path)
        elif change.kind == "update":  # content (checksum, size) or a link's target
            report.differs.append(change.path)
        else:
            report.attributes.append(change.path)
    return report


# ---- which image goes where ------------------------------------------------------------------------


@dataclass(frozen=True)
class NodePlan:
    node: str
    image: str
    target: str


def plan(
    session: Session,
    nodes: Sequence[Node],
    *,
    image: str | None = None,
    target: str | None = None,
    protected: Sequence[Path] = (),
    local_root: Path | None = None,
) -> list[NodePlan]:
    """Which image each node gets and where it is written, checked all at once so a bad request
    changes nothing. `image` and `target` override the nodes' settings. A local target must lie
    under `local_root` and may not be the head's root, nor hold a `protected` directory, nor lie in
    the first (the images: see `check_local`).
    Raises InvalidInput (a node without an image, a bad target, two nodes writing one target),
    NotFound (an image) or Conflict (an image being created or changed)."""
    if not nodes:
        raise InvalidInput("name the nodes to sync (a hostlist or a category with nodes)")
    settings = categories.resolve_many(session, nodes)
    addresses = networks.boot_addresses(session, [n.id for n in nodes])
    out: list[NodePlan] = []
    without: list[str] = []
    for node in nodes:
        values = settings[node.name]
        name = image or values["software_image"].value
        if not name:
            without.append(node.name)
            continue
        template = target or values["sync_target"].value
        rendered = render_target(template, node=node.name, address=addresses.get(node.id))
        if rendered.kind == "local":
            check_local(rendered, protected, local_root)
        out.append(NodePlan(node.name, name, rendered.text))
    if without:
        shown = ", ".join(without[:10]) + (f" and {len(without) - 10} more" if len(without) > 10 else "")
        raise InvalidInput(f"no software_image for {shown}: set it on their category, or name an image")
    seen: dict[str, str] = {}
    for p in out:
        if p.target in seen:
            raise InvalidInput(f"{p.node} and {seen[p.target]} would both be written to {p.target}")
        seen[p.target] = p.node
    for name in sorted({p.image for p in out}):
        row = images.get_image(session, name)
        if row.state != "ready":
            raise Conflict(f"image {name} is {row.state}: sync when that ends")
    return out


# ---- the task's work -------------------------------------------------------------------------------


def create_task(
    session: Session,
    clock: Clock,
    plans: Sequence[NodePlan],
    *,
    dry_run: bool,
    limit: int,
    actor: str,
    params: Mapping[str, Any] | None = None,
) -> Task:
    """The task of a sync (or its dry run) over planned nodes, its images held so none changes or goes
    while the task reads it (`images.readers` finds them in the params). `params` are added to the
    task's own (a campaign names itself). The caller commits, then starts `work`. Raises NotFound or
    Conflict (an image not ready)."""
    images.hold(session, [p.image for p in plans])
    return tasks.create(
        session,
        clock,
        kind="image.sync-dry-run" if dry_run else "image.sync",
        targets=[p.node for p in plans],
        params={
            "images": sorted({p.image for p in plans}),
            "dry_run": dry_run,
            "limit": limit,
            "targets": {p.node: p.target for p in plans},
            **(params or {}),
        },
        created_by=actor,
    )


def work(
    sessions: sessionmaker[Session],
    clock: Clock,
    runner: Runner,
    image_config: ImageConfig,
    config: SyncConfig,
    *,
    plans: Sequence[NodePlan],
    dry_run: bool,
    limit: int,
    actor: str,
    expect: Mapping[str, int] | None = None,
) -> Callable[[TaskContext], str]:
    """The work of a task `create_task` recorded: `run_sync` over the plans."""

    def run(task_ctx: TaskContext) -> str:
        return run_sync(
            task_ctx,
            sessions,
            clock,
            runner,
            image_config,
            config,
            plans=plans,
            dry_run=dry_run,
            limit=limit,
            actor=actor,
            expect=expect,
        )

    return run


def run_sync(
    ctx: TaskContext,
    sessions: sessionmaker[Session],
    clock: Clock,
    runner: Runner,
    image_config: ImageConfig,
    config: SyncConfig,
    *,
    plans: Sequence[NodePlan],
    dry_run: bool,
    limit: int,
    actor: str,
    expect: Mapping[str, int] | None = None,
) -> str:
    """Sync (or dry-run) every planned node, at most `limit` at once. Each image is first checked
    for changes made on disk outside gpufleet (a new revision if so), so every node's result names
    the revision it got. `expect` (image -> revision): sync only that revision of each image named
    (a maintenance campaign never mixes revisions). Raises Conflict, before any node is written, when
    an image is no longer ready or is at another revision than expected."""
    revisions: dict[str, tuple[Path, int]] = {}
    with transaction(sessions) as session:
        for name in sorted({p.image for p in plans}):
            row = images.get_image(session, name)
            if row.state != "ready":
                raise Conflict(f"image {name} is {row.state}: sync when that ends")
            images.rescan(session, clock, row, actor)
            revisions[name] = (Path(row.path), row.revision)
    # Checked once the rescan is committed: a change made on disk stays on record as its revision.
    for name, wanted in sorted((expect or {}).items()):
        if name in revisions and revisions[name][1] != wanted:
            raise Conflict(f"image {name} is at revision {revisions[name][1]}, not revision {wanted} as asked")
    by_node = {p.node: p for p in plans}

    def one(node: str) -> TargetResult:
        p = by_node[node]
        source, revision = revisions[p.image]
        exclude_file = image_config.exclude_file(p.image)
        result = sync_one(
            runner,
            config,
            node=node,
            source=source,
            target=parse_target(p.target),
            exclude_file=exclude_file if exclude_file.exists() else None,
            dry_run=dry_run,
        )
        data = result.data(image=p.image, revision=revision, dry_run=dry_run)
        return TargetResult(True, result.detail(dry_run), data)

    ctx.fan_out([p.node for p in plans], one, limit=limit)
    shown = ", ".join(f"{name} revision {rev}" for name, (_, rev) in sorted(revisions.items()))
    return f"{'dry run of ' if dry_run else ''}{len(plans)} node(s) against {shown}"


def node_drift(
    sessions: sessionmaker[Session],
    runner: Runner,
    image_config: ImageConfig,
    config: SyncConfig,
    node_plan: NodePlan,
) -> Drift:
    """The drift report of one planned node (read-only: no revision is recorded here)."""
    with transaction(sessions, readonly=True) as session:
        row = session.scalar(select(Image).where(Image.name == node_plan.image))
        if row is None or row.state != "ready":
            raise Conflict(f"image {node_plan.image} is not ready")
        source, revision = Path(row.path), row.revision
    exclude_file = image_config.exclude_file(node_plan.image)
    return drift(
        runner,
        config,
        node=node_plan.node,
        image=node_plan.image,
        revision=revision,
        source=source,
        target=parse_target(node_plan.target),
        exclude_file=exclude_file if exclude_file.exists() else None,
    )
