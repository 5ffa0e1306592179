"""Time-slicing and MPS: the gpu_sharing setting, replica keys, and the MPS limits a rank is sent."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpufleet.jobs.schemas import JobSubmit
from gpufleet.protocol.jobs import JobStart
from gpufleet.protocol.sharing import (
    device_uuid,
    mps_environment,
    parse_replica,
    parse_sharing,
    replica_key,
    share_of,
)

GPU = "GPU-2d1afce4-dc7a-5d77-a12f-4f680b85f54b"


@pytest.mark.parametrize(
    ("text", "parsed"),
    [("exclusive", ("exclusive", 1)), ("time-slicing:4", ("time-slicing", 4)), (" mps:7 ", ("mps", 7))],
)
def test_sharing_values(text: str, parsed: tuple[str, int]) -> None:
    assert parse_sharing(text) == parsed


@pytest.mark.parametrize("text", ["shared", "mps", "mps:1", "mps:49", "time-slicing:0", "timeslicing:4", "mps:x"])
def test_a_sharing_value_that_cannot_be_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"exclusive, time-slicing:N or mps:N|replicas per GPU"):
        parse_sharing(text)


def test_a_replica_names_its_gpu_and_counts_as_its_share() -> None:
    key = replica_key(GPU, "mps", 2, 4)

    assert parse_replica(key) == (GPU, "mps", 4)
    assert device_uuid(key) == GPU
    assert share_of(key) == 0.25
    assert device_uuid("MIG-1234") == "MIG-1234"
    assert share_of("MIG-1234") == 1.0
    assert parse_replica(GPU) is None


def test_mps_limits_split_the_sms_and_the_memory_and_name_the_gpus_own_daemon() -> None:
    keys = [replica_key(GPU, "mps", 0, 4)]

    assert mps_environment(keys, {GPU: 143771}) == {
        "CUDA_MPS_PIPE_DIRECTORY": f"/tmp/nvidia-mps-{GPU}",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=35942M",
    }
    assert mps_environment([replica_key(GPU, "time-slicing", 0, 4)], {GPU: 143771}) == {}
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in mps_environment(keys, {})  # memory unknown: SMs only


def test_the_mps_mark_travels_only_when_set() -> None:
    start = JobStart(job_id=1, run=1, rank=0, world_size=1, user="alice", time_limit_s=60)

    assert "mps" not in start.model_dump()  # an agent older than the field still reads it
    assert start.model_copy(update={"mps": True}).model_dump()["mps"] is True


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"gpu_profile": "shared", "gpus_per_node": 2}, "asks for one replica"),
        ({"env": {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"}}, "CUDA_MPS_\\* variables are gpufleet's"),
    ],
)
def test_a_job_cannot_take_two_replicas_or_set_the_mps_limits_itself(spec: dict[str, object], says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        JobSubmit.model_validate({"argv": ["true"], **spec})
