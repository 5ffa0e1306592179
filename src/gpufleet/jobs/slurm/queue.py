"""Slurm's jobs as gpufleet needs them: id, owner, state, where they run and on which GPUs. Pure parsing.

`squeue --json` (21.08 and later; checked on 22.05.8) lists pending and running jobs and, with
`--states=all`, those that ended less than MinJobAge (300 s by default) ago. The shapes that changed
between versions are all read:

- `job_state`: "RUNNING" (22.05) or ["RUNNING"] / ["PENDING", "REQUEUED"] (23.02 and later);
- times and limits: seconds / minutes as plain numbers, 0 for "never" (22.05), or
  {"set": .., "infinite": .., "number": ..} (23.11 and later);
- `exit_code`: the raw wait status as a number (22.05), or {"status": [..], "return_code": .., "signal":
  {"id": ..}} (23.11 and later);
- `gres_detail`: per node, in `nodes` order, "gpu:TYPE:N(IDX:0-1,3)" or "gpu:N(IDX:..)".

A job submitted through gpufleet carries `--comment=gpufleet:<id>:<stamp>` (`job_comment`), which is how a
gpufleet job is found in Slurm again (after a lost answer from sbatch, or a restart of the head). A job
array carries its array job id there (gpufleet's, the first task's row id) on every task. The stamp (the
microsecond the row was submitted) tells this database's job 7 from another's job 7 on the same Slurm: a
second head's, or this one's before its database was reset. Comments of the older `gpufleet:<id>` form are
still read.

Job arrays (checked on 22.05.8): a task that has started (or ended) is a record of its own, with its own
`job_id` and its array's `array_job_id` and `array_task_id`; its name in Slurm is `<array_job_id>_<task>`
(`SlurmJob.slurm_name`), which `scancel` and `sacct -j` accept. The tasks not yet started are one record
(the array's own job id) whose `array_task_string` names them ("3-5%2", the throttle after %), in one
state: PENDING, or CANCELLED when the array was cancelled before they started. When a single task is left
unstarted Slurm lists it as a task record (array_task_id set) that is still PENDING.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from gpufleet.core import hostlist
from gpufleet.core.errors import InvalidInput
from gpufleet.jobs.models import JobState
from gpufleet.jobs.slurm.nodes import json_document

SQUEUE_JSON = ("squeue", "--json", "--states=all")
GPUFLEET_COMMENT = "gpufleet:"
_COMMENT = re.compile(r"gpufleet:(\d+)(?::\d+)?")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# Slurm's job states (job_state_string) → gpufleet's. Anything not here counts as running: the job holds
# its nodes (CONFIGURING, COMPLETING, SUSPENDED, STAGE_OUT, SIGNALING, RESIZING...).
SLURM_STATES = {
    "PENDING": JobState.PENDING,
    "REQUEUED": JobState.PENDING,
    "REQUEUE_HOLD": JobState.PENDING,
    "REQUEUE_FED": JobState.PENDING,
    "SPECIAL_EXIT": JobState.PENDING,
    "RESV_DEL_HOLD": JobState.PENDING,
    "COMPLETED": JobState.COMPLETED,
    "FAILED": JobState.FAILED,
    "BOOT_FAIL": JobState.FAILED,
    "DEADLINE": JobState.FAILED,
    "OUT_OF_MEMORY": JobState.FAILED,
    "CANCELLED": JobState.CANCELLED,
    "PREEMPTED": JobState.CANCELLED,
    "REVOKED": JobState.CANCELLED,
    "TIMEOUT": JobState.TIMEOUT,
    "NODE_FAIL": JobState.NODE_FAIL,
}
_GPU_GRES = re.compile(r"^gpu(?::[^:(]+)?:(\d+)\(IDX:([^)]*)\)")
_GPU_REQUEST = re.compile(r"(?:^|,)(?:gres[:/])?gpu(?::[^:,]+)?[:=](\d+)")
_TASK_RANGE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


def task_name(array_job_id: str, task_id: int) -> str:
    """Slurm's own name for one task of an array (`1234_7`): what squeue shows, scancel and sacct take."""
    return f"{array_job_id}_{task_id}"


def split_task_name(name: str) -> tuple[str, int] | None:
    """(array job id, task id) of a task's name, None for a plain job id."""
    array, sep, task = name.partition("_")
    return (array, int(task)) if sep and array.isdigit() and task.isdigit() else None


