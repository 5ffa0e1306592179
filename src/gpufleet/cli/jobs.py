"""gpufleet job submit|list|show|cancel|logs, and gpufleet report usage|idle"""

from __future__ import annotations

import csv
import enum
import re
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import typer

from gpufleet.cli.output import Format, OutputOpt, fields, print_json, table
from gpufleet.cli.state import state
from gpufleet.client import HeadClient
from gpufleet.core.durations import parse_duration
from gpufleet.core.errors import InvalidInput, NotFound
from gpufleet.core.hostlist import collect

app = typer.Typer(help="Jobs on the built-in scheduler: submit, follow, cancel.", no_args_is_help=True)
report_app = typer.Typer(
    help="Reports: GPU-hours per project, user or job; idle GPUs held by jobs.", no_args_is_help=True
)

ACTIVE = ["running", "pending"]
LIST_COLUMNS = [
    ("id", "ID"),
    ("name", "Name"),
    ("user", "User"),
    ("project", "Project"),
    ("state", "State"),
    ("shape", "GPUs"),
    ("elapsed", "Time"),
    ("where", "Nodes / reason"),
]
SLURM_COLUMN = ("external_id", "Slurm id")  # shown when jobs run in Slurm
SHOW_FIELDS = [
    ("id", "Job"),
    ("array", "Array task"),
    ("name", "Name"),
    ("user", "User"),
    ("project", "Project"),
    ("state", "State"),
    ("reason", "Reason"),
    ("external_id", "Slurm job"),
    ("partition", "Partition"),
    ("shape", "Asked"),
    ("time_limit", "Time limit"),
    ("priority", "Priority"),
    ("command", "Command"),
    ("container", "Container"),
    ("workdir", "Workdir"),
    ("where", "Nodes (GPUs)"),
    ("run", "Run"),
    ("submitted_at", "Submitted"),
    ("started_at", "Started"),
    ("ended_at", "Ended"),
    ("exit_code", "Exit code"),
    ("gpu_hours", "GPU-hours"),
    ("mean_gpu_util", "Mean GPU util %"),
    ("submitted_by", "Submitted by"),
]
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([kmgt]?)i?b?$")
_SIZE_MIB = {"k": 1 / 1024, "": 1, "m": 1, "g": 1024, "t": 1024 * 1024}


def parse_mem(text: str) -> int:
    """MiB in a size such as 512M, 16G or 1T (a bare number is MiB). Raises InvalidInput."""
    match = _SIZE.match(text.strip().lower())
    if not match:
        raise InvalidInput(f"invalid memory size {text!r}: e.g. 512M, 16G, 1T")
    return max(int(float(match.group(1)) * _SIZE_MIB[match.group(2)]), 1)


_GPUS = re.compile(r"^(?:(?P<profile>[1-8]g\.[0-9]{1,4}gb|shared)(?::(?P<n>\d{1,2}))?|(?P<count>\d{1,2}))$")


def parse_gpus(text: str) -> tuple[str | None, int]:
    """(MIG profile or None, count) in --gpus: "2" (whole GPUs), "1g.18gb:2" or "1g.18gb" (one instance),
    "shared" or "shared:1" (a time-sliced or MPS replica). Raises InvalidInput."""
    match = _GPUS.match(text.strip())
    if match is None:
        raise InvalidInput(f"invalid --gpus {text!r}: a number of GPUs (2) or a MIG profile and count (1g.18gb:2)")
    if match["count"] is not None:
        return None, int(match["count"])
    return match["profile"], int(match["n"] or 1)


def parse_time(text: str) -> int:
    """Seconds in 90m / 4h / 2d, or Slurm's [D-]HH:MM:SS / MM:SS, or a bare number of minutes (as sbatch)."""
    text = text.strip()
    if text.isdigit():
        return int(text) * 60
    clock = re.match(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)$", text)
    if clock:
        days, hours, minutes, seconds = (int(g) if g else 0 for g in clock.groups())
        total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
        if total > 0:
            return total
    return parse_duration(text)


def parse_pairs(items: list[str], option: str = "--export") -> dict[str, str]:
    """NAME=VALUE items of a repeatable option, as a dict."""
    found = {}
    for pair in items:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise InvalidInput(f"invalid {option} {pair!r}: use NAME=VALUE")
        found[name] = value
    return found


