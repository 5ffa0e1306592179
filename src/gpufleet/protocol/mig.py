"""MIG (Multi-Instance GPU): the profiles each GPU model offers, layouts, and what the agent reports.

The profile tables are NVIDIA's (the MIG user guide's "Supported MIG Profiles" for A100 40/80 GB,
H100 80 GB and H200 141 GB): a GPU has 7 compute slices and 8 memory slices; a GPU instance of a
profile takes `size` consecutive memory slots starting at one of its allowed `starts`, and two
instances may not overlap. The profile ids are NVML's (`nvmlGpuInstanceProfileInfo_t.id`, what
`nvidia-smi mig -lgip` prints), the same on every model; the `+me` (media extension) variants are left
out: gpufleet neither declares nor schedules them, though the inventory reports whatever it finds.

A *layout* is what an admin declares for every GPU of a node: `all-1g.18gb` (as many of one profile
as fit), `3g.71gb+4g.71gb` or `2x1g.18gb+2g.35gb+3g.71gb` (profiles, each optionally with a count),
or `none` (MIG disabled: whole GPUs). `plan` checks one against a model and places it; a layout that
does not fit is refused with the reason.

Lives in the wire layer: the agent applies what this module places, the head validates and schedules
with it, and the CLI spells layouts with it.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from gpufleet.protocol.bounds import MAX_INT64

COMPUTE_SLICES = 7  # a MIG-capable GPU's compute slices: a profile's fraction of the GPU is g/7
MEMORY_SLOTS = 8  # placement positions (memory slices)
MAX_INSTANCES_PER_GPU = 7
NO_MIG = "none"
LAYOUT_MAX_CHARS = 128

Uuid = Annotated[str, StringConstraints(pattern=r"^MIG-\S{1,92}$")]  # what CUDA_VISIBLE_DEVICES names


@dataclass(frozen=True, slots=True)
class Profile:
    """One GPU instance profile of one model."""

    name: str  # "1g.18gb"
    profile_id: int  # NVML's GPU instance profile id
    nvml_profile: int  # the NVML_GPU_INSTANCE_PROFILE_* constant that nvmlDeviceCreateGpuInstance takes
    slices: int  # compute slices, of COMPUTE_SLICES
    memory_mib: int
    size: int  # memory slots a placement takes
    starts: tuple[int, ...]  # where a placement may begin

    @property
    def fraction(self) -> float:
        """What an instance counts as in quotas and fair share: its compute share of the GPU."""
        return self.slices / COMPUTE_SLICES

    @property
    def max_count(self) -> int:
        return len(self.starts) if self.size < MEMORY_SLOTS else 1


# Placement rules shared by every model (NVML's possible placements, `nvidia-smi mig -lgipp`).
_SHAPES: dict[str, tuple[int, int, int, int, tuple[int, ...]]] = {
    # kind: (profile id, NVML_GPU_INSTANCE_PROFILE_*, compute slices, memory slots, starts)
    "1g": (19, 0x0, 1, 1, (0, 1, 2, 3, 4, 5, 6)),  # 1_SLICE
    "1g-double": (15, 0x9, 1, 2, (0, 2, 4, 6)),  # 1_SLICE_REV2: one compute slice, twice the memory
    "2g": (14, 0x1, 2, 2, (0, 2, 4)),  # 2_SLICE
    "3g": (9, 0x2, 3, 4, (0, 4)),  # 3_SLICE
    "4g": (5, 0x3, 4, 4, (0,)),  # 4_SLICE
    "7g": (0, 0x4, 7, 8, (0,)),  # 7_SLICE
}
# NVML_COMPUTE_INSTANCE_PROFILE_* of a compute instance spanning its whole GPU instance, by slices.
COMPUTE_PROFILE_OF_SLICES = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4}


def _model(*profiles: tuple[str, str, int]) -> dict[str, Profile]:
    out = {}
    for kind, name, memory_mib in profiles:
        pid, const, slices, size, starts = _SHAPES[kind]
        out[name] = Profile(name, pid, const, slices, memory_mib, size, starts)
    return out


# Memory per instance in MiB, as NVML's profile info (`nvidia-smi mig -lgip`, its GiB column) gives it:
# H100 and A100 80GB from -lgip readouts; H200's 1g, 2g and 7g from one; H200's 3g/4g (half of the 8 memory
# slices) and A100 40GB's by proportion, not seen in a readout.
PROFILES: dict[str, dict[str, Profile]] = {
    "A100-40GB": _model(
        ("1g", "1g.5gb", 4864), ("1g-double", "1g.10gb", 9856), ("2g", "2g.10gb", 9856),
        ("3g", "3g.20gb", 19968), ("4g", "4g.20gb", 19968), ("7g", "7g.40gb", 40192),
    ),
    "A100-80GB": _model(
        ("1g", "1g.10gb", 9728), ("1g-double", "1g.20gb", 19968), ("2g", "2g.20gb", 19968),
        ("3g", "3g.40gb", 40192), ("4g", "4g.40gb", 40192), ("7g", "7g.80gb", 81152),
    ),
    "H100-80GB": _model(
        ("1g", "1g.10gb", 9984), ("1g-double", "1g.20gb", 20096), ("2g", "2g.20gb", 20096),
        ("3g", "3g.40gb", 40448), ("4g", "4g.40gb", 40448), ("7g", "7g.80gb", 81152),
    ),
    "H200": _model(
        ("1g", "1g.18gb", 16384), ("1g-double", "1g.35gb", 33280), ("2g", "2g.35gb", 33280),
        ("3g", "3g.71gb", 66560), ("4g", "4g.71gb", 66560), ("7g", "7g.141gb", 143360),
    ),
}  # fmt: skip


def mig_family(model: str, memory_total_mib: int | None = None) -> str | None:
    """The PROFILES key of a GPU model name ("NVIDIA H200", "NVIDIA A100-SXM4-80GB"), or None for a GPU
    without MIG. An A100 whose name does not say its memory is told by `memory_total_mib`."""
    text = model.upper()
    if "GH200" in text or "GH100" in text:
        return None  # Grace Hopper sizes its profiles otherwise: not in these tables
    if "H200" in text:
        return "H200"
    if "H100" in text:
        return "H100-80GB" if "NVL" not in text and "94GB" not in text else None
    if "A100" in text:
        if "80GB" in text or (memory_total_mib or 0) > 60_000:
            return "A100-80GB"
        return "A100-40GB"
    return None


def profiles_of(model: str, memory_total_mib: int | None = None) -> dict[str, Profile]:
    """The profiles a GPU model offers by name (empty for a GPU without MIG)."""
    family = mig_family(model, memory_total_mib)
    return PROFILES[family] if family is not None else {}


def profile_fraction(model: str, profile: str) -> float:
    """A profile's share of its GPU, from its compute slices ("3g..." is 3/7) whatever the model."""
    match = re.match(r"^([1-8])g\.", profile)
    if match is None:
        raise ValueError(f"{profile!r} is not a MIG profile name (like 1g.18gb)")
    return min(int(match[1]), COMPUTE_SLICES) / COMPUTE_SLICES


