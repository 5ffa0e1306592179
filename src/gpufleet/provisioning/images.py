"""Software images: directory trees on the head that nodes are brought in line with (`sync`).

An image is made from a base (debootstrap of a Debian or Ubuntu release from a package mirror, a
tarball, which is also how a container's filesystem comes in: `podman export`), or as a copy of
another image; packages are installed into it with chroot + apt. Every change records a revision:
a number, what changed it, who, when, and the tree's digest after the change.

The slow parts (debootstrap, apt, copying a tree) run on task threads (`gpufleet.tasks`), never in a
request: the request checks what it can and marks the image `creating` or `changing` (one change at
a time per image), the task does the work and records the revision. Programs run through
`provisioning.runner`, as argument lists with a timeout, so a dry run prints the argv instead.

The digest is of the tree's metadata, not its content: a sorted walk of (path, type and mode, owner,
size, mtime in ns, link target). Hashing the content of a 1 GB image costs seconds to minutes of
disk reads per revision, while every change gpufleet makes (apt, tar, cp, rsync) rewrites the files
it touches and so moves their mtime and usually their size; the walk costs one lstat per file (about
50 ms for 20,000 files). What it misses is an edit that keeps a file's size and forges its mtime back;
the drift report (`sync.drift`) compares content (`rsync --checksum`) where that matters.

Service functions take a session and never commit; the `run_*` functions are a task's work and open
their own short transactions around the slow part.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.assets import store as asset_store
from gpufleet.assets.image_tree import read_image
from gpufleet.core.clock import Clock, to_datetime
from gpufleet.core.config import Settings
from gpufleet.core.db import transaction
from gpufleet.core.errors import Conflict, InvalidInput, NotFound
from gpufleet.inventory import categories
from gpufleet.inventory.models import Node
from gpufleet.protocol.settings import NAME_PATTERN
from gpufleet.provisioning.image_models import Image, ImageRevision
from gpufleet.provisioning.runner import CommandFailed, Runner, Step
from gpufleet.tasks import service as tasks
from gpufleet.tasks.models import Task
from gpufleet.tasks.service import FINISHED_STATES

DEBIAN_MIRROR = "http://deb.debian.org/debian"
UBUNTU_MIRROR = "http://archive.ubuntu.com/ubuntu"
# Releases debootstrap knows as Ubuntu's: they default to Ubuntu's mirror (and its keyring).
UBUNTU_RELEASES = frozenset({"bionic", "focal", "jammy", "kinetic", "lunar", "mantic", "noble", "oracular"})
_RELEASE = re.compile(r"^[a-z][a-z0-9-]{1,31}$")
_MIRROR = re.compile(r"^(https?|file)://[^\s'\"\\]+$")
# A Debian package name, optionally =version or /release: never an option (no leading '-').
_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]{0,127}([=/][A-Za-z0-9.+:~_-]{1,128})?$")
EXCLUDE_SUFFIX = ".exclude"  # images_dir/NAME.exclude: rsync patterns this image never syncs
# The tasks that read an image while they run (`readers`): it may not change or go away under them.
# A clone's params name its source as `clone_of`, a sync's its images as `images`.
READING_KINDS = ("image.clone", "image.sync", "image.sync-dry-run")
UNFINISHED_STATES = ("queued", "running")
MAX_PACKAGES = 200
POLICY_RC_D = "#!/bin/sh\n# gpufleet: no service starts while packages are installed into an image\nexit 101\n"


@dataclass(frozen=True)
class ImageConfig:
    """The settings the image code reads, resolved once."""

    images_dir: Path
    command_timeout_s: float = 3600.0
    debian_mirror: str = DEBIAN_MIRROR
    ubuntu_mirror: str = UBUNTU_MIRROR
    # Mirrors a request may name (besides the two defaults): a mirror's maintainer scripts run as root.
    allowed_mirrors: tuple[str, ...] = (DEBIAN_MIRROR, UBUNTU_MIRROR)
    # Where tarballs may be imported from (image_import_dirs): the head reads nothing else for a request.
    import_dirs: tuple[Path, ...] = ()

    @classmethod
    def of(cls, settings: Settings) -> ImageConfig:
        return cls(
            images_dir=settings.images_dir or settings.data_dir / "images",
            command_timeout_s=settings.image_command_timeout_s,
            debian_mirror=settings.image_mirror,
            ubuntu_mirror=settings.image_ubuntu_mirror,
            allowed_mirrors=tuple(settings.image_allowed_mirrors),
            import_dirs=tuple(settings.image_import_dirs),
        )

    def mirror_allowed(self, mirror: str) -> bool:
        """Whether a request may name `mirror`: one of the allowed ones or a default (a trailing '/'
        makes no difference)."""
        known = {m.rstrip("/") for m in (*self.allowed_mirrors, self.debian_mirror, self.ubuntu_mirror)}
        return mirror.rstrip("/") in known

    def path(self, name: str) -> Path:
        return self.images_dir / name

    def building(self, name: str) -> Path:
        """Where a new image is built before it is moved into place (a crash leaves nothing half-made
        under the image's own name)."""
        return self.images_dir / f".{name}.building"

    def exclude_file(self, name: str) -> Path:
        return self.images_dir / f"{name}{EXCLUDE_SUFFIX}"


@dataclass(frozen=True)
class Source:
    """Where a new image comes from: exactly one of release (debootstrap), tarball or clone_of."""

    release: str | None = None
    mirror: str | None = None
    tarball: str | None = None
    clone_of: str | None = None

    def kind(self) -> str:
        pairs = (("debootstrap", self.release), ("tarball", self.tarball), ("clone", self.clone_of))
        given = [kind for kind, value in pairs if value]
        if len(given) != 1:
            raise InvalidInput("give exactly one source: a release to debootstrap, a tarball, or an image to clone")
        return given[0]


@dataclass(frozen=True)
class TreeDigest:
    digest: str
    files: int
    bytes: int


def check_name(name: str) -> None:
    """An image's name is also its directory's; `NAME.exclude` beside it is image NAME's exclude file,
    so a name ending so would be read as another image's exclusions."""
    if not re.match(NAME_PATTERN, name):
        raise InvalidInput(f"invalid image name {name!r}: use letters, digits, '.', '_' and '-' (max 63)")
    if name.endswith(EXCLUDE_SUFFIX):
        raise InvalidInput(f"invalid image name {name!r}: a name may not end in {EXCLUDE_SUFFIX} (exclude files do)")


def check_packages(packages: Sequence[str]) -> list[str]:
    """Package names as apt takes them (NAME, NAME=VERSION, NAME/RELEASE); never an option."""
    if not packages:
        raise InvalidInput("name at least one package to install")
    if len(packages) > MAX_PACKAGES:
        raise InvalidInput(f"at most {MAX_PACKAGES} packages at once")
    for package in packages:
        if not _PACKAGE.match(package):
            raise InvalidInput(f"{package[:80]!r} is not a package name (e.g. curl, curl=7.88.1-10, curl/bookworm)")
    return list(dict.fromkeys(packages))


# ---- the tree's digest ----------------------------------------------------------------------------


def tree_digest(root: Path) -> TreeDigest:
    """The digest of a tree's metadata (see the module's docstring for why not its content).

    Walks without following links and stays on the root's filesystem (a /proc mounted into a chroot
    is not part of the image). Names are hashed as bytes, so names that are not UTF-8 count too."""
    h = hashlib.sha256()
    files = 0
    total = 0
    top = os.lstat(root)
    stack: list[bytes] = [b""]
    base = os.fsencode(root)
    while stack:
        rel = stack.pop()
        with os.scandir(base + rel if rel else base) as entries:
            names = sorted(e.name for e in entries)
        for name in names:
            path = rel + b"/" + os.fsencode(name)
            st = os.lstat(base + path)
            link = os.readlink(base + path) if stat.S_ISLNK(st.st_mode) else b""
            size = st.st_size if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode) else 0
            fields = (path, st.st_mode, st.st_uid, st.st_gid, size, st.st_mtime_ns, link)
            h.update(b"%s\0%o\0%d\0%d\0%d\0%d\0%s\n" % fields)
            files += 1
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
            elif stat.S_ISDIR(st.st_mode) and st.st_dev == top.st_dev:
                stack.append(path)
    return TreeDigest(h.hexdigest(), files, total)


