"""Runtime environments: the catalog of images and Python environments jobs run in, and which nodes can.

An environment is named and versioned ("pytorch:24.05"); a job names one as `name:version`, or `name`
for the version added last. Its CUDA version sets the NVIDIA driver it needs (`protocol.cuda`), unless the
environment names that driver itself. A node's driver is the oldest its GPUs report (the agent's NVML
inventory); a node whose driver is unknown runs no job that needs one, because a job that fails on a
too-old driver fails late and obscurely (`CUDA driver version is insufficient for CUDA runtime version`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpufleet.core.clock import Clock, to_datetime
from gpufleet.core.errors import Conflict, InvalidInput, NotFound
from gpufleet.inventory.models import Gpu, Node
from gpufleet.jobs.models import Environment
from gpufleet.jobs.scheduler import node_schedulable
from gpufleet.jobs.schemas import EnvironmentIn
from gpufleet.protocol.cuda import DriverVersion, driver_for_cuda, format_driver, newest_cuda, parse_driver
from gpufleet.protocol.jobs import DEFAULT_PATH


def add(session: Session, clock: Clock, actor: str, spec: EnvironmentIn) -> Environment:
    """Add `spec` to the catalog. Conflict if its name and version exist; InvalidInput for a CUDA version
    the driver table lacks when no driver is given, or a Python prefix that is not a plain path."""
    if spec.python_prefix is not None:
        check_prefix(spec.python_prefix)
    if spec.min_driver:
        driver: DriverVersion | None = parse_driver(spec.min_driver)
    else:
        driver = driver_for_cuda(spec.cuda) if spec.cuda else None  # CPU only: no driver needed
    env = Environment(
        name=spec.name,
        version=spec.version,
        image=spec.image,
        python_prefix=spec.python_prefix,
        cuda=spec.cuda,
        pytorch=spec.pytorch,
        cudnn=spec.cudnn,
        nccl=spec.nccl,
        min_driver=format_driver(driver) if driver is not None else None,
        driver_given=spec.min_driver is not None,
        description=spec.description,
        created_by=actor,
        created_at=to_datetime(clock.now()),
    )
    try:
        with session.begin_nested():  # the row inside the savepoint: a duplicate undoes it alone
            session.add(env)
            session.flush()
    except IntegrityError:
        raise Conflict(f"environment {spec.name}:{spec.version} exists; add another version") from None
    return env


def check_prefix(prefix: str) -> None:
    """A Python prefix is the plain absolute path of a venv or conda prefix on the nodes: no '.' or
    '..' parts, no empty ones, not '/'. Jobs run with its bin/ first on their PATH, so a prefix that
    climbs out of where it seems to point (`/opt/envs/../../tmp/x`) would run whatever lies there
    under a name the catalog shows as something else. Raises InvalidInput."""
    parts = prefix.split("/")[1:]
    if not prefix.startswith("/") or prefix == "/" or any(part in ("", ".", "..") for part in parts):
        raise InvalidInput(
            f"python prefix {prefix[:200]!r}: give the plain absolute path of the environment (e.g. "
            "/opt/envs/torch), without '.', '..' or empty parts"
        )


def listing(session: Session) -> list[Environment]:
    return list(session.scalars(select(Environment).order_by(Environment.name, Environment.id)))


def get(session: Session, ref: str) -> Environment:
    """`name:version`, or `name` for the version added last. NotFound otherwise."""
    name, _, version = ref.partition(":")
    query = select(Environment).where(Environment.name == name)
    if version:
        query = query.where(Environment.version == version)
    found = session.scalars(query.order_by(Environment.id.desc()).limit(1)).first()
    if found is None:
        raise NotFound(f"no environment {ref} (gpufleet env list shows them)")
    return found


def remove(session: Session, ref: str) -> Environment:
    """Remove one version (`name:version`; a bare name is refused, so one call never removes the wrong
    one). Queued jobs keep what they copied at submission."""
    name, _, version = ref.partition(":")
    if not version:
        raise InvalidInput(f"name the version to remove: {name}:VERSION")
    env = get(session, ref)
    session.delete(env)
    return env


def job_settings(env: Environment) -> tuple[str | None, dict[str, str]]:
    """The container and environment variables a job in `env` runs with."""
    variables = {"GPUFLEET_ENVIRONMENT": env.ref}
    if env.python_prefix is not None:
        variables |= {"VIRTUAL_ENV": env.python_prefix, "PATH": f"{env.python_prefix}/bin:{DEFAULT_PATH}"}
    return env.image, variables


def node_drivers(session: Session) -> dict[int, DriverVersion]:
    """Each node's NVIDIA driver: the oldest its GPUs report. Nodes without one reported are left out."""
    drivers: dict[int, DriverVersion] = {}
    reported = select(Gpu.node_id, Gpu.driver_version).where(Gpu.driver_version.is_not(None))
    for node_id, text in session.execute(reported):
        try:
            version = parse_driver(text or "")
        except InvalidInput:
            continue  # a driver string gpufleet cannot read counts as unknown
        drivers[node_id] = min(drivers.get(node_id, version), version)
    return drivers


