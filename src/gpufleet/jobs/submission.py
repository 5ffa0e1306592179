"""Submitting a job: every check that can refuse it happens here, before anything is written.

Refused at submit (InvalidInput / NotFound / Forbidden, with the reason): malformed specs (the schema),
unknown or disabled users, unknown projects or ones the user is not a member of, models and datasets
the job's project may not use, requests no set of
nodes in the inventory could ever hold, and requests over the project's quota as a whole (more GPUs
than its `max_gpus`, or a worst case, GPUs x time limit, over its whole GPU-hour budget). A job that is
only over what the project has *left* right now is accepted and waits with reason `quota` or `budget`.

A job array (`spec.array`) is checked once, as one job of its shape, and then all its tasks are queued by
one bulk insert in the caller's transaction: each a pending job of its own that differs only in its task
id and its GPUFLEET_ARRAY_* variables. Under Slurm the Slurm sync submits them as one `sbatch --array`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Table, and_, func, insert, or_, select, update
from sqlalchemy.orm import Session

from gpufleet.auth.projects import Project, get_project, user_and_projects
from gpufleet.core.clock import Clock, to_datetime
from gpufleet.core.errors import Forbidden, InvalidInput
from gpufleet.inventory.mig_layouts import instance_fraction
from gpufleet.inventory.models import Gpu, Node
from gpufleet.jobs import arrays, artifacts, environments
from gpufleet.jobs.models import Job, JobState
from gpufleet.jobs.schemas import MAX_COMMAND_BYTES, JobSubmit
from gpufleet.protocol.jobs import MAX_ENV
from gpufleet.protocol.mig import profiles_of
from gpufleet.protocol.sharing import SHARED_PROFILE

NAME_CHARS = 128  # Job.name and the job_start message's name


@dataclass(frozen=True)
class Submitter:
    actor: str  # for the audit trail
    user: str | None  # the calling user; None for a token that belongs to no user
    admin: bool  # holds jobs:admin: may submit as anyone, to any project, with a raised priority


@dataclass(frozen=True)
class Limits:
    default_time_limit_s: float
    max_time_limit_s: float


def submit(
    session: Session, clock: Clock, who: Submitter, spec: JobSubmit, limits: Limits, *, backend: str = "builtin"
) -> Job:
    """Queue a job for `backend` ("builtin", or "slurm": the Slurm sync hands it to sbatch). For a job
    array, queue all its tasks and return the first."""
    array = arrays.parse(spec.array) if spec.array is not None else None  # InvalidInput before any read
    values = _checked(session, clock, who, spec, limits, backend)
    if array is not None:
        return _submit_array(session, values, array)
    job = Job(**values)
    job.ranks = []  # a new job has none: known, so reading them back costs no query
    session.add(job)
    session.flush()
    return job


def _checked(
    session: Session, clock: Clock, who: Submitter, spec: JobSubmit, limits: Limits, backend: str
) -> dict[str, Any]:
    """Every check that can refuse the job, then the job's row as column values (nothing written)."""
    container, variables, env = spec.container, dict(spec.env), None
    if spec.environment is not None:
        env = environments.get(session, spec.environment)  # NotFound for an unknown one
        image, settings = environments.job_settings(env)
        if image is not None and container not in (None, image):
            raise InvalidInput(f"environment {env.ref} runs in {image}: leave out --container or the environment")
        container = image or container
        variables = settings | variables  # the job's own values win, but for which environment it ran in
        variables["GPUFLEET_ENVIRONMENT"] = env.ref
        if len(variables) > MAX_ENV:
            raise InvalidInput(
                f"the job has {len(variables)} variables with environment {env.ref}'s; at most {MAX_ENV}"
            )
    if backend == "slurm" and (spec.model or spec.datasets):
        raise InvalidInput(
            "models and datasets are staged by gpufleet's agents, which do not run Slurm's jobs; "
            "read them from their shared location in the job's script"
        )
    if backend == "slurm" and container:
        raise InvalidInput(
            "containers are not run through Slurm by gpufleet (Slurm needs pyxis/enroot for images); "
            "start the container from the job's script"
        )
    run_as, mine = _run_as(session, who, spec)
    project = _project(session, who, run_as, mine, spec)
    time_limit = spec.time_limit_s if spec.time_limit_s is not None else limits.default_time_limit_s
    if time_limit > limits.max_time_limit_s:
        raise InvalidInput(f"time limit {time_limit:.0f}s is over the cluster's maximum {limits.max_time_limit_s:.0f}s")
    if spec.priority > 0 and not who.admin:
        raise Forbidden("only job admins may raise a job's priority above 0")
    if spec.gpu_profile == SHARED_PROFILE and backend != "builtin":
        raise InvalidInput("shared GPUs (time-slicing, MPS) are the built-in scheduler's; under Slurm use its shards")
    if spec.gpu_profile is None:
        check_capacity(session, spec)
    elif spec.gpu_profile != SHARED_PROFILE:  # replicas: as many as nodes share; the scheduler says if none
        check_profile(session, spec.gpu_profile)
    staged = artifacts.for_job(session, project.name if project else None, spec.model, spec.datasets)
    if project is not None:
        share = instance_fraction(spec.gpu_profile) if spec.gpu_profile else 1.0  # shared: the least, 1/48
        _check_quota(project, spec.nodes * spec.gpus_per_node * share, time_limit)
    return {
        "name": spec.name or (spec.argv[0].rsplit("/", 1)[-1][:NAME_CHARS] if spec.argv else "script"),
        "user": run_as,
        "project": project.name if project else None,
        "submitted_by": who.actor,
        "state": JobState.PENDING,
        "reason": "submitted: " + ("waiting for the scheduler" if backend == "builtin" else "waiting to go to Slurm"),
        "nodes": spec.nodes,
        "gpus_per_node": spec.gpus_per_node,
        "gpu_profile": spec.gpu_profile,
        "cpus_per_node": spec.cpus_per_node,
        "mem_per_node_mib": spec.mem_per_node_mib,
        "time_limit_s": time_limit,
        "priority": spec.priority,
        "category": spec.category,
        "argv": list(spec.argv),
        "script": spec.script,
        "env": variables,
        "workdir": spec.workdir,
        "container": container,
        "requeue": spec.requeue,
        "backend": backend,
        "environment": env.ref if env is not None else None,
        "min_driver": env.min_driver if env is not None else None,
        "artifacts": [s.model_dump() for s in staged],
        "submitted_at": to_datetime(clock.now()),
    }


