"""Job array specs as Slurm users write them: parsing, refusals with the reason, and the compact form
the list shows, which must read back as the same tasks."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.core.errors import InvalidInput
from gpufleet.jobs.arrays import MAX_TASK_ID, MAX_TASKS, ArraySpec, compact, parse, task_variables


@pytest.mark.parametrize(
    ("text", "ids", "throttle"),
    [
        ("0-999", list(range(1000)), None),
        ("0-999%50", list(range(1000)), 50),
        ("1,3,5-7", [1, 3, 5, 6, 7], None),
        ("0-15:4", [0, 4, 8, 12], None),
        ("0-15:4%2", [0, 4, 8, 12], 2),
        ("7", [7], None),
        (" 1-5,3 ", [1, 2, 3, 4, 5], None),  # duplicates merge
        ("5-7,0-2:2", [0, 2, 5, 6, 7], None),  # any order, sorted
        (f"{MAX_TASK_ID}", [MAX_TASK_ID], None),
        ("0-3%1000000", [0, 1, 2, 3], MAX_TASKS),  # a throttle over the array limits nothing
    ],
)
def test_slurm_array_specs(text: str, ids: list[int], throttle: int | None) -> None:
    spec = parse(text)
    assert spec == ArraySpec(tuple(ids), throttle)
    assert spec.count == len(ids)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("5-1", "backwards: write it 1-5"),
        ("-3", "start at 0"),
        ("1,-3", "start at 0"),
        ("1,,3", "invalid --array part ''"),
        ("a-b", "invalid --array part 'a-b'"),
        ("1-5:0", "step"),
        ("3:2", "invalid --array part"),
        ("0-9%", "throttle"),
        ("0-9%0", "throttle"),
        ("0-9%x", "throttle"),
        ("0-9%5%5", "throttle"),
        (f"0-{MAX_TASK_ID + 1}", f"over the largest, {MAX_TASK_ID}"),
        (f"0-{MAX_TASKS}", f"{MAX_TASKS + 1} tasks; an array has at most {MAX_TASKS}"),
        (f"0-{MAX_TASKS - 1},{MAX_TASKS + 5}", "at most"),
        ("0-9" + ",1" * 600, "at most 1024 characters"),
    ],
)
def test_bad_specs_are_refused_with_the_reason(text: str, match: str) -> None:
    with pytest.raises(InvalidInput, match=match):
        parse(text)


def test_duplicates_merge_before_the_task_limit_counts() -> None:
    assert parse(f"0-{MAX_TASKS - 1},0-{MAX_TASKS - 1}").count == MAX_TASKS


@pytest.mark.parametrize(
    ("ids", "text"),
    [
        (range(5, 1000), "5-999"),
        ([1, 3, 5, 6, 7], "1,3,5-7"),
        ([0, 4, 8, 12], "0-12:4"),
        ([1, 3], "1,3"),
        ([2], "2"),
        ([], ""),
    ],
)
def test_compact_is_what_squeue_users_read(ids: list[int], text: str) -> None:
    assert compact(ids) == text


@given(st.sets(st.integers(min_value=0, max_value=300), min_size=1, max_size=80))
def test_compact_reads_back_as_the_same_tasks(ids: set[int]) -> None:
    text = compact(ids)
    assert parse(text).task_ids == tuple(sorted(ids))
    assert len(text) <= len(",".join(map(str, ids)))  # never longer than the plain list


@given(
    st.lists(
        st.tuples(st.integers(0, 500), st.integers(0, 60), st.integers(1, 7)),
        min_size=1,
        max_size=8,
    ),
    st.none() | st.integers(1, 99),
)
def test_parse_matches_the_ranges_written(parts: list[tuple[int, int, int]], throttle: int | None) -> None:
    text = ",".join(f"{first}-{first + span}:{step}" for first, span, step in parts)
    if throttle is not None:
        text += f"%{throttle}"
    expected = sorted({i for first, span, step in parts for i in range(first, first + span + 1, step)})
    spec = parse(text)
    assert spec.task_ids == tuple(expected)
    assert spec.throttle == throttle


def test_each_task_gets_the_array_variables() -> None:
    spec = parse("3-9:3%2")
    assert task_variables(41, 6, spec) == {
        "GPUFLEET_ARRAY_JOB_ID": "41",
        "GPUFLEET_ARRAY_TASK_ID": "6",
        "GPUFLEET_ARRAY_TASK_COUNT": "3",
        "GPUFLEET_ARRAY_TASK_MIN": "3",
        "GPUFLEET_ARRAY_TASK_MAX": "9",
    }
