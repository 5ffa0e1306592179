"""Job arrays as Slurm users write them (`sbatch --array`): which task ids, and how many may run at once.

`0-999`, `1,3,5-7`, `0-15:4` (every 4th), each with an optional `%N` throttle: at most N tasks of the
array run at once. Duplicates merge (`1-5,3` is five tasks). Pure: no database, no server package.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import compress

from gpufleet.core.errors import InvalidInput

MAX_TASKS = 100_000  # tasks in one array: a 100,000-point sweep submits in seconds and lists as one row
# Slurm's MaxArraySize is at most 4,000,001, so its task ids go up to 4,000,000: the same ids work in both.
MAX_TASK_ID = 4_000_000
MAX_SPEC_CHARS = 1024

_ITEM = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")
THROTTLE_REASON = "array throttle: {n} of the array's tasks run at once (%{n})"
ARRAY_VARIABLES = 5  # how many `task_variables` adds to each task's environment (counted against MAX_ENV)
TASK_ID_VARIABLE = "GPUFLEET_ARRAY_TASK_ID"  # the one that differs between tasks (Slurm: SLURM_ARRAY_TASK_ID)


@dataclass(frozen=True, slots=True)
class ArraySpec:
    task_ids: tuple[int, ...]  # sorted, no duplicates, at least one
    throttle: int | None  # at most this many tasks run at once; None: no limit

    @property
    def count(self) -> int:
        return len(self.task_ids)


def parse(text: str) -> ArraySpec:
    """The tasks `text` names. Raises InvalidInput saying what is wrong with it."""
    text = text.strip()
    if not text:
        raise InvalidInput("empty --array: give task ids such as 0-999, 1,3,5-7 or 0-15:4, optionally with %N")
    if len(text) > MAX_SPEC_CHARS:
        raise InvalidInput(f"--array is at most {MAX_SPEC_CHARS} characters")
    spec, sep, limit = text.partition("%")
    throttle = _throttle(limit) if sep else None
    ranges = [_item(item) for item in spec.split(",")]
    # A byte per possible id over the span the ranges cover, set by slices: exact merging of duplicates
    # and overlapping steps at C speed, with no set of millions of ints built for an abusive request.
    low = min(r.start for r in ranges)
    high = max(r[-1] for r in ranges)
    seen = bytearray(high - low + 1)
    for r in ranges:
        seen[r.start - low : r.stop - low : r.step] = b"\x01" * len(r)
    count = seen.count(1)
    if count > MAX_TASKS:
        raise InvalidInput(f"--array names {count} tasks; an array has at most {MAX_TASKS}")
    return ArraySpec(tuple(compress(range(low, high + 1), seen)), throttle)


def _throttle(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise InvalidInput(f"invalid --array throttle %{text}: after % give how many tasks may run at once (1 or more)")
    return min(int(text), MAX_TASKS)  # more than the array has limits nothing


def _item(item: str) -> range:
    """One comma-separated part: `A`, `A-B` or `A-B:S`, as the range of its task ids."""
    match = _ITEM.match(item)
    if item.startswith("-"):
        raise InvalidInput(f"--array task ids start at 0, not {item}")
    if match is None:
        raise InvalidInput(
            f"invalid --array part {item!r}: use ID, FIRST-LAST or FIRST-LAST:STEP with ids from 0"
            " (e.g. 0-999, 1,3,5-7, 0-15:4)"
        )
    first = int(match.group(1))
    last = int(match.group(2)) if match.group(2) is not None else first
    step = int(match.group(3)) if match.group(3) is not None else 1
    if last > MAX_TASK_ID:
        raise InvalidInput(f"--array task id {last} is over the largest, {MAX_TASK_ID}")
    if last < first:
        raise InvalidInput(f"--array range {item} runs backwards: write it {last}-{first}")
    if step < 1:
        raise InvalidInput(f"--array step in {item} must be 1 or more")
    found = range(first, last + 1, step)
    if len(found) > MAX_TASKS:
        raise InvalidInput(f"--array {item} has {len(found)} tasks; an array has at most {MAX_TASKS}")
    return found


def compact(task_ids: Iterable[int]) -> str:
    """Task ids as `parse` reads them back, short: `5-999`, `1,3,5-7`, `0-12:4` (sorted, merged)."""
    ids = sorted(set(task_ids))
    parts: list[str] = []
    i = 0
    while i < len(ids):
        end = _run_end(ids, i)
        if end == i:
            parts.append(str(ids[i]))
        elif ids[i + 1] - ids[i] == 1:
            parts.append(f"{ids[i]}-{ids[end]}")
        else:
            parts.append(f"{ids[i]}-{ids[end]}:{ids[i + 1] - ids[i]}")
        i = end + 1
    return ",".join(parts)


def _run_end(ids: Sequence[int], i: int) -> int:
    """The last index of the evenly spaced run from `i` worth writing as a range: two ids in a row, or
    three or more with a step (`1,3` stays as it is, shorter than `1-3:2`)."""
    if i + 1 >= len(ids):
        return i
    step = ids[i + 1] - ids[i]
    end = i + 1
    while end + 1 < len(ids) and ids[end + 1] - ids[end] == step and not _starts_run(ids, end + 1, step):
        end += 1
    if step == 1 or end - i >= 2:
        return end
    return i


def _starts_run(ids: Sequence[int], j: int, step: int) -> bool:
    """Whether a stepped run should leave ids[j] to the consecutive run it begins (`1,3,5-7`, not `1-5:2,6-7`)."""
    return step > 1 and j + 1 < len(ids) and ids[j + 1] - ids[j] == 1


def task_variables(array_job_id: int, task_id: int, spec: ArraySpec) -> dict[str, str]:
    """The variables every task of the array runs with (Slurm's SLURM_ARRAY_* under gpufleet's names)."""
    return {
        "GPUFLEET_ARRAY_JOB_ID": str(array_job_id),
        TASK_ID_VARIABLE: str(task_id),
        "GPUFLEET_ARRAY_TASK_COUNT": str(spec.count),
        "GPUFLEET_ARRAY_TASK_MIN": str(spec.task_ids[0]),
        "GPUFLEET_ARRAY_TASK_MAX": str(spec.task_ids[-1]),
    }