def _submit_array(session: Session, values: dict[str, Any], array: arrays.ArraySpec) -> Job:
    """Insert every task of the array (checked as one job in `values`); returns the first task.

    One Core insert for all the tasks but the first, not an ORM object each: 10,000 tasks go in a
    fraction of a second. The first goes in alone, as its id is the array's job id every task carries.
    """
    variables: dict[str, str] = values["env"]
    widest = variables | arrays.task_variables(2**31 - 1, array.task_ids[-1], array)  # the longest values
    if len(widest) > MAX_ENV:
        raise InvalidInput(
            f"the job has {len(variables)} variables and an array task {arrays.ARRAY_VARIABLES} more"
            f" (GPUFLEET_ARRAY_*); at most {MAX_ENV}"
        )
    size = len(json.dumps({"argv": values["argv"], "script": values["script"], "env": widest}).encode())
    if size > MAX_COMMAND_BYTES:
        raise InvalidInput(
            f"command, script and environment with the array's variables exceed {MAX_COMMAND_BYTES} bytes"
        )
    base = values | {"array_throttle": array.throttle}
    first_task = array.task_ids[0]
    first: int = session.execute(insert(Job).values(**base).returning(Job.id)).scalar_one()
    session.execute(
        update(Job)
        .where(Job.id == first)
        .values(
            array_job_id=first,
            array_task_id=first_task,
            env=variables | arrays.task_variables(first, first_task, array),
        ),
        execution_options={"synchronize_session": False},
    )
    rows = [
        base
        | {"array_job_id": first, "array_task_id": task, "env": variables | arrays.task_variables(first, task, array)}
        for task in array.task_ids[1:]
    ]
    if rows:
        session.execute(insert(cast(Table, Job.__table__)), rows)
    return session.get_one(Job, first)