def _elapsed(job: dict[str, Any]) -> str:
    start = job.get("started_at")
    limit = _hms(job["time_limit_s"])
    if not start:
        return f"- / {limit}"
    end = job.get("ended_at")
    began = datetime.fromisoformat(start)
    stop = datetime.fromisoformat(end) if end else datetime.now(UTC)
    return f"{_hms((stop - began).total_seconds())} / {limit}"


def _hms(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    days, rest = divmod(seconds, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


def _where(job: dict[str, Any]) -> str:
    reason = str(job["reason"])
    if job["state"] == "pending":
        return reason
    allocation = job.get("allocation") or {}
    if job["state"] == "running" or not reason:
        return collect(list(allocation)) if allocation else ""
    return reason


def job_label(job: dict[str, Any]) -> str:
    """The job's id as squeue shows it: `1234` for a job, `1234_7` for task 7 of job array 1234, and
    `1234_[5-999%50]` for the row standing for the array's pending tasks (with its throttle)."""
    array = job.get("array_job_id")
    if array is None:
        return str(job["id"])
    if job.get("array_pending"):
        throttle = f"%{job['array_throttle']}" if job.get("array_throttle") else ""
        return f"{array}_[{job['array_pending']}{throttle}]"
    return f"{array}_{job['array_task_id']}"


_JOB_REF = re.compile(r"^(\d{1,19})(?:_(\d{1,10}))?$")


def parse_job_ref(text: str) -> tuple[int, int | None]:
    """`1234` -> (1234, None); `1234_7` -> (1234, 7): task 7 of job array 1234. Raises InvalidInput."""
    match = _JOB_REF.match(text.strip())
    if match is None:
        raise InvalidInput(f"invalid job id {text!r}: a job id (1234) or an array's task (1234_7)")
    return int(match.group(1)), int(match.group(2)) if match.group(2) is not None else None


def resolve_job(client: HeadClient, text: str) -> int:
    """The job id `text` names: the id itself, or the job that runs task T of array A for `A_T`."""
    job_id, task = parse_job_ref(text)
    if task is None:
        return job_id
    found = client.list_jobs([], None, None, 1, array_job_id=job_id, array_task_id=task)
    if not found:
        raise NotFound(f"job array {job_id} has no task {task}")
    return int(found[0]["id"])


def _row(job: dict[str, Any]) -> dict[str, Any]:
    return job | {
        "id": job_label(job),
        "shape": f"{job['nodes']}x{job['gpus_per_node']}",
        "elapsed": _elapsed(job),
        "where": _where(job),
        "project": job["project"] or "-",
    }


@app.command(
    "submit", context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, no_args_is_help=True
)
def submit(
    ctx: typer.Context,
    project: Annotated[str | None, typer.Option(help="project to charge (default: your only one)")] = None,
    nodes: Annotated[int, typer.Option(min=1, help="nodes, all started together (a gang)")] = 1,
    gpus_per_node: Annotated[int, typer.Option(min=0, help="GPUs on each node")] = 1,
    gpus: Annotated[
        str | None,
        typer.Option(
            help="GPUs on each node as N, or MIG instances as PROFILE:N (1g.18gb:2); wins over --gpus-per-node"
        ),
    ] = None,
    cpus: Annotated[int, typer.Option(min=0, help="CPUs on each node (0: no limit)")] = 0,
    mem: Annotated[str | None, typer.Option(help="memory on each node, e.g. 64G")] = None,
    time_limit: Annotated[str | None, typer.Option("--time", help="time limit: 90m, 4h, 2d or [D-]HH:MM:SS")] = None,
    priority: Annotated[int, typer.Option(help="higher runs first; above 0 needs a job admin")] = 0,
    container: Annotated[str | None, typer.Option(help="container image to run in")] = None,
    export: Annotated[
        list[str] | None, typer.Option("--export", help="environment variable NAME=VALUE, repeatable")
    ] = None,
    environment: Annotated[
        str | None, typer.Option("--env", help="runtime environment NAME[:VERSION] (gpufleet env list)")
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="registered model NAME[:VERSION], staged to the node: $GPUFLEET_MODEL_PATH")
    ] = None,
    dataset: Annotated[
        list[str] | None,
        typer.Option(help="registered dataset NAME[:VERSION], staged to the node: $GPUFLEET_DATASET_PATH; repeatable"),
    ] = None,
    workdir: Annotated[str | None, typer.Option(help="absolute working directory on the nodes")] = None,
    name: Annotated[str, typer.Option(help="a name to find the job by")] = "",
    category: Annotated[str | None, typer.Option(help="run only on nodes of this category")] = None,
    requeue: Annotated[bool, typer.Option(help="run again elsewhere if a node fails")] = False,
    array: Annotated[
        str | None,
        typer.Option(
            help="a job array, one job per task: 0-999, 1,3,5-7 or 0-15:4; %N runs at most N at once"
            " ($GPUFLEET_ARRAY_TASK_ID says which)"
        ),
    ] = None,
    user: Annotated[str | None, typer.Option(help="run as this user (job admins only)")] = None,
    script: Annotated[Path | None, typer.Option(help="a script file to run with /bin/sh")] = None,
    template: Annotated[
        str | None, typer.Option(help="start from this job template (gpufleet template list); options given win")
    ] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="template param NAME=VALUE, repeatable")] = None,
    output: Format = OutputOpt,
) -> None:
    """Submit a job: gpufleet job submit [OPTIONS] -- COMMAND [ARGS]... (or --script FILE, or --template NAME)."""
    argv = list(ctx.args)
    if argv and argv[0].startswith("-"):
        raise InvalidInput(f"unknown option {argv[0]}; put the command after --")
    if set_ and template is None:
        raise InvalidInput("--set gives a template's params: name the template with --template")
    if environment is not None and "=" in environment:
        raise InvalidInput("--env names a runtime environment, NAME[:VERSION]; variables are --export NAME=VALUE")
    profile, count = parse_gpus(gpus) if gpus is not None else (None, gpus_per_node)
    body: dict[str, Any] = {
        "name": name,
        "project": project,
        "user": user,
        "nodes": nodes,
        "gpus_per_node": count,
        "gpu_profile": profile,
        "cpus_per_node": cpus,
        "mem_per_node_mib": parse_mem(mem) if mem else 0,
        "time_limit_s": parse_time(time_limit) if time_limit else None,
        "priority": priority,
        "argv": argv,
        "script": read_script(script) if script else None,
        "env": parse_pairs(export or []),
        "workdir": workdir,
        "container": container,
        "category": category,
        "requeue": requeue,
        "environment": environment,
        "model": model,
        "datasets": dataset or [],
        "array": array,
    }
    client = state(ctx).client()
    if template is not None:
        if argv or script:
            raise InvalidInput(f"template {template} gives the command: leave out the command and --script")
        given = {key for param, key in _OPTION_KEYS.items() if _typed(ctx, param)}
        body = _from_template(client, template, parse_pairs(set_ or [], "--set"), body, given, ctx)
    job = client.submit_job(body)
    if output is Format.json:
        print_json(job)
    elif job.get("array_job_id") is not None:
        typer.echo(
            f"submitted job array {job['array_job_id']} ({job['array_tasks']} tasks; {job['state']}: {job['reason']})"
        )
    else:
        typer.echo(f"submitted job {job['id']} ({job['state']}: {job['reason']})")