@dataclass(frozen=True)
class NodeFit:
    node: str
    driver: str | None
    ok: bool  # its driver runs the environment
    takes_jobs: bool  # and it takes jobs now (up, not drained, not failed)
    reason: str


@dataclass(frozen=True)
class Fleet:
    """What `check` needs of every node, read once for any number of environments."""

    drivers: dict[int, DriverVersion]
    gpus: dict[int, int]
    nodes: list[tuple[int, str, bool, str]]  # id, name, takes jobs, why not


def fleet(session: Session) -> Fleet:
    gpus: dict[int, int] = defaultdict(int)
    for node_id in session.scalars(select(Gpu.node_id)):
        gpus[node_id] += 1
    rows = session.execute(
        select(Node.id, Node.name, Node.state, Node.health, Node.drained_at, Node.expected_gpus).order_by(Node.name)
    )
    nodes = []
    for node_id, name, state, health, drained_at, expected in rows:
        if not gpus.get(node_id) and not expected:
            continue  # a CPU-only node runs no GPU environment: not worth a line
        takes = node_schedulable(state.value, health, drained_at is not None)
        why = "drained" if drained_at is not None else f"{state.value}, health {health}"
        nodes.append((node_id, name, takes, why))
    return Fleet(node_drivers(session), gpus, nodes)


def check(known: Fleet, env: Environment) -> list[NodeFit]:
    """Every node with GPUs, whether its driver runs `env` and whether it takes jobs now, and why not."""
    needed = parse_driver(env.min_driver) if env.min_driver else None
    fits = []
    for node_id, name, takes, why in known.nodes:
        driver = known.drivers.get(node_id)
        shown = format_driver(driver) if driver is not None else None
        if needed is None:
            ok = "needs no NVIDIA driver (CPU only)"
            fits.append(NodeFit(name, shown, True, takes, ok if takes else f"{ok}, but takes no jobs now ({why})"))
        elif driver is None:
            fits.append(NodeFit(name, None, False, takes, "its NVIDIA driver is not known (no GPU inventory reported)"))
        elif driver < needed:
            fits.append(NodeFit(name, shown, False, takes, _too_old(driver, env)))
        elif not takes:
            fits.append(NodeFit(name, shown, True, False, f"driver fits, but the node takes no jobs now ({why})"))
        else:
            fits.append(NodeFit(name, shown, True, True, f"driver {shown} >= {env.min_driver}"))
    return fits


def runnable(fits: list[NodeFit]) -> int:
    """How many nodes can run the environment now: driver new enough, and taking jobs."""
    return sum(1 for fit in fits if fit.ok and fit.takes_jobs)


def _too_old(driver: DriverVersion, env: Environment) -> str:
    runs = newest_cuda(driver)
    up_to = f", which runs CUDA up to {runs[0]}.{runs[1]}" if runs else ""
    source = "it names" if env.driver_given else f"CUDA {env.cuda} needs"
    return f"driver {format_driver(driver)}{up_to}; {source} {env.min_driver} or newer"