# ---- what a change runs (a dry run prints these) ----------------------------------------------------


def plan_create(config: ImageConfig, name: str, source: Source, clone_path: Path | None = None) -> list[Step]:
    """The programs that build image `name` from `source` into its building directory."""
    into = str(config.building(name))
    timeout = config.command_timeout_s
    source.kind()  # exactly one source
    if source.release is not None:
        mirror = source.mirror or (config.ubuntu_mirror if source.release in UBUNTU_RELEASES else config.debian_mirror)
        return [Step(("debootstrap", "--variant=minbase", source.release, into, mirror), timeout)]
    if source.tarball is not None:
        argv = (
            "tar",
            "--extract",
            f"--file={source.tarball}",
            f"--directory={into}",
            "--numeric-owner",
            "--same-owner",
            "--preserve-permissions",
            "--xattrs",
            "--xattrs-include=*",
            "--acls",
        )
        return [Step(argv, timeout)]
    if clone_path is None:
        raise InvalidInput(f"image {source.clone_of}: its path is needed to clone it")
    # --reflink=auto: on btrfs or XFS the copy shares blocks until one side changes
    return [Step(("cp", "--archive", "--reflink=auto", "--no-target-directory", str(clone_path), into), timeout)]


def plan_install(config: ImageConfig, path: Path, packages: Sequence[str]) -> list[Step]:
    """apt in a chroot of the image: fetch the lists, install without recommends, drop the downloads."""
    env = {"DEBIAN_FRONTEND": "noninteractive", "APT_LISTCHANGES_FRONTEND": "none"}
    chroot = ("chroot", str(path))
    timeout = config.command_timeout_s
    return [
        Step((*chroot, "apt-get", "-q", "update"), timeout, env),
        Step((*chroot, "apt-get", "-q", "-y", "--no-install-recommends", "install", *packages), timeout, env),
        Step((*chroot, "apt-get", "-q", "clean"), timeout, env),
    ]