def slurm_type(slices: int, memory_mib: int) -> str:
    """The GRES type Slurm's NVML plugin gives a MIG device: compute slices and memory in GiB rounded half
    away from zero (gpu_nvml.c), which is not always NVIDIA's name: an H200 1g.18gb (16 GiB) is 1g.16gb."""
    gib = int(memory_mib / 1024 + 0.5)
    return f"{slices}g.{gib}gb"


def slurm_types(profile: str) -> set[str]:
    """The GRES types Slurm may give instances of `profile`, over the models that offer it (one, mostly:
    an A100 80GB's 3g.40gb is 3g.39gb to Slurm, an H100's 3g.40gb)."""
    return {slurm_type(p.slices, p.memory_mib) for family in PROFILES.values() if (p := family.get(profile))}


class LayoutError(ValueError):
    """A layout that cannot be read, or does not fit the GPU it is meant for; the message says why."""


_TERM = re.compile(r"^(?:(?P<count>[1-7])x)?(?P<profile>[1-8]g\.[0-9]{1,4}gb)$")


def parse_layout(text: str) -> list[tuple[str, int | None]]:
    """The terms of a layout: (profile, count) pairs, count None for `all-PROFILE`; [] for `none`.

    Syntax only (the model decides which profiles exist). Raises LayoutError."""
    text = text.strip()
    if len(text) > LAYOUT_MAX_CHARS:
        raise LayoutError(f"a MIG layout is at most {LAYOUT_MAX_CHARS} characters")
    if text == NO_MIG:
        return []
    if text.startswith("all-"):
        profile = text.removeprefix("all-")
        if _TERM.match(profile) is None or "x" in profile:
            raise LayoutError(f"{text!r}: use all-PROFILE, e.g. all-1g.18gb")
        return [(profile, None)]
    terms: list[tuple[str, int | None]] = []
    for term in text.split("+"):
        match = _TERM.match(term.strip())
        if match is None:
            raise LayoutError(
                f"{text!r}: {term!r} is not a MIG profile; write a layout as none, all-1g.18gb, "
                "3g.71gb+4g.71gb or 2x1g.18gb+2g.35gb+3g.71gb"
            )
        terms.append((match["profile"], int(match["count"] or 1)))
    return terms


