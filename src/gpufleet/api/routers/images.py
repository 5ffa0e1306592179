"""Software images (create, clone, install packages, history) and image sync (sync, dry run, drift).

Building and changing an image, and syncing nodes, run as tasks: the request checks everything it
can, marks the image, and returns 202 with the task (`GET /api/v1/tasks/{id}` follows it). A tarball
to import is a path on the head, not an upload: images are hundreds of MB to GB, far over the API's
request limit, and the head reads them where an admin put them (`podman export` writes one there).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from gpufleet.api.context import HeadContext
from gpufleet.api.deps import Ctx, PermissionCheck, allow, tx
from gpufleet.auth.policy import Permission
from gpufleet.auth.schemas import Principal
from gpufleet.core import hostlist
from gpufleet.core.errors import InvalidInput, NotFound
from gpufleet.inventory import categories
from gpufleet.inventory import service as inventory
from gpufleet.inventory.models import Node
from gpufleet.provisioning import images, sync
from gpufleet.provisioning.image_models import Image, ImageRevision
from gpufleet.provisioning.images import ImageConfig, Source
from gpufleet.provisioning.runner import ProcessRunner, Runner
from gpufleet.tasks import service as tasks
from gpufleet.tasks.runner import TaskContext
from gpufleet.tasks.schemas import TaskOut

router = APIRouter(tags=["images"])
Read = Annotated[Principal, allow(Permission.IMAGES_READ)]
Write = Annotated[Principal, allow(Permission.IMAGES_WRITE)]
DryRun = Annotated[Principal, allow(Permission.IMAGES_READ, reads_only=True)]  # runs nothing, records nothing
ImageName = Annotated[str, Field(min_length=1, max_length=63)]


class ImageIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: ImageName
    debootstrap: str | None = Field(None, max_length=32, description="a release to debootstrap: bookworm, noble, ...")
    mirror: str | None = Field(None, max_length=512, description="the package mirror (default: the setting's)")
    tarball: str | None = Field(
        None, max_length=1024, description="a tar file on the head to import (e.g. from podman export)"
    )


class CloneIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: ImageName = Field(description="the new image")


class InstallIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    packages: list[Annotated[str, Field(max_length=260)]] = Field(min_length=1, max_length=images.MAX_PACKAGES)


class PlanIn(BaseModel):
    """What a change would run (the CLI's --dry-run): a new image (name and one source) or an
    install (name and packages)."""

    model_config = ConfigDict(extra="forbid")

    name: ImageName
    debootstrap: str | None = Field(None, max_length=32)
    mirror: str | None = Field(None, max_length=512)
    tarball: str | None = Field(None, max_length=1024)
    clone_of: ImageName | None = None
    packages: list[Annotated[str, Field(max_length=260)]] | None = Field(None, max_length=images.MAX_PACKAGES)


class PlanOut(BaseModel):
    steps: list[str] = Field(description="each program as a shell would show it (nothing is run through a shell)")
    argv: list[list[str]]


class ImageOut(BaseModel):
    name: str
    path: str
    source: str
    state: str
    revision: int
    digest: str | None
    files: int | None
    bytes: int | None
    created_at: datetime
    created_by: str
    task_id: int | None
    used_by: list[str] = Field(description="categories and nodes whose software_image it is")


class RevisionOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    number: int
    digest: str
    change: str
    actor: str
    at: datetime
    files: int
    bytes: int
    task_id: int | None


class ImageDetail(ImageOut):
    history: list[RevisionOut]
    excludes: list[str] = Field(description="the image's own exclude file, beyond the built-in exclusions")


class SyncIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    nodes: str | None = Field(None, max_length=4096, description="a hostlist, e.g. node[001-016]")
    category: str | None = Field(None, max_length=64, description="every node of a category")
    image: ImageName | None = Field(None, description="the image to sync (default: each node's software_image)")
    target: str | None = Field(
        None, max_length=512, description="where to write (default: each node's sync_target); {node}, {address}"
    )
    dry_run: bool = Field(False, description="list what would change on each node; change nothing")
    limit: int | None = Field(None, ge=1, le=1000, description="nodes written at once (default: image_sync_limit)")


class DriftOut(BaseModel):
    node: str
    image: str
    revision: int
    target: str
    in_line: bool
    differs: list[str]
    missing: list[str]
    extra: list[str]
    attributes: list[str]


def _runner(request: Request) -> Runner:
    """The real program runner; a test may put its own in `app.state.image_runner`."""
    custom: Runner | None = getattr(request.app.state, "image_runner", None)
    return custom or ProcessRunner()


def _config(ctx: HeadContext) -> ImageConfig:
    return ImageConfig.of(ctx.settings)


def _out(image: Image, revision: ImageRevision | None, used_by: list[str]) -> ImageOut:
    return ImageOut(
        name=image.name,
        path=image.path,
        source=image.source,
        state=image.state,
        revision=image.revision,
        digest=image.digest,
        files=revision.files if revision else None,
        bytes=revision.bytes if revision else None,
        created_at=image.created_at,
        created_by=image.created_by,
        task_id=image.task_id,
        used_by=used_by,
    )


def _start(
    ctx: HeadContext, task: TaskOut, work: Callable[[TaskContext], str | None], image: str | None = None
) -> TaskOut:
    """Start the task's thread. When it cannot start, undo what the request marked: the task is
    failed (a queued sync or clone would hold its images for good) and `image`, marked `creating` or
    `changing` for this task, is forgotten or ready again."""
    try:
        ctx.tasks.start(task.id, work, task.params)
    except BaseException as exc:
        if image is not None:
            images.release(ctx.sessions, ctx.clock, image, task.id, str(exc) or type(exc).__name__)
        else:
            with tx(ctx) as db:
                images.fail_unstarted(db, ctx.clock, task.id, str(exc) or type(exc).__name__)
        raise
    return task


@router.get("/images")
def list_images(_: Read, ctx: Ctx) -> list[ImageOut]:
    """Every image with its current revision, size and users."""
    with tx(ctx, readonly=True) as db:
        latest = images.latest_revisions(db)
        used = images.users(db)
        return [_out(i, latest.get(i.id), used.get(i.name, [])) for i in images.list_images(db)]


@router.get("/images/{name}")
def show_image(name: str, _: Read, ctx: Ctx) -> ImageDetail:
    """One image with its history (newest first)."""
    with tx(ctx, readonly=True) as db:
        image = images.get_image(db, name)
        revisions = images.history(db, image)
        current = next((r for r in revisions if r.number == image.revision), None)
        base = _out(image, current, images.users(db).get(name, []))
    exclude_file = _config(ctx).exclude_file(name)
    excludes = exclude_file.read_text().splitlines() if exclude_file.is_file() else []
    return ImageDetail(
        **base.model_dump(),
        history=[RevisionOut.model_validate(r) for r in revisions],
        excludes=[line for line in excludes if line.strip() and not line.startswith("#")],
    )


@router.post("/images/plans")
def plan_change(body: PlanIn, request: Request, _: DryRun, ctx: Ctx) -> PlanOut:
    """The programs a create, clone or install would run, checked as the change itself would be;
    nothing runs and nothing is recorded."""
    config = _config(ctx)
    request.state.audit_target = f"dry run: image {body.name}"
    with tx(ctx, readonly=True) as db:
        if body.packages is not None:
            packages = images.check_packages(body.packages)
            steps = images.plan_install(config, Path(images.get_image(db, body.name).path), packages)
        else:
            source = Source(body.debootstrap, body.mirror, body.tarball, body.clone_of)
            clone_path = images.check_create(db, config, body.name, source)
            steps = images.plan_create(config, body.name, source, clone_path)
    return PlanOut(steps=[s.shown() for s in steps], argv=[list(s.argv) for s in steps])


def _create(request: Request, ctx: HeadContext, who: Principal, name: str, source: Source, kind: str) -> TaskOut:
    config = _config(ctx)
    runner = _runner(request)
    with tx(ctx) as db:
        image, clone_path = images.begin_create(db, ctx.clock, config, name, source, who.actor)
        # clone_of: the source is read while the task runs (images.readers)
        clone_of = {"clone_of": source.clone_of} if source.clone_of is not None else {}
        out = _image_task(db, ctx, who, image, kind, {"image": name, "source": image.source} | clone_of)
        request.state.audit_target = f"task {out.id}: image {name} from {out.params['source']}"[:400]
    sessions, clock = ctx.sessions, ctx.clock

    def create(task_id: int) -> str:
        return images.run_create(
            sessions,
            clock,
            runner,
            config,
            name=name,
            source=source,
            clone_path=clone_path,
            actor=who.actor,
            task_id=task_id,
        )

    return _start(ctx, out, _one_image(name, create), image=name)


def _image_task(
    db: Session, ctx: HeadContext, who: Principal, image: Image, kind: str, params: dict[str, Any]
) -> TaskOut:
    """The task of a change to one image (its only target), attached to the image it holds."""
    task = tasks.create(db, ctx.clock, kind=kind, targets=[image.name], params=params, created_by=who.actor)
    images.attach_task(db, image, task.id)
    return TaskOut.of(task)


def _one_image(name: str, run: Callable[[int], str]) -> Callable[[TaskContext], str]:
    """A task's work on one image (its only target): `run(task_id)`, its summary the target's detail."""

    def work(task_ctx: TaskContext) -> str:
        try:
            summary = run(task_ctx.task_id)
        except Exception as exc:
            task_ctx.finished(name, False, str(exc))
            raise
        task_ctx.finished(name, True, summary)
        return summary

    return work


@router.post("/images", status_code=202)
def create_image(body: ImageIn, request: Request, who: Write, ctx: Ctx) -> TaskOut:
    """Create an image by debootstrap of a release, or from a tarball on the head, as a task."""
    source = Source(release=body.debootstrap, mirror=body.mirror, tarball=body.tarball)
    return _create(request, ctx, who, body.name, source, "image.create")


@router.post("/images/{name}/clone", status_code=202)
def clone_image(name: str, body: CloneIn, request: Request, who: Write, ctx: Ctx) -> TaskOut:
    """Copy an image to a new name, as a task (its history starts anew, naming the original)."""
    return _create(request, ctx, who, body.name, Source(clone_of=name), "image.clone")


@router.post("/images/{name}/install", status_code=202)
def install_packages(name: str, body: InstallIn, request: Request, who: Write, ctx: Ctx) -> TaskOut:
    """Install packages into an image with chroot + apt, as a task; the change is a new revision."""
    config = _config(ctx)
    runner = _runner(request)
    packages = images.check_packages(body.packages)
    with tx(ctx) as db:
        image = images.begin_change(db, name)
        out = _image_task(db, ctx, who, image, "image.install", {"image": name, "packages": packages})
        request.state.audit_target = f"task {out.id}: image {name}: install {' '.join(packages)}"[:400]
    sessions, clock = ctx.sessions, ctx.clock

    def install(task_id: int) -> str:
        return images.run_install(
            sessions, clock, runner, config, name=name, packages=packages, actor=who.actor, task_id=task_id
        )

    return _start(ctx, out, _one_image(name, install), image=name)


@router.delete("/images/{name}", status_code=204)
def remove_image(name: str, request: Request, _: Write, ctx: Ctx) -> Response:
    """Remove an image and its tree. Refused while a task works on it or a category or node uses it."""
    request.state.audit_target = f"image {name}"
    config = _config(ctx)
    with tx(ctx) as db:
        path = images.remove_image(db, name, config)
    images.delete_tree(path, config)
    return Response(status_code=204)


def _nodes(db: Any, nodes: str | None, category: str | None) -> list[Node]:
    """The nodes of a hostlist or a category, as Ansible runs choose them: an unknown node or
    category is NotFound (404), an empty one InvalidInput."""
    if (nodes is None) == (category is None):
        raise InvalidInput("name the nodes (a hostlist) or a category, not both")
    if nodes is not None:
        names = inventory.expand_names([nodes])
        found = inventory.list_nodes(db, [nodes])
        missing = sorted(set(names) - {n.name for n in found})
        if missing:
            raise NotFound(f"no such node: {hostlist.collect(missing)}")
        return found
    categories.get_category(db, category or "")  # NotFound
    members = categories.node_names(db, category or "")
    if not members:
        raise InvalidInput(f"category {category} has no nodes")
    return inventory.list_nodes(db, members)


def _protected(ctx: HeadContext) -> list[Path]:
    return [_config(ctx).images_dir, ctx.settings.data_dir]


def _plan(db: Any, ctx: HeadContext, found: list[Node], image: str | None, target: str | None) -> list[sync.NodePlan]:
    return sync.plan(
        db, found, image=image, target=target, protected=_protected(ctx), local_root=ctx.settings.image_sync_local_root
    )


@router.post("/sync", status_code=202)
def sync_nodes(body: SyncIn, request: Request, who: Write, ctx: Ctx) -> TaskOut:
    """Bring nodes in line with their image by rsync, or with dry_run list what that would change
    on each, as a task: at most `limit` nodes at once, each node's result with what changed."""
    image_config = _config(ctx)
    config = sync.SyncConfig.of(ctx.settings)
    runner = _runner(request)
    limit = body.limit or config.limit
    with tx(ctx) as db:
        found = _nodes(db, body.nodes, body.category)
        plans = _plan(db, ctx, found, body.image, body.target)
        task = sync.create_task(db, ctx.clock, plans, dry_run=body.dry_run, limit=limit, actor=who.actor)
        out = TaskOut.of(task)
        shown = hostlist.collect([p.node for p in plans])
        request.state.audit_target = f"task {out.id}: {'dry run of ' if body.dry_run else ''}image sync {shown}"[:400]
    work = sync.work(
        ctx.sessions,
        ctx.clock,
        runner,
        image_config,
        config,
        plans=plans,
        dry_run=body.dry_run,
        limit=limit,
        actor=who.actor,
    )
    return _start(ctx, out, work)


@router.get("/nodes/{name}/drift")
def node_drift(
    name: str,
    request: Request,
    who: Read,
    ctx: Ctx,
    image: Annotated[
        str | None, Query(max_length=63, description="default: the node's software_image; needs images:write")
    ] = None,
    target: Annotated[
        str | None, Query(max_length=512, description="default: the node's sync_target; needs images:write")
    ] = None,
) -> DriftOut:
    """Files on the node that differ from its image by content, are missing or extra, or differ in
    mode or owner (rsync -n --checksum: it reads every file on both sides, so it takes a while; it
    runs in the request, with the image_drift_timeout_s timeout). Naming another image or target
    than the node's needs images:write: it has the head's rsync read any place it is told to."""
    if image is not None or target is not None:
        PermissionCheck(Permission.IMAGES_WRITE).check(request, who)
    with tx(ctx, readonly=True) as db:
        node = inventory.get_node(db, name)
        (node_plan,) = _plan(db, ctx, [node], image, target)
    report = sync.node_drift(ctx.sessions, _runner(request), _config(ctx), sync.SyncConfig.of(ctx.settings), node_plan)
    return DriftOut(**vars(report), in_line=report.in_line)