def describe_source(source: Source, config: ImageConfig) -> str:
    source.kind()
    if source.release is not None:
        steps = plan_create(config, "x", source)
        return f"debootstrap {source.release} {steps[0].argv[-1]}"
    if source.tarball is not None:
        return f"tarball {source.tarball}"
    return f"clone of {source.clone_of}"


# ---- reading ---------------------------------------------------------------------------------------


def get_image(session: Session, name: str) -> Image:
    row = session.scalar(select(Image).where(Image.name == name))
    if row is None:
        raise NotFound(f"no such image: {name}")
    return row


def list_images(session: Session) -> list[Image]:
    return list(session.scalars(select(Image).order_by(Image.name)))


def history(session: Session, image: Image) -> list[ImageRevision]:
    """Every revision, newest first."""
    query = select(ImageRevision).where(ImageRevision.image_id == image.id).order_by(ImageRevision.number.desc())
    return list(session.scalars(query))


def latest_revisions(session: Session) -> dict[int, ImageRevision]:
    """Each image's current revision row, by image id (the list's files and size)."""
    current = (Image.id == ImageRevision.image_id) & (Image.revision == ImageRevision.number)
    rows = session.execute(select(ImageRevision).join(Image, current)).scalars()
    return {r.image_id: r for r in rows}


def users(session: Session) -> dict[str, list[str]]:
    """Which categories and nodes name each image as their software_image ("category hgx", "node
    node007" for a node's own setting), by image name."""
    out: dict[str, list[str]] = {}
    for category, values in sorted(categories.category_settings(session).items()):
        image = values.get("software_image")
        if image:
            out.setdefault(image, []).append(f"category {category}")
    for node, values in session.execute(select(Node.name, Node.settings).order_by(Node.name)):
        image = (values or {}).get("software_image")
        if image:
            out.setdefault(image, []).append(f"node {node}")
    return out


