"""The model and dataset registries, who may use what, and what each node's cache holds.

Models (checkpoints) and datasets are one kind of thing to the cluster: a file or tree at a location
the nodes can read, with a checksum (`protocol.artifacts.digest`). A job names a model and datasets;
submission resolves them here (refusing a project that may not use one) and copies what the agent needs
into the job (`StageRef`s), so re-registering or removing an artifact never changes a queued job.

Access: an artifact owned by a project is used by that project's jobs and those of the projects in
`shared_with`; one with no project by every job. Listing and showing are open to every reader, as
knowing that a dataset exists is how someone asks its owners for it.

Node caches: each agent reports its whole cache (`NodeCache`) after connecting and after each stage;
`record_cache` replaces that node's rows. The scheduler reads them for data locality (`cached_by_node`).
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Collection, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpufleet.auth.projects import get_project
from gpufleet.core import addresses
from gpufleet.core.clock import Clock, to_datetime
from gpufleet.core.errors import Conflict, Forbidden, InvalidInput, NotFound
from gpufleet.inventory.models import Node
from gpufleet.jobs.models import Artifact, NodeArtifact
from gpufleet.jobs.schemas import ArtifactIn, ArtifactOut, NodeArtifactOut
from gpufleet.protocol.artifacts import ArtifactError, NodeCache, StageRef, check_source, local_path

KINDS = ("model", "dataset")


def register(
    session: Session, clock: Clock, actor: str, spec: ArtifactIn, allowed_dirs: Sequence[Path] = ()
) -> Artifact:
    """Record a model or dataset. InvalidInput for a location no node should stage from
    (`check_location`), NotFound for an unknown project, Conflict for a name and version that exist."""
    check_location(spec.location, allowed_dirs)
    for name in {spec.project, *spec.shared_with} - {None}:
        get_project(session, str(name))  # NotFound for an unknown project
    row = Artifact(
        kind=spec.kind,
        name=spec.name,
        version=spec.version,
        framework=spec.framework,
        format=spec.format,
        size_bytes=spec.size_bytes,
        sha256=spec.sha256,
        licence=spec.licence,
        source=spec.source,
        location=spec.location,
        project=spec.project,
        shared_with=sorted(set(spec.shared_with) - {spec.project}),
        description=spec.description,
        created_by=actor,
        created_at=to_datetime(clock.now()),
    )
    try:
        with session.begin_nested():
            session.add(row)
            session.flush()
    except IntegrityError:
        raise Conflict(f"{spec.kind} {spec.name}:{spec.version} exists; register another version") from None
    return row


def check_location(location: str, allowed_dirs: Sequence[Path] = ()) -> None:
    """Refuse a location the agents must not be sent to, with InvalidInput saying why:
    - a path (or file:// URI) holding '.' or '..' parts, or, when `allowed_dirs` (the artifact_dirs
      setting) names directories, one outside them (links resolved as the head sees them);
    - an http(s) URL whose host is a loopback, link-local, unspecified or multicast address, or a
      cloud metadata service: every agent would fetch it from inside the node (169.254.169.254 answers
      with the node's cloud credentials), so a registered URL would be a request forged on each node.
    A host name is not resolved here; `localhost` and its subdomains are refused by name."""
    try:
        check_source(location)
    except ArtifactError as exc:
        raise InvalidInput(str(exc)) from None
    path = local_path(location)
    if path is not None:
        _check_path(location, path, allowed_dirs)
    else:
        _check_host(location)


def _check_path(location: str, path: Path, allowed_dirs: Sequence[Path]) -> None:
    raw = location.removeprefix("file://")  # as given: pathlib drops '.' parts silently
    if any(part in (".", "..") for part in raw.split("/")):
        raise InvalidInput(f"{location[:200]}: a location may not hold '.' or '..' parts (name the path itself)")
    if not allowed_dirs:
        return
    real = os.path.realpath(path)
    for allowed in allowed_dirs:
        root = os.path.realpath(allowed)
        if root not in ("/", real) and os.path.commonpath([real, root]) == root:
            return
    shown = ", ".join(str(d) for d in allowed_dirs)
    raise InvalidInput(f"{location[:200]} is not inside an artifact directory ({shown}: artifact_dirs)")


def _check_host(location: str) -> None:
    try:
        host = urlsplit(location).hostname or ""
    except ValueError as exc:  # a malformed IPv6 literal, a bad port
        raise InvalidInput(f"{location[:200]}: not a URL ({exc})") from None
    if not host:
        raise InvalidInput(f"{location[:200]}: the URL names no host")
    why = addresses.refused_host(host)
    if why is not None:
        raise InvalidInput(f"{location[:200]}: {why}; give the object store's address")


def listing(session: Session, kind: str) -> list[Artifact]:
    return list(session.scalars(select(Artifact).where(Artifact.kind == kind).order_by(Artifact.name, Artifact.id)))


def get(session: Session, kind: str, ref: str) -> Artifact:
    """`name:version`, or `name` for the version registered last. NotFound otherwise."""
    name, _, version = ref.partition(":")
    query = select(Artifact).where(Artifact.kind == kind, Artifact.name == name)
    if version:
        query = query.where(Artifact.version == version)
    found = session.scalars(query.order_by(Artifact.id.desc()).limit(1)).first()
    if found is None:
        raise NotFound(f"no {kind} {ref} (gpufleet {kind} list shows them)")
    return found


def remove(session: Session, kind: str, ref: str) -> Artifact:
    """Remove one version (a bare name is refused). Queued jobs keep what they copied; node caches
    keep their copies until evicted."""
    name, _, version = ref.partition(":")
    if not version:
        raise InvalidInput(f"name the version to remove: {name}:VERSION")
    row = get(session, kind, ref)
    session.delete(row)
    return row


def may_use(artifact: Artifact, project: str | None) -> bool:
    return artifact.project is None or (project is not None and project in (artifact.project, *artifact.shared_with))


def for_job(session: Session, project: str | None, model: str | None, datasets: list[str]) -> list[StageRef]:
    """What a job of `project` stages: its model, then its datasets. NotFound for an unknown one,
    Forbidden for one its project may not use."""
    wanted = ([("model", model)] if model else []) + [("dataset", ref) for ref in datasets]
    out: list[StageRef] = []
    for kind, ref in wanted:
        row = get(session, kind, ref)
        if not may_use(row, project):
            owner = f"project {row.project}"
            if row.shared_with:
                owner += f" and {', '.join(row.shared_with)}"
            who = f"project {project}" if project else "a job with no project"
            raise Forbidden(f"{kind} {row.ref} belongs to {owner}; {who} may not use it")
        stage = StageRef.model_validate(
            {
                "kind": kind,
                "name": row.name,
                "version": row.version,
                "sha256": row.sha256,
                "size_bytes": row.size_bytes,
                "source": row.location,
            }
        )
        if all(s.sha256 != stage.sha256 for s in out):
            out.append(stage)
    return out


def record_cache(session: Session, node_id: int, report: NodeCache) -> None:
    """Replace what `node_id`'s cache holds with its agent's report."""
    session.execute(delete(NodeArtifact).where(NodeArtifact.node_id == node_id))
    session.add_all(
        NodeArtifact(
            node_id=node_id,
            sha256=e.sha256,
            size_bytes=e.size_bytes,
            copied_at=to_datetime(e.copied_at),
            last_used_at=to_datetime(e.last_used_at),
            uses=e.uses,
        )
        for e in report.entries
    )


def cached_by_node(session: Session, wanted: Collection[str]) -> dict[int, frozenset[str]]:
    """Which of the `wanted` checksums each node's cache holds, for the scheduler's data locality."""
    if not wanted:
        return {}
    found: dict[int, set[str]] = defaultdict(set)
    query = select(NodeArtifact.node_id, NodeArtifact.sha256).where(NodeArtifact.sha256.in_(list(wanted)))
    for node_id, sha in session.execute(query):
        found[node_id].add(sha)
    return {node: frozenset(shas) for node, shas in found.items()}


def out(session: Session, row: Artifact, projects: set[str] | None = None) -> ArtifactOut:
    """The artifact as the API shows it to a reader in `projects` (None: one who sees everything). Its
    location is shown only to readers whose project may use it: an http(s) location may be a presigned
    URL, which works as a password."""
    nodes = session.scalars(
        select(Node.name)
        .join(NodeArtifact, NodeArtifact.node_id == Node.id)
        .where(NodeArtifact.sha256 == row.sha256)
        .order_by(Node.name)
    )
    shown = ArtifactOut.model_validate(row).model_copy(update={"nodes": list(nodes)})
    if projects is not None and not any(may_use(row, p) for p in projects | {None}):
        shown = shown.model_copy(update={"location": "", "location_hidden": True})
    return shown


def node_cache(session: Session, node_id: int) -> list[NodeArtifactOut]:
    """A node's cache, newest use first, each entry with the registered artifacts it holds."""
    rows = list(
        session.scalars(
            select(NodeArtifact).where(NodeArtifact.node_id == node_id).order_by(NodeArtifact.last_used_at.desc())
        )
    )
    names: dict[str, list[str]] = defaultdict(list)
    shas = [r.sha256 for r in rows]
    for kind, name, version, sha in session.execute(
        select(Artifact.kind, Artifact.name, Artifact.version, Artifact.sha256).where(Artifact.sha256.in_(shas))
    ):
        names[sha].append(f"{kind} {name}:{version}")
    return [
        NodeArtifactOut(
            sha256=r.sha256,
            size_bytes=r.size_bytes,
            copied_at=r.copied_at,
            last_used_at=r.last_used_at,
            uses=r.uses,
            artifacts=sorted(names[r.sha256]),
        )
        for r in rows
    ]
