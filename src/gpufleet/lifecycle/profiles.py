"""Burn-in profiles: the steps a node must pass, with their thresholds per GPU model, kept as TOML files.

A profile is a file `<name>.toml`:

    name = "quick"
    description = "Ten-minute acceptance for a new GPU node."

    [[steps]]
    name = "gemm"              # unique within the profile; the step's name in results
    kind = "gemm"              # what gpufleet-burnin runs (protocol.burnin.KINDS)
    seconds = 30               # how long it loads the node (the job's limit is 3 × this + 2 minutes)
    options = { dtype = "bf16" }   # passed through as --dtype bf16

    [steps.threshold]          # per GPU model: the first key the model's name contains (case-insensitive)
    "H200" = 600.0             # TFLOPS at least (the kind says whether higher or lower is better)
    "H100" = 500.0
    default = 100.0            # any other model (and CPU-only nodes); left out: no threshold

Steps of a multi-node kind (allreduce, network) run over nodes under test measured together
(lifecycle.pairing, lifecycle.grouping): pairs by default; an all-reduce step may say `group = N` (2 to
MAX_GROUP) to measure N nodes at once. The network step measures point-to-point links, two nodes at a
time, so a group other than 2 is refused there, as is `group` on a single-node step: a key that would be
silently ignored is a mistake to report, not to guess around.
GPU steps are skipped on a node without GPUs. The built-in profiles live in profile_files/ beside this
module; admins add their own in `burnin_profiles_dir`, where a file replaces the built-in of the same name.
A bad file is refused with InvalidInput naming the file and the problem, and never hides the others.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.core.errors import InvalidInput
from gpufleet.core.toml_files import Refused, load_dirs, load_file
from gpufleet.protocol.burnin import GPU_KINDS, KINDS, MULTI_NODE_KINDS

BUILTIN_DIR = Path(__file__).resolve().parent / "profile_files"
NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
OPTION = re.compile(r"^[a-z][a-z0-9-]{0,31}$")
MAX_STEPS = 64
MAX_SECONDS = 24 * 3600
_FILE_KEYS = ("name", "description", "steps")
_STEP_KEYS = ("name", "kind", "seconds", "options", "threshold", "group")
# Multi-node kinds whose measurement spans any number of nodes (one ring over all of them). `network` is not
# one: its rank 0 measures each partner's link in turn, so a group of N would take N - 1 times the step's
# time (past its job's limit) and still judge point-to-point links.
GROUP_KINDS = frozenset({"allreduce"})
PAIR = 2
# A group of 64 nodes is one all-reduce over 64 hosts, and a weak one among them is named in six more rounds
# of the step (grouping): beyond it one job holds a large share of a fleet, and a failed one holds its
# batch for longer than a burn-in should take.
MAX_GROUP = 64


@dataclass(frozen=True, slots=True)
class Step:
    name: str
    kind: str
    seconds: float
    options: Mapping[str, str] = field(default_factory=dict)
    threshold: Mapping[str, float] = field(default_factory=dict)  # GPU model key (lowercase) or "default"
    group: int = PAIR  # nodes measured together by a multi-node step (2: pairs); unused by single-node steps

    @property
    def better(self) -> str:
        """ "higher" or "lower": which way the value must lie from the threshold."""
        return KINDS[self.kind]

    @property
    def multi_node(self) -> bool:
        return self.kind in MULTI_NODE_KINDS

    @property
    def needs_gpu(self) -> bool:
        return self.kind in GPU_KINDS

    @property
    def time_limit_s(self) -> float:
        return 3 * self.seconds + 120

    def threshold_for(self, gpu_model: str | None) -> float | None:
        """The threshold for a node whose GPUs are `gpu_model` (None: no GPU), or None for no threshold."""
        model = (gpu_model or "").lower()
        for key, value in self.threshold.items():
            if key != "default" and model and key in model:
                return value
        return self.threshold.get("default")

    def argv(self) -> list[str]:
        """The step job's command line."""
        argv = ["gpufleet-burnin", self.kind, "--seconds", f"{self.seconds:g}"]
        for key, value in self.options.items():
            argv += [f"--{key}", value]
        return argv

    def passes(self, value: float, threshold: float | None) -> bool:
        if threshold is None:
            return True
        return value >= threshold if self.better == "higher" else value <= threshold


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    description: str
    steps: tuple[Step, ...]
    path: str = ""


def load_profile(path: Path) -> Profile:
    """One profile file. Raises InvalidInput naming the file."""
    return load_file(path, _profile)


def load_profiles(admin_dirs: Sequence[Path] = ()) -> tuple[dict[str, Profile], list[str]]:
    """The built-in profiles, then each admin directory's, a later file replacing an earlier one of the same
    name. A file that fails to load is left out and its problem listed; a missing directory is skipped."""
    return load_dirs((BUILTIN_DIR, *admin_dirs), _profile, lambda profile: profile.name)