# ---- changing: the request's part --------------------------------------------------------------


def import_file(config: ImageConfig, tarball: str) -> Path:
    """The file a tarball import reads: `tarball` with its links resolved, which must be a regular file
    inside one of the import directories (image_import_dirs, links resolved too). Tar runs as the
    head's user (root), so without this a request could have it read any file of the head into an
    image that nodes and readers see (`/etc/shadow`, the head's keys). Raises InvalidInput."""
    if not tarball.startswith("/") or "\x00" in tarball:
        raise InvalidInput(f"{tarball[:200]}: not a file on the head (give an absolute path)")
    if not config.import_dirs:
        raise InvalidInput(
            "tarball import is off: an admin lists the directories tarballs may come from in the "
            "image_import_dirs setting"
        )
    real = os.path.realpath(tarball)
    shown = ", ".join(str(d) for d in config.import_dirs)
    for allowed in config.import_dirs:
        root = os.path.realpath(allowed)
        if root not in ("/", real) and os.path.commonpath([real, root]) == root:
            break
    else:
        raise InvalidInput(f"{tarball[:200]} is not inside an import directory ({shown}: image_import_dirs)")
    if not os.path.isfile(real):
        raise InvalidInput(f"{tarball[:200]}: not a file on the head (give an absolute path)")
    return Path(real)


def check_create(session: Session, config: ImageConfig, name: str, source: Source) -> Path | None:
    """Check a new image's name and source without changing anything (what a dry run and the
    request both do); returns the clone's source path. Raises InvalidInput, NotFound (the clone's
    source) or Conflict (the name is taken, by a row or by a directory on disk; the source is busy)."""
    check_name(name)
    source.kind()
    clone_path: Path | None = None
    if source.release is not None:
        if not _RELEASE.match(source.release):
            raise InvalidInput(f"{source.release[:40]!r} is not a release name (e.g. bookworm, noble)")
        if source.mirror is not None and not _MIRROR.match(source.mirror):
            raise InvalidInput("the mirror must be an http://, https:// or file:// URL")
        if source.mirror is not None and not config.mirror_allowed(source.mirror):
            raise InvalidInput(
                f"{source.mirror[:120]} is not an allowed mirror: its packages' scripts would run as root on the "
                "head (an admin lists mirrors in the image_allowed_mirrors setting)"
            )
    elif source.tarball is not None:
        import_file(config, source.tarball)
    elif source.clone_of is not None:
        original = get_image(session, source.clone_of)
        if original.state != "ready":
            raise Conflict(f"image {original.name} is {original.state}: clone it when that ends")
        clone_path = Path(original.path)
    if session.scalar(select(Image.id).where(Image.name == name)) is not None:
        raise Conflict(f"image {name} exists")
    if os.path.lexists(config.path(name)):
        raise Conflict(f"{config.path(name)} exists on disk but is no image: move it away first")
    return clone_path


def begin_create(
    session: Session, clock: Clock, config: ImageConfig, name: str, source: Source, actor: str
) -> tuple[Image, Path | None]:
    """`check_create`, then record the image as `creating`; returns it and, for a clone, the source
    image's path. The unique name holds even between head replicas: the second insert fails. A
    clone's source is held (`hold`), so a change to it that began meanwhile is seen."""
    clone_path = check_create(session, config, name, source)
    if source.clone_of is not None:
        hold(session, [source.clone_of])
    image = Image(
        name=name,
        path=str(config.path(name)),
        source=describe_source(source, config),
        state="creating",
        created_at=to_datetime(clock.now()),
        created_by=actor,
        revision=0,
    )
    session.add(image)
    session.flush()
    return image, clone_path


def begin_change(session: Session, name: str) -> Image:
    """Mark a ready image `changing` for one task. Raises NotFound, or Conflict when another change
    is under way (the update is conditional, so two head replicas cannot both begin one) or while a
    sync or clone reads the image (`readers`): apt rewriting files under an rsync --delete would
    send nodes a half-changed tree. The update comes first: it waits for a sync that holds the row
    (`hold`) to commit, so the readers looked up after it include that sync's task."""
    image = get_image(session, name)
    expected = image.state if _abandoned(session, image) else "ready"
    done = session.execute(update(Image).where(Image.id == image.id, Image.state == expected).values(state="changing"))
    if getattr(done, "rowcount", 0) != 1:
        raise Conflict(f"image {name} is {image.state}: wait for that to end")
    _refuse_while_read(session, name, "changed")
    session.refresh(image)
    return image


