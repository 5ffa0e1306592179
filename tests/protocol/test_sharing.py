"""Time-slicing and MPS: the gpu_sharing setting, replica keys, and the MPS limits a rank is sent."""

from __future__ import annotations

import pytest

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


def test_mps_limits_split_the_sms_and_each_gpus_memory() -> None:
    keys = [replica_key(GPU, "mps", 0, 4)]

    assert mps_environment(keys, {GPU: 143771}) == {
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=35942M",
    }
    assert mps_environment([replica_key(GPU, "time-slicing", 0, 4)], {GPU: 143771}) == {}
    assert mps_environment(keys, {}) == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}  # memory unknown: SMs only
