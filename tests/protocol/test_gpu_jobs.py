"""`Sample.gpu_jobs`: optional (older agents send none), bounded, and strict about what it carries."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gpufleet.protocol.messages import MAX_CHANNEL_MESSAGE_BYTES
from gpufleet.protocol.metrics import MAX_GPU_JOBS_PER_SAMPLE, CheckResult, GpuJob, Sample


def test_a_sample_without_gpu_jobs_is_still_valid() -> None:
    old = Sample.model_validate_json('{"ts": 1.0, "entities": [], "checks": []}')  # an agent older than the field
    assert old.gpu_jobs == []


def test_gpu_jobs_travel_as_sent() -> None:
    sample = Sample(ts=1.0, entities=[], gpu_jobs=[GpuJob(gpu=3, job="4242", user="alice", account="vision")])
    again = Sample.model_validate_json(sample.model_dump_json())
    assert again.gpu_jobs == [GpuJob(gpu=3, job="4242", user="alice", account="vision")]
    assert GpuJob.model_validate({"gpu": 0, "job": "7"}) == GpuJob(gpu=0, job="7", user="", account="")


@pytest.mark.parametrize(
    "bad",
    [
        {"gpu": -1, "job": "1"},
        {"gpu": 256, "job": "1"},
        {"gpu": 0, "job": ""},
        {"gpu": 0, "job": "1" * 33},
        {"gpu": 0, "job": "12\n13"},
        {"gpu": 0, "job": "-1"},
        {"gpu": 0, "job": "1", "user": "a b"},
        {"gpu": 0, "job": "1", "user": 'x"y'},
        {"gpu": 0, "job": "1", "account": "a" * 65},
        {"gpu": 0, "job": "1", "partition": "gpu"},  # not a field: refused, as everywhere in the protocol
    ],
)
def test_bad_gpu_jobs_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        GpuJob.model_validate(bad)


def test_gpu_jobs_are_bounded_and_fit_a_message_beside_the_checks() -> None:
    worst = GpuJob(gpu=255, job="9" * 32, user="u" * 64, account="a" * 64)
    with pytest.raises(ValidationError):
        Sample(ts=1.0, entities=[], gpu_jobs=[worst] * (MAX_GPU_JOBS_PER_SAMPLE + 1))
    # The agent keeps its checks to half a message; the longest GPU jobs must fit in the other half.
    checks = [CheckResult(name=f"c{i}", status=1, message="m" * 256) for i in range(100)]
    full = Sample(ts=1.0, entities=[], checks=checks, gpu_jobs=[worst] * MAX_GPU_JOBS_PER_SAMPLE)
    assert len(Sample(ts=1.0, entities=[], checks=checks).model_dump_json()) <= MAX_CHANNEL_MESSAGE_BYTES // 2
    assert len(full.model_dump_json()) < MAX_CHANNEL_MESSAGE_BYTES - 100  # room for the envelope