def readers(session: Session, name: str) -> list[int]:
    """The unfinished tasks that read image `name`: syncs (and their dry runs) whose params name it
    among their images, clones whose source it is. Few tasks are ever unfinished, so their params
    are read here rather than queried as JSON (which SQLite and PostgreSQL spell differently)."""
    rows = session.execute(
        select(Task.id, Task.kind, Task.params).where(Task.kind.in_(READING_KINDS), Task.state.in_(UNFINISHED_STATES))
    )
    out = []
    for task_id, kind, params in rows:
        values = params or {}
        if name in (values.get("images") or []) or (kind == "image.clone" and values.get("clone_of") == name):
            out.append(task_id)
    return sorted(out)


def _refuse_while_read(session: Session, name: str, what: str) -> None:
    reading = readers(session, name)
    if reading:
        shown = ", ".join(str(t) for t in reading[:5])
        raise Conflict(f"image {name} is being read by task {shown} (a sync or clone): it can be {what} when that ends")


def hold(session: Session, names: Sequence[str]) -> None:
    """Check that each image is ready and lock its row until the caller commits (an update that
    changes nothing): a sync's or clone's request calls this before recording its task, so a
    `begin_change` or `remove_image` on another head replica either ends first (and this raises
    Conflict) or waits and then sees the task. Raises NotFound or Conflict."""
    for name in sorted(set(names)):
        image = get_image(session, name)
        done = session.execute(update(Image).where(Image.id == image.id, Image.state == "ready").values(state="ready"))
        if getattr(done, "rowcount", 0) != 1:
            session.refresh(image)
            raise Conflict(f"image {name} is {image.state}: wait for that to end")


def attach_task(session: Session, image: Image, task_id: int) -> None:
    image.task_id = task_id


def _abandoned(session: Session, image: Image) -> bool:
    """An image left `creating` or `changing` by a task that ended without finishing it (its head
    stopped: the next head marks such tasks interrupted). It may be changed or removed again."""
    if image.state == "ready" or image.task_id is None:
        return False
    task = session.get(Task, image.task_id)
    return task is None or task.state in FINISHED_STATES


def remove_image(session: Session, name: str, config: ImageConfig) -> Path:
    """Forget an image; returns its directory, for the caller to delete once this has committed.
    Raises NotFound, or Conflict while a task works on it, while a sync or clone reads it, or while
    a category or node names it. The row is deleted before the readers are looked up, for the same
    reason `begin_change` updates first."""
    image = get_image(session, name)
    if image.state != "ready" and not _abandoned(session, image):
        raise Conflict(f"image {name} is {image.state}: remove it when that ends")
    used = users(session).get(name)
    if used:
        raise Conflict(f"image {name} is the software_image of {', '.join(used[:5])}: change that first")
    path = Path(image.path)
    session.delete(image)
    session.flush()
    _refuse_while_read(session, name, "removed")
    asset_store.forget_image(session, name)
    session.flush()
    return path