# `job submit`'s parameters and the job field each sets.
_OPTION_KEYS = {
    "project": "project", "user": "user", "name": "name", "nodes": "nodes", "gpus_per_node": "gpus_per_node",
    "cpus": "cpus_per_node", "mem": "mem_per_node_mib", "time_limit": "time_limit_s", "priority": "priority",
    "container": "container", "export": "env", "workdir": "workdir", "category": "category",
    "requeue": "requeue", "environment": "environment", "model": "model", "dataset": "datasets", "array": "array",
}  # fmt: skip
# Job fields a template may compute from a param of its own (torchrun's --nproc-per-node is its
# gpus_per_node): an option for one of them goes to the template as that param, so that the command and
# the resources still agree.
_AS_PARAM = {"nodes": "nodes", "gpus_per_node": "gpus_per_node", "time_limit_s": "time"}


def _typed(ctx: typer.Context, param: str) -> bool:
    """Whether the user gave option `param` on the command line (not merely its default)."""
    source = ctx.get_parameter_source(param)  # Typer's own click: compared by name, not by its private class
    return source is not None and source.name == "COMMANDLINE"


def _from_template(
    client: HeadClient,
    template: str,
    values: dict[str, str],
    options: dict[str, Any],
    given: set[str],
    ctx: typer.Context,
) -> dict[str, Any]:
    """Template `template`'s job for `values`, with the options the user gave on top (variables merged)."""
    params = {p["name"] for p in client.show_template(template)["params"]}
    for key, param in _AS_PARAM.items():
        if key in given and param in params:
            raw = ctx.params["time_limit"] if key == "time_limit_s" else str(options[key])
            if values.setdefault(param, raw) != raw:
                raise InvalidInput(f"give {param} once: --set {param}=... or its option, not both")
            given.discard(key)
    body = client.render_template(template, values)
    for key in given:
        body[key] = {**body.get("env", {}), **options["env"]} if key == "env" else options[key]
    for key, value in options.items():
        body.setdefault(key, value)
    return body


