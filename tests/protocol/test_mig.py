"""MIG profiles and layouts: NVIDIA's tables as written down, layouts read and placed, refusals explained."""

from __future__ import annotations

import pynvml
import pytest

from gpufleet.protocol.mig import (
    COMPUTE_PROFILE_OF_SLICES,
    PROFILES,
    LayoutError,
    layout_profiles,
    mig_family,
    parse_layout,
    plan,
    profile_fraction,
)

H200 = "NVIDIA H200"


@pytest.mark.parametrize(
    ("model", "memory", "family"),
    [
        ("NVIDIA H200", 143771, "H200"),
        ("NVIDIA H100 80GB HBM3", 81559, "H100-80GB"),
        ("NVIDIA A100-SXM4-80GB", 81920, "A100-80GB"),
        ("NVIDIA A100-SXM4-40GB", 40960, "A100-40GB"),
        ("NVIDIA A100-PCIE-40GB", 40960, "A100-40GB"),
        ("Tesla T4", 15360, None),
        ("NVIDIA RTX A5000", 24564, None),
    ],
)
def test_mig_family_of_a_model(model: str, memory: int, family: str | None) -> None:
    assert mig_family(model, memory) == family


@pytest.mark.parametrize("family", sorted(PROFILES))
def test_every_model_offers_nvidias_six_profiles_with_their_maximum_counts(family: str) -> None:
    # NVIDIA's tables: 7 of 1g, 4 of the double-memory 1g, 3 of 2g, 2 of 3g, 1 of 4g, 1 of 7g.
    counts = sorted(p.max_count for p in PROFILES[family].values())
    slices = sorted(p.slices for p in PROFILES[family].values())

    assert counts == [1, 1, 2, 3, 4, 7]
    assert slices == [1, 1, 2, 3, 4, 7]


def test_profile_constants_are_nvmls() -> None:
    profiles = {p.name: p for p in PROFILES["H200"].values()}

    assert profiles["1g.18gb"].nvml_profile == pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE
    assert profiles["1g.35gb"].nvml_profile == pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2
    assert profiles["2g.35gb"].nvml_profile == pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE
    assert profiles["3g.71gb"].nvml_profile == pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE
    assert profiles["4g.71gb"].nvml_profile == pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE
    assert profiles["7g.141gb"].nvml_profile == pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE
    assert COMPUTE_PROFILE_OF_SLICES == {
        1: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
        2: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
        3: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
        4: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
        7: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
    }


@pytest.mark.parametrize(
    ("layout", "placed"),
    [
        ("all-1g.18gb", [("1g.18gb", s) for s in range(7)]),
        ("all-1g.35gb", [("1g.35gb", s) for s in (0, 2, 4, 6)]),
        ("3g.71gb+4g.71gb", [("4g.71gb", 0), ("3g.71gb", 4)]),
        ("4g.71gb+3g.71gb", [("4g.71gb", 0), ("3g.71gb", 4)]),
        ("2x1g.18gb+2g.35gb+3g.71gb", [("2g.35gb", 0), ("1g.18gb", 2), ("1g.18gb", 3), ("3g.71gb", 4)]),
        ("7g.141gb", [("7g.141gb", 0)]),
        ("none", []),
    ],
)
def test_layouts_are_placed_as_nvidia_allows(layout: str, placed: list[tuple[str, int]]) -> None:
    assert [(i.profile.name, i.start) for i in plan(layout, H200, 143771)] == placed


@pytest.mark.parametrize(
    ("layout", "model", "says"),
    [
        ("4g.71gb+4g.71gb", H200, "needs 8 compute slices"),
        ("3g.71gb+3g.71gb+1g.18gb", H200, "placements overlap"),
        ("7g.141gb+1g.18gb", H200, "needs 8 compute slices"),
        ("5x1g.35gb", H200, "placements overlap"),
        ("all-1g.10gb", H200, "has no MIG profile 1g.10gb; it has 1g.18gb"),
        ("all-1g.18gb", "Tesla T4", "has no MIG"),
        ("1g.18gb+", H200, "is not a MIG profile"),
        ("all-8x1g.18gb", H200, "use all-PROFILE"),
        ("x" * 200, H200, "at most 128 characters"),
    ],
)
def test_a_layout_that_cannot_be_is_refused_with_why(layout: str, model: str, says: str) -> None:
    with pytest.raises(LayoutError, match=says.replace("+", r"\+")):
        plan(layout, model, 143771)


def test_parse_layout_counts_and_all() -> None:
    assert parse_layout("all-1g.18gb") == [("1g.18gb", None)]
    assert parse_layout("2x1g.18gb+3g.71gb") == [("1g.18gb", 2), ("3g.71gb", 1)]
    assert parse_layout(" none ") == []
    assert layout_profiles("2x1g.18gb+2g.35gb+3g.71gb", H200) == {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}


def test_a_profiles_fraction_is_its_compute_slices_of_seven() -> None:
    assert profile_fraction(H200, "1g.18gb") == pytest.approx(1 / 7)
    assert profile_fraction(H200, "3g.71gb") == pytest.approx(3 / 7)
    assert profile_fraction(H200, "7g.141gb") == 1.0
    with pytest.raises(ValueError, match="not a MIG profile"):
        profile_fraction(H200, "big")