def _run_as(session: Session, who: Submitter, spec: JobSubmit) -> tuple[str, dict[str, Project]]:
    """The user the job runs as, and their projects by name."""
    name = spec.user or who.user
    if name is None:
        raise InvalidInput("this token belongs to no user, so a job needs --user (the account it runs as)")
    if name != who.user and not who.admin:
        raise Forbidden("only job admins may submit jobs as another user")
    user, mine = user_and_projects(session, name)  # NotFound for an unknown user
    if not user.enabled:
        raise InvalidInput(f"user {name} is disabled")
    return name, mine


def _project(session: Session, who: Submitter, user: str, mine: dict[str, Project], spec: JobSubmit) -> Project | None:
    """The project to charge: the one named, else the user's only project, else none (a user in no project)."""
    if spec.project is None:
        if len(mine) > 1:
            raise InvalidInput(f"user {user} is in several projects ({', '.join(sorted(mine))}): pass --project")
        return next(iter(mine.values()), None)
    if spec.project in mine:
        return mine[spec.project]
    project = get_project(session, spec.project, members=False)  # NotFound for an unknown project
    if not who.admin:
        raise Forbidden(f"user {user} is not a member of project {project.name}")
    return project


def check_capacity(session: Session, spec: JobSubmit) -> None:
    """Refuse a request that no `nodes` nodes of the inventory could hold even when idle."""
    # expected_gpus, not the GPUs present: a GPU that fell off the bus comes back after a repair. Counted
    # by the database: a submission must not read a thousand node rows.
    fits = Node.expected_gpus >= spec.gpus_per_node
    if spec.cpus_per_node:
        fits = and_(fits, or_(Node.cpus.is_(None), Node.cpus >= spec.cpus_per_node))
    if spec.mem_per_node_mib:
        fits = and_(fits, or_(Node.memory_total_mib.is_(None), Node.memory_total_mib >= spec.mem_per_node_mib))
    query = select(func.count().filter(fits), func.max(Node.expected_gpus))
    if spec.category is not None:
        query = query.where(Node.category == spec.category)
    fitting, most_gpus = session.execute(query).one()
    if fitting >= spec.nodes:
        return
    where = f" in category {spec.category}" if spec.category else ""
    asked = f"{spec.nodes} node(s) with {spec.gpus_per_node} GPU(s)"
    if spec.cpus_per_node:
        asked += f", {spec.cpus_per_node} CPUs"
    if spec.mem_per_node_mib:
        asked += f", {spec.mem_per_node_mib} MiB"
    raise InvalidInput(
        f"no node set can hold this job: it asks for {asked} each, and {fitting} node(s){where} could"
        f" (the largest has {most_gpus or 0} GPU(s))"
    )


def check_profile(session: Session, profile: str) -> None:
    """Refuse a MIG profile that no GPU model of the inventory offers (a typo would wait forever). One the
    GPUs offer but no layout makes yet is taken: its jobs wait, unschedulable, until a layout makes it."""
    models = session.execute(select(Gpu.model, func.max(Gpu.memory_total_mib)).group_by(Gpu.model)).all()
    offered = {name for model, memory in models for name in profiles_of(model, memory)}
    if profile not in offered:
        known = ", ".join(sorted(offered)) or "none: no GPU here has MIG"
        raise InvalidInput(f"no GPU in the inventory has MIG profile {profile}; the profiles offered: {known}")


def _check_quota(project: Project, gpus: float, time_limit_s: float) -> None:
    name = project.name
    if project.max_gpus is not None and gpus > project.max_gpus + 1e-9:
        raise InvalidInput(f"the job asks for {gpus:g} GPUs, over project {name}'s quota of {project.max_gpus} at once")
    worst = gpus * time_limit_s / 3600.0
    if project.gpu_hours_budget is not None and worst > project.gpu_hours_budget:
        raise InvalidInput(
            f"the job may use {worst:.1f} GPU-hours (GPUs x time limit), over project {name}'s whole budget of"
            f" {project.gpu_hours_budget:.1f} per {project.budget_period.value}"
        )