def task_ranges(text: str) -> tuple[range, ...] | None:
    """The task ids of an array_task_string ("3-5%2", "[1,4-9:5]"), as ranges: membership without listing
    a foreign array's millions of ids. None when Slurm's string cannot be read (e.g. cut short with "...")."""
    spec = text.strip().removeprefix("[").removesuffix("]").partition("%")[0]
    found = []
    for item in spec.split(","):
        match = _TASK_RANGE.match(item.strip())
        step = int(match.group(3) or 1) if match else 0
        if match is None or step < 1:
            return None
        first = int(match.group(1))
        found.append(range(first, int(match.group(2) or first) + 1, step))
    return tuple(found)


@dataclass(frozen=True)
class SlurmJob:
    """One job as Slurm reports it."""

    job_id: str
    name: str
    user: str
    account: str | None
    partition: str | None
    slurm_state: str  # Slurm's own word, e.g. RUNNING, PENDING, CANCELLED
    reason: str | None  # why it pends (Resources, Priority, AssocGrpGRES...), None when it does not
    comment: str | None
    nodes: tuple[str, ...] = ()
    node_count: int = 1
    gpus_per_node: int = 0
    gpus: dict[str, list[int]] = field(default_factory=dict)  # node → GPU indexes Slurm gave the job there
    time_limit_s: float | None = None
    submitted_at: datetime | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    exit_code: int | None = None
    array_job_id: str | None = None  # the array this record belongs to (a task, or its unstarted tasks)
    array_task_id: int | None = None  # the task this record is, once it has a record of its own
    # For the record that stands for an array's tasks not yet started: which, as Slurm writes them ("3-5%2").
    array_pending: str | None = None

    @property
    def slurm_name(self) -> str:
        """The name gpufleet keeps as the job's external_id: `<array>_<task>` for an array task, else the job id.
        The record of an array's unstarted tasks is named by the first of them (`SlurmSync` reads the rest)."""
        if self.array_job_id is None:
            return self.job_id
        if self.array_task_id is not None:
            return task_name(self.array_job_id, self.array_task_id)
        first = self.first_pending
        return self.job_id if first is None else task_name(self.array_job_id, first)

    @property
    def first_pending(self) -> int | None:
        ranges = task_ranges(self.array_pending) if self.array_pending else None
        return min((r.start for r in ranges if r), default=None) if ranges else None

    def stands_for(self, task_id: int) -> bool:
        """Whether this record of an array's unstarted tasks names `task_id`. When Slurm's task string cannot
        be read every task may be among them: better a task left waiting than one ended unseen."""
        if self.array_pending is None:
            return False
        ranges = task_ranges(self.array_pending)
        return ranges is None or any(task_id in r for r in ranges)

    @property
    def state(self) -> JobState:
        return SLURM_STATES.get(self.slurm_state, JobState.RUNNING)

    @property
    def gpufleet_id(self) -> int | None:
        """The gpufleet job this is, when it was submitted through gpufleet."""
        found = _COMMENT.fullmatch(self.comment or "")
        return int(found.group(1)) if found else None


def job_comment(job_id: int, submitted_at: datetime) -> str:
    """The `--comment` gpufleet gives the sbatch of `job_id` (an array's: its array job id) whose row was
    submitted at `submitted_at` (aware): `gpufleet:<id>:<microseconds since the epoch>`, exact integers."""
    return f"{GPUFLEET_COMMENT}{job_id}:{(submitted_at - _EPOCH) // timedelta(microseconds=1)}"


def _number(value: Any) -> float | None:
    """22.05: a plain number; 23.11+: {"set": bool, "infinite": bool, "number": n}. None when unset."""
    if isinstance(value, Mapping):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _time(value: Any, *, now: float | None = None) -> datetime | None:
    seconds = _number(value)
    if seconds is None or seconds <= 0:
        return None
    if now is not None and seconds > now + 10 * 365 * 86_400:  # "end" of a running job: start + limit
        return None
    return datetime.fromtimestamp(seconds, UTC)


def _exit_code(value: Any) -> int | None:
    """The job's exit status: 0-255, or 128 + the signal that killed it."""
    if isinstance(value, Mapping):
        code = _number(value.get("return_code"))
        signal = value.get("signal")
        signal_id = _number(signal.get("id")) if isinstance(signal, Mapping) else None
        if signal_id:
            return 128 + int(signal_id)
        return None if code is None else int(code)
    raw = _number(value)
    if raw is None:
        return None
    status = int(raw)  # a wait(2) status: exit code in the high byte, signal in the low 7 bits
    if status & 0x7F:
        return 128 + (status & 0x7F)
    return (status >> 8) & 0xFF