def get_profile(name: str, admin_dirs: Sequence[Path] = ()) -> Profile:
    """Raises InvalidInput when there is no such profile (naming those there are, and any broken file)."""
    profiles, problems = load_profiles(admin_dirs)
    if name in profiles:
        return profiles[name]
    broken = [p for p in problems if f"{name}.toml" in p]
    if broken:
        raise InvalidInput(broken[0])
    raise InvalidInput(f"no burn-in profile {name!r}; there are: {', '.join(sorted(profiles)) or 'none'}")


def _profile(path: Path, data: dict[str, object]) -> Profile:
    unknown = sorted(set(data) - set(_FILE_KEYS))
    if unknown:
        raise Refused(f"unknown key(s) {', '.join(unknown)}; a profile has {', '.join(_FILE_KEYS)}")
    name = data.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise Refused(f"name {name!r} must be lowercase letters, digits and dashes")
    if name != path.stem:
        raise Refused(f"name {name!r} differs from the file's name: call the file {name}.toml")
    description = data.get("description")
    if not isinstance(description, str) or not description.strip():
        raise Refused("description must be a non-empty string")
    raw = data.get("steps")
    if not isinstance(raw, list) or not raw:
        raise Refused("steps must be a non-empty array of tables ([[steps]])")
    if len(raw) > MAX_STEPS:
        raise Refused(f"at most {MAX_STEPS} steps")
    steps = [_step(i, s) for i, s in enumerate(raw, 1)]
    names = [s.name for s in steps]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise Refused(f"step name(s) {', '.join(dupes)} used twice")
    return Profile(name, description.strip(), tuple(steps), str(path))


def _step(position: int, data: object) -> Step:
    where = f"step {position}"
    if not isinstance(data, dict):
        raise Refused(f"{where} must be a table")
    unknown = sorted(set(data) - set(_STEP_KEYS))
    if unknown:
        raise Refused(f"{where}: unknown key(s) {', '.join(unknown)}; a step has {', '.join(_STEP_KEYS)}")
    kind = data.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        raise Refused(f"{where}: kind {kind!r} is not one of {', '.join(KINDS)}")
    name = data.get("name", kind)
    if not isinstance(name, str) or not NAME.match(name):
        raise Refused(f"{where}: name {name!r} must be lowercase letters, digits and dashes")
    where = f"step {name}"
    seconds = data.get("seconds", 30)
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 1 <= seconds <= MAX_SECONDS:
        raise Refused(f"{where}: seconds must be a number from 1 to {MAX_SECONDS}")
    options = _options(where, data.get("options", {}))
    limits = _thresholds(where, data.get("threshold", {}))
    return Step(name, kind, float(seconds), options, limits, _group(where, kind, data.get("group")))


def _group(where: str, kind: str, group: object) -> int:
    if group is None:
        return PAIR
    if kind not in MULTI_NODE_KINDS:
        raise Refused(
            f"{where}: group is for steps over several nodes ({', '.join(sorted(GROUP_KINDS))});"
            f" a {kind} step runs on one node"
        )
    if isinstance(group, bool) or not isinstance(group, int) or not PAIR <= group <= MAX_GROUP:
        raise Refused(
            f"{where}: group must be a whole number of nodes from {PAIR} to {MAX_GROUP} (2: pairs), not {group!r}"
        )
    if kind not in GROUP_KINDS and group != PAIR:
        raise Refused(
            f"{where}: group = {group} does not apply to a {kind} step: it measures point-to-point links, two nodes at"
            f" a time; leave group out (pairs), or use group on an {' or '.join(sorted(GROUP_KINDS))} step"
        )
    return group


def _options(where: str, options: object) -> dict[str, str]:
    if not isinstance(options, dict):
        raise Refused(f"{where}: options must be a table")
    opts: dict[str, str] = {}
    for key, value in options.items():
        if not OPTION.match(key):
            raise Refused(f"{where}: option {key!r} must be lowercase letters, digits and dashes")
        if isinstance(value, bool) or not isinstance(value, str | int | float) or len(str(value)) > 256:
            raise Refused(f"{where}: option {key} must be a string or a number (256 characters at most)")
        opts[key] = str(value)
    return opts


def _thresholds(where: str, threshold: object) -> dict[str, float]:
    if not isinstance(threshold, dict):
        raise Refused(f"{where}: threshold must be a table of GPU model = number")
    limits: dict[str, float] = {}
    for key, value in threshold.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise Refused(f"{where}: threshold {key!r} must be a finite number")
        if abs(value) > 1e12:
            raise Refused(f"{where}: threshold {key!r} is out of range")
        if not key.strip() or len(key) > 128:
            raise Refused(f"{where}: threshold keys are GPU model names (or default), 1 to 128 characters")
        limits[key.strip().lower()] = float(value)
    return limits