def delete_tree(path: Path, config: ImageConfig) -> None:
    """Delete an image's directory and its exclude file: moved aside first, so a half-deleted tree
    never sits under an image's name."""
    shutil.rmtree(config.building(path.name), ignore_errors=True)
    # first, and whether or not the tree is there: a later image of this name must not inherit it
    config.exclude_file(path.name).unlink(missing_ok=True)
    if not os.path.lexists(path):
        return
    doomed = path.with_name(f".{path.name}.removing")
    shutil.rmtree(doomed, ignore_errors=True)
    os.rename(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def record_revision(
    session: Session,
    clock: Clock,
    image: Image,
    tree: TreeDigest,
    change: str,
    actor: str,
    task_id: int | None = None,
) -> ImageRevision:
    """A new revision of `image` with the tree's digest after `change`."""
    image.revision += 1
    image.digest = tree.digest
    row = ImageRevision(
        image_id=image.id,
        number=image.revision,
        digest=tree.digest,
        change=change[:2048],
        actor=actor,
        at=to_datetime(clock.now()),
        files=tree.files,
        bytes=tree.bytes,
        task_id=task_id,
    )
    session.add(row)
    session.flush()
    # What the revision holds, for the CVE report's images (assets): read from the tree, nothing run.
    distro, packages = read_image(Path(image.path))
    asset_store.report_image_software(session, clock, image.name, image.revision, distro, packages)
    return row


def rescan(session: Session, clock: Clock, image: Image, actor: str) -> ImageRevision | None:
    """Record a revision when the tree changed on disk outside gpufleet (an admin's edit in a
    chroot); None when it did not. Only for a ready image: a task's change records its own."""
    if image.state != "ready":
        return None
    tree = tree_digest(Path(image.path))
    if tree.digest == image.digest:
        return None
    return record_revision(session, clock, image, tree, "changed on disk outside gpufleet", actor)


# ---- changing: the task's part -------------------------------------------------------------------


def run_create(
    sessions: sessionmaker[Session],
    clock: Clock,
    runner: Runner,
    config: ImageConfig,
    *,
    name: str,
    source: Source,
    clone_path: Path | None,
    actor: str,
    task_id: int | None,
) -> str:
    """Build the image in its building directory, move it into place and record revision 1. On
    failure the half-built tree and the image's row are removed (the task keeps the reason).
    Raises CommandFailed (or OSError) with what went wrong."""
    building = config.building(name)
    copied_excludes = False
    try:
        config.images_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(building, ignore_errors=True)  # a crashed build's leftovers
        if source.tarball is not None:
            building.mkdir(mode=0o755)
            # tar reads the file checked now, links resolved: not whatever the path names by then
            source = replace(source, tarball=str(import_file(config, source.tarball)))
        for step in plan_create(config, name, source, clone_path):
            runner.run(step)
        if source.kind() == "clone" and clone_path is not None:
            original_excludes = config.exclude_file(clone_path.name)
            if original_excludes.exists():
                shutil.copy2(original_excludes, config.exclude_file(name))
                copied_excludes = True
        tree = tree_digest(building)
        os.rename(building, config.path(name))
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        if copied_excludes:  # ours: an image that never came to be has no exclusions
            config.exclude_file(name).unlink(missing_ok=True)
        with transaction(sessions) as session:
            session.execute(delete(Image).where(Image.name == name, Image.state == "creating"))
        raise
    with transaction(sessions) as session:
        image = get_image(session, name)
        image.state = "ready"
        image.task_id = None
        record_revision(session, clock, image, tree, f"created from {image.source}", actor, task_id)
    return f"image {name}: revision 1, {tree.files} files, {tree.bytes / 1e6:.1f} MB"


def run_install(
    sessions: sessionmaker[Session],
    clock: Clock,
    runner: Runner,
    config: ImageConfig,
    *,
    name: str,
    packages: Sequence[str],
    actor: str,
    task_id: int | None,
) -> str:
    """Install packages into a `changing` image with chroot + apt, the host's resolv.conf and a
    policy-rc.d that keeps services from starting, both put back after (an image without etc/ or
    usr/sbin/ gets neither). Records a revision when the
    tree changed (a failed install may have changed it halfway: that is recorded too, as such), then
    sets the image ready again. Raises CommandFailed with apt's last words."""
    with transaction(sessions, readonly=True) as session:
        path = Path(get_image(session, name).path)
    failure: BaseException | None = None
    try:
        with _chroot_prepared(path):
            for step in plan_install(config, path, packages):
                runner.run(step)
    except BaseException as exc:
        failure = exc
    tree = tree_digest(path)
    listed = " ".join(packages)
    with transaction(sessions) as session:
        image = get_image(session, name)
        if tree.digest != image.digest:
            change = f"installed {listed}" if failure is None else f"failed install of {listed} (partly changed)"
            record_revision(session, clock, image, tree, change, actor, task_id)
        image.state = "ready"
        image.task_id = None
        revision = image.revision
    if failure is not None:
        raise failure
    return f"image {name}: revision {revision}, installed {listed}"


def release(sessions: sessionmaker[Session], clock: Clock, name: str, task_id: int, reason: str) -> None:
    """Undo what a request marked when its task's thread could not start: a `changing` image is ready
    again, a `creating` one (no tree yet) is forgotten, and the task is failed (`fail_unstarted`)."""
    with transaction(sessions) as session:
        owned = (Image.name == name) & (Image.task_id == task_id)
        session.execute(update(Image).where(owned, Image.state == "changing").values(state="ready", task_id=None))
        session.execute(delete(Image).where(owned, Image.state == "creating"))
        fail_unstarted(session, clock, task_id, reason)


def fail_unstarted(session: Session, clock: Clock, task_id: int, reason: str) -> None:
    """Fail a task whose thread could not start: left queued, a sync or clone would hold its images
    (`readers`) for good."""
    task = session.get(Task, task_id)
    if task is not None and task.state in UNFINISHED_STATES:
        tasks.finish(session, clock, task_id, error=f"could not start: {reason}"[:1024], summary=None)


class _chroot_prepared:
    """The host's resolv.conf and a deny-all policy-rc.d in the image while apt runs; whatever was
    there before is put back after, links included. Refuses an image whose etc/ or usr/sbin/ leads
    out of the image (a link to the head's own /etc would have us overwrite it).

    What was there is kept beside it as `NAME.gpufleet-saved`, and where nothing was, an empty
    `NAME.gpufleet-absent` says so: a head that crashed mid-install leaves either behind, and the
    next install first puts the image back as it was (else it would save our file over the
    original, and leave services unable to start on every node synced from it)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files = [
            (root / "etc" / "resolv.conf", _host_resolv_conf(), 0o644),
            (root / "usr" / "sbin" / "policy-rc.d", POLICY_RC_D, 0o755),
        ]
        self.saved: list[Path] = []  # the files put in place, each with its backup or absent-marker

    @staticmethod
    def _backup(path: Path) -> Path:
        return path.with_name(path.name + ".gpufleet-saved")

    @staticmethod
    def _absent(path: Path) -> Path:
        return path.with_name(path.name + ".gpufleet-absent")

    @classmethod
    def _put_back(cls, path: Path) -> None:
        """The image's own file back in place of ours (or none, where it had none)."""
        backup, absent = cls._backup(path), cls._absent(path)
        ours = os.path.lexists(backup) or os.path.lexists(absent)
        if ours and os.path.lexists(path) and not os.path.isdir(path):
            os.unlink(path)
        if os.path.lexists(backup):
            os.rename(backup, path)
        if os.path.lexists(absent):
            os.unlink(absent)

    def __enter__(self) -> None:
        real_root = os.path.realpath(self.root)
        present = [(path, text, mode) for path, text, mode in self.files if os.path.lexists(path.parent)]
        for path, _, _ in present:  # no usr/sbin: no invoke-rc.d either, nothing to keep from starting
            parent = os.path.realpath(path.parent)
            if os.path.commonpath([real_root, parent]) != real_root or not os.path.isdir(parent):
                raise CommandFailed(f"{path.parent} is not a directory inside the image: not an installable image")
        try:
            self._prepare(present)
        except BaseException:
            self.__exit__()
            raise

    def _prepare(self, present: list[tuple[Path, str, int]]) -> None:
        for path, text, mode in present:
            self._put_back(path)  # a crashed install's leftovers
            if os.path.lexists(path):
                os.rename(path, self._backup(path))  # a link is moved, never followed
            else:
                os.close(os.open(self._absent(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
            self.saved.append(path)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
            os.chmod(path, mode)

    def __exit__(self, *exc: Any) -> None:
        for path in reversed(self.saved):
            self._put_back(path)


def _host_resolv_conf() -> str:
    try:
        return Path("/etc/resolv.conf").read_text()
    except OSError:
        return ""