def _indexes(spec: str) -> list[int]:
    """ "0-1,3" → [0, 1, 3]. Raises ValueError on anything else."""
    found: list[int] = []
    for raw in spec.split(","):
        part = raw.strip()
        if not part:
            continue
        low, _, high = part.partition("-")
        found.extend(range(int(low), int(high or low) + 1))
    return found


def _gpus(nodes: tuple[str, ...], details: Any) -> dict[str, list[int]]:
    if not isinstance(details, list):
        return {}
    placed: dict[str, list[int]] = {}
    for node, detail in zip(nodes, details, strict=False):
        match = _GPU_GRES.match(str(detail))
        if match:
            try:
                placed[node] = _indexes(match.group(2))
            except ValueError:
                continue
    return placed


def _gpus_requested(raw: Mapping[str, Any]) -> int:
    """GPUs per node the job asked for: tres_per_node "gres:gpu:2" (22.05) or "gres/gpu=2" (23.x)."""
    for key in ("tres_per_node", "tres_per_job"):
        value = raw.get(key)
        if isinstance(value, str):
            match = _GPU_REQUEST.search(value)
            if match:
                return int(match.group(1))
    return 0


def _state(raw: Mapping[str, Any]) -> str:
    value = raw.get("job_state")
    words = [value] if isinstance(value, str) else [str(w) for w in value or []]
    words = [w.strip().upper() for w in words if str(w).strip()]
    if not words:
        raise InvalidInput(f"Slurm: job {raw.get('job_id')} in squeue --json has no state")
    # 23.02+: the base state first, then flags such as REQUEUED or COMPLETING.
    return words[0]


def _text(value: Any) -> str | None:
    text = "" if value is None else str(value).strip()
    return text or None


def _job(raw: Mapping[str, Any], now: float | None) -> SlurmJob:
    job_id = _number(raw.get("job_id"))
    if job_id is None:
        raise InvalidInput("Slurm: a job in squeue --json has no job_id")
    nodes_text = _text(raw.get("nodes")) or ""
    try:
        nodes = tuple(hostlist.expand(nodes_text)) if nodes_text else ()
    except InvalidInput as exc:
        raise InvalidInput(f"Slurm: job {int(job_id)} runs on an unreadable node list: {exc}") from None
    reason = _text(raw.get("state_reason"))
    limit_min = _number(raw.get("time_limit"))
    state = _state(raw)
    ended = SLURM_STATES.get(state) not in (None, JobState.PENDING)
    return SlurmJob(
        job_id=str(int(job_id)),
        name=_text(raw.get("name")) or "",
        user=_text(raw.get("user_name")) or str(raw.get("user_id", "")),
        account=_text(raw.get("account")),
        partition=_text(raw.get("partition")),
        slurm_state=state,
        reason=None if reason in (None, "None") else reason,
        comment=_text(raw.get("comment")),
        nodes=nodes,
        node_count=int(_number(raw.get("node_count")) or max(len(nodes), 1)),
        gpus_per_node=_gpus_requested(raw),
        gpus=_gpus(nodes, raw.get("gres_detail")),
        time_limit_s=None if limit_min is None or limit_min <= 0 else limit_min * 60.0,
        submitted_at=_time(raw.get("submit_time")),
        started_at=_time(raw.get("start_time")) if state != "PENDING" else None,
        ended_at=_time(raw.get("end_time"), now=now) if ended else None,
        exit_code=_exit_code(raw.get("exit_code")) if ended else None,
        **_array_fields(raw),
    )


def _array_fields(raw: Mapping[str, Any]) -> dict[str, Any]:
    """array_job_id is 0 for a job that is no array (22.05), or {"set": false} (23.11 and later)."""
    array_job = _number(raw.get("array_job_id"))
    if not array_job:
        return {}
    task = _number(raw.get("array_task_id"))
    pending = _text(raw.get("array_task_string"))
    return {
        "array_job_id": str(int(array_job)),
        "array_task_id": None if task is None or pending else int(task),
        "array_pending": pending,
    }


def parse_squeue_json(output: str, *, now: float | None = None) -> list[SlurmJob]:
    """Jobs from `squeue --json`, in Slurm's order.

    Raises Unavailable when Slurm reports errors (an unreachable slurmctld exits 0 with an "errors" list),
    InvalidInput when the output is not the JSON expected.
    """
    document = json_document(output, "squeue --json")
    raw_jobs = document.get("jobs")
    if not isinstance(raw_jobs, list):
        raise InvalidInput("Slurm: squeue --json has no job list")
    jobs = []
    for raw in raw_jobs:
        if not isinstance(raw, Mapping):
            raise InvalidInput("Slurm: a job in squeue --json is not an object")
        jobs.append(_job(raw, now))
    return jobs
