"""Every hostlist gpufleet reads is bounded: a number longer than any node name holds is invalid
input, never the ValueError Python raises converting a string of more than 4,300 digits."""

from __future__ import annotations

import json

import pytest

from gpufleet.core import hostlist
from gpufleet.core.errors import InvalidInput
from gpufleet.jobs.slurm.queue import parse_squeue_json

HUGE = "9" * 5000  # past Python's 4,300-digit limit on int()
# Every place a run of digits can stand in an expression.
HUGE_EXPRESSIONS = [f"n{HUGE}", f"n[1-{HUGE}]", f"n[{HUGE}]", f"n[0-1]{HUGE}", f"n[1,{HUGE}]", f"{HUGE}n"]


@pytest.mark.parametrize("expression", HUGE_EXPRESSIONS)
def test_a_number_of_thousands_of_digits_is_invalid_input(expression: str) -> None:
    with pytest.raises(InvalidInput, match="more than 63 digits"):
        hostlist.expand(expression)


def test_the_bound_is_the_longest_node_name() -> None:
    longest = "n" + "1" * 62  # 63 characters, the most a node name holds
    assert hostlist.expand([longest]) == [longest]
    assert hostlist.collect([longest]) == longest
    with pytest.raises(InvalidInput, match="more than 63 digits"):
        hostlist.expand(["n" + "1" * 64])


def test_collect_refuses_what_expand_refuses() -> None:
    with pytest.raises(InvalidInput, match="more than 63 digits"):
        hostlist.collect([f"n{HUGE}"])


def test_slurm_node_lists_are_bounded_too() -> None:
    squeue = {"jobs": [{"job_id": 1, "job_state": "RUNNING", "nodes": f"gpu[1-{HUGE}]"}]}
    with pytest.raises(InvalidInput, match=r"unreadable node list: .*more than 63 digits"):
        parse_squeue_json(json.dumps(squeue))