@dataclass(frozen=True, slots=True)
class PlacedInstance:
    profile: Profile
    start: int


def plan(layout: str, model: str, memory_total_mib: int | None = None) -> list[PlacedInstance]:
    """The GPU instances `layout` makes on a GPU of `model`, placed; [] for `none`.

    Raises LayoutError for bad syntax, a GPU without MIG, a profile the model lacks, or profiles that do
    not fit together (their placements overlap whatever the order)."""
    terms = parse_layout(layout)
    if not terms:
        return []
    offered = profiles_of(model, memory_total_mib)
    if not offered:
        raise LayoutError(f"{model} has no MIG (MIG needs an A100, H100 or H200)")
    wanted: list[Profile] = []
    for name, count in terms:
        profile = offered.get(name)
        if profile is None:
            raise LayoutError(f"{model} has no MIG profile {name}; it has {', '.join(offered)}")
        wanted += [profile] * (profile.max_count if count is None else count)
    if sum(p.slices for p in wanted) > COMPUTE_SLICES:
        raise LayoutError(f"{layout!r} needs {sum(p.slices for p in wanted)} compute slices; a GPU has 7")
    placed = _place(sorted(wanted, key=lambda p: (-p.size, p.starts)), 0)
    if placed is None:
        raise LayoutError(f"{layout!r} does not fit on one {model}: its instances' placements overlap")
    return sorted(placed, key=lambda i: i.start)


def _place(todo: list[Profile], used: int) -> list[PlacedInstance] | None:
    """Backtracking over the allowed starts, biggest instances first (7 instances at most: tiny)."""
    if not todo:
        return []
    profile, rest = todo[0], todo[1:]
    for start in profile.starts:
        mask = ((1 << profile.size) - 1) << start
        if start + profile.size <= MEMORY_SLOTS and not used & mask:
            tail = _place(rest, used | mask)
            if tail is not None:
                return [PlacedInstance(profile, start), *tail]
    return None


def layout_profiles(layout: str, model: str, memory_total_mib: int | None = None) -> Counter[str]:
    """How many instances of each profile `layout` makes on one GPU (empty for `none`). Raises LayoutError."""
    return Counter(i.profile.name for i in plan(layout, model, memory_total_mib))


# -- what the agent reports and what the head sends ---------------------------------------------------


class MigInstance(BaseModel):
    """One MIG device: a GPU instance with its compute instance, as NVML (or nvidia-smi) lists it."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    uuid: Uuid  # "MIG-…": what CUDA_VISIBLE_DEVICES names
    profile: Annotated[str, StringConstraints(max_length=32)]  # "1g.18gb"; "" where unknown
    gpu_instance: int = Field(ge=0, le=64)
    compute_instance: int = Field(ge=0, le=64)
    start: int | None = Field(default=None, ge=0, le=MEMORY_SLOTS)  # placement, where known
    slices: int = Field(default=1, ge=1, le=8)  # compute slices of the GPU instance
    memory_mib: int = Field(default=0, ge=0, le=1 << 24)


class MigApply(BaseModel):
    """Head to agent: give each listed GPU this layout (`none` turns MIG off). The agent refuses a GPU
    that runs anything (NVML says in use) and changes nothing on it."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    type: Literal["mig_apply"] = "mig_apply"
    id: int = Field(ge=0, le=MAX_INT64)
    gpus: dict[Annotated[int, Field(ge=0, le=63)], Annotated[str, StringConstraints(max_length=LAYOUT_MAX_CHARS)]] = (
        Field(max_length=64)
    )


class MigResult(BaseModel):
    """The agent's answer to MigApply: per GPU, "" when applied, else why not. The new inventory follows."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    type: Literal["mig_result"] = "mig_result"
    id: int = Field(ge=0, le=MAX_INT64)
    errors: dict[Annotated[int, Field(ge=0, le=63)], Annotated[str, StringConstraints(max_length=512)]] = Field(
        default_factory=dict, max_length=64
    )