def read_script(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"cannot read the script {path}: {exc}") from None


@app.command("list")
def list_(
    ctx: typer.Context,
    state_: Annotated[list[str] | None, typer.Option("--state", help="pending, running, completed, ...")] = None,
    all_: Annotated[bool, typer.Option("--all", help="ended jobs too")] = False,
    user: Annotated[str | None, typer.Option(help="only this user's jobs")] = None,
    project: Annotated[str | None, typer.Option(help="only this project's jobs")] = None,
    limit: Annotated[int, typer.Option(min=1, max=5000)] = 200,
    expand: Annotated[
        bool, typer.Option("--expand", "-r", help="each pending task of a job array on its own row")
    ] = False,
    output: Format = OutputOpt,
) -> None:
    """The queue: running and pending jobs (with --all, ended ones too), with why each waits. A job array's
    pending tasks are one row, 1234_[5-999%50], as squeue shows them; its other tasks are 1234_7."""
    states = state_ or ([] if all_ else ACTIVE)
    jobs = state(ctx).client().list_jobs(states, user, project, limit, expand=expand)
    if output is Format.json:
        print_json(jobs)
        return
    tasks = [j.get("array_pending_count") or 1 for j in jobs]  # a collapsed array row stands for its tasks
    running = sum(j["state"] == "running" for j in jobs)
    pending = sum(n for j, n in zip(jobs, tasks, strict=True) if j["state"] == "pending")
    columns = list(LIST_COLUMNS)
    if any(j.get("external_id") for j in jobs):
        columns.insert(1, SLURM_COLUMN)
    table([_row(j) for j in jobs], columns, title=f"{sum(tasks)} jobs: {running} running, {pending} pending")


@app.command("show")
def show(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="a job id, or an array's task: 1234_7")],
    output: Format = OutputOpt,
) -> None:
    """One job: its request, where it runs, how it ended, its ranks."""
    client = state(ctx).client()
    job = client.show_job(resolve_job(client, job_id))
    if output is Format.json:
        print_json(job)
        return
    command = " ".join(job["argv"]) if job.get("argv") else ("(script)" if job.get("script") else "(hidden)")
    allocation = job.get("allocation") or {}
    extra = {
        "shape": f"{job['nodes']} node(s) x {job['gpus_per_node']} GPU(s)"
        + (f", {job['cpus_per_node']} CPUs" if job["cpus_per_node"] else "")
        + (f", {job['mem_per_node_mib']} MiB" if job["mem_per_node_mib"] else ""),
        "time_limit": _hms(job["time_limit_s"]),
        "command": command,
        "where": "  ".join(f"{n}({','.join(map(str, g))})" for n, g in allocation.items()),
        "gpu_hours": round(job["gpu_seconds"] / 3600, 3),
        "array": f"{job_label(job)} of {job.get('array_tasks')} tasks"
        + (f", at most {job['array_throttle']} at once" if job.get("array_throttle") else ""),
    }
    hidden: tuple[str, ...] = () if job.get("backend") == "slurm" else ("external_id", "partition")
    hidden += () if job.get("array_job_id") is not None else ("array",)
    fields(job | extra, [f for f in SHOW_FIELDS if f[0] not in hidden])
    if job["ranks"]:
        ranks = [r | {"gpus": ",".join(map(str, r["gpu_indexes"]))} for r in job["ranks"]]
        columns = [("run", "Run"), ("rank", "Rank"), ("node", "Node"), ("gpus", "GPUs"), ("state", "State")]
        columns += [("outcome", "Outcome"), ("exit_code", "Exit"), ("message", "Message")]
        table(ranks, columns, title="Ranks")


@app.command("cancel")
def cancel(
    ctx: typer.Context,
    job_ids: Annotated[list[str], typer.Argument(help="job ids; an array's job id cancels the array, 1234_7 one task")],
    output: Format = OutputOpt,
) -> None:
    """Cancel jobs: pending ones never start, running ones are killed (the whole process tree). As with
    scancel, a job array's id cancels all its tasks not yet ended, and 1234_7 task 7 of array 1234 alone."""
    client = state(ctx).client()
    done = [_cancel_one(client, text) for text in job_ids]
    if output is Format.json:
        print_json(done)
        return
    for job in done:
        if "cancelled" in job:  # a whole array
            typer.echo(f"job array {job['array_job_id']}: {job['cancelled']} of its {job['tasks']} tasks cancelled")
        else:
            typer.echo(f"job {job_label(job)}: {job['state']} ({job['reason']})")


def _cancel_one(client: HeadClient, text: str) -> dict[str, Any]:
    """A job (its JobDetail), an array's task (the task's), or a whole array (what the cancel did)."""
    job_id, task = parse_job_ref(text)
    if task is None and client.show_job(job_id).get("array_job_id") == job_id:
        return client.cancel_job_array(job_id)
    return client.cancel_job(resolve_job(client, text))


@app.command("logs")
def logs(
    ctx: typer.Context,
    job_ref: Annotated[str, typer.Argument(metavar="JOB_ID", help="a job id, or an array's task: 1234_7")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing until the job ends")] = False,
    rank: Annotated[int | None, typer.Option(help="only this rank's output (default: all)")] = None,
    poll_s: Annotated[float, typer.Option(hidden=True, min=0.05)] = 1.0,
) -> None:
    """A job's stdout (to stdout) and stderr (to stderr), as kept on the head."""
    client = state(ctx).client()
    job_id = resolve_job(client, job_ref)
    after = 0
    while True:
        page = client.job_output(job_id, after, rank)
        for chunk in page["chunks"]:
            stream = sys.stderr if chunk["stream"] == "stderr" else sys.stdout
            stream.write(chunk["data"])
        sys.stdout.flush()
        sys.stderr.flush()
        after = page["next_after"]
        if not follow or page["done"]:
            return
        if not page["chunks"]:
            time.sleep(poll_s)


class ReportFormat(enum.StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


@report_app.command("usage")
def usage(
    ctx: typer.Context,
    since: Annotated[str, typer.Option(help="how far back: 30d, 12h, 2w")] = "30d",
    by: Annotated[str, typer.Option(help="project, user or job")] = "project",
    output: Annotated[ReportFormat, typer.Option("--output", "-o", help="table, json or csv")] = ReportFormat.table,
) -> None:
    """GPU-hours per project, user or job over a window, with the jobs' mean GPU utilization."""
    if by not in ("project", "user", "job"):
        raise InvalidInput(f"--by must be project, user or job, not {by!r}")
    start = datetime.now(UTC) - timedelta(seconds=parse_duration(since))
    report = state(ctx).client().usage_report(start, by)
    rows = report["rows"]
    if output is ReportFormat.json:
        print_json(report)
    elif output is ReportFormat.csv:
        writer = csv.writer(sys.stdout)
        writer.writerow([by, "jobs", "gpu_hours", "mean_gpu_util"])
        for r in rows:
            writer.writerow(
                [r["key"], r["jobs"], r["gpu_hours"], "" if r["mean_gpu_util"] is None else r["mean_gpu_util"]]
            )
    else:
        total = sum(r["gpu_hours"] for r in rows)
        columns = [
            ("key", by.capitalize()),
            ("jobs", "Jobs"),
            ("gpu_hours", "GPU-hours"),
            ("mean_gpu_util", "Mean GPU util %"),
        ]
        table(rows, columns, title=f"GPU usage since {report['since'][:19]}: {total:.2f} GPU-hours")


@report_app.command("idle")
def idle(
    ctx: typer.Context,
    below: Annotated[float, typer.Option(min=0, max=100, help="utilization under which a GPU is idle, %")] = 5.0,
    output: Format = OutputOpt,
) -> None:
    """GPUs that running jobs hold but hardly use."""
    gpus = state(ctx).client().idle_gpus(below)
    if output is Format.json:
        print_json(gpus)
        return
    columns = [("job_id", "Job"), ("user", "User"), ("project", "Project"), ("node", "Node"), ("gpu", "GPU")]
    columns += [("gpu_util", "Util %"), ("held_since", "Held since")]
    table(gpus, columns, title=f"{len(gpus)} idle GPU(s) held by running jobs (under {below:g}% utilization)")
