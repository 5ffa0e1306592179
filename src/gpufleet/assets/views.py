"""Fleet views over installed software (pure: lists in, answers out; `assets.store` loads the lists).

- `version_matrix`: for the software that defines a GPU node (kernel, NVIDIA driver, CUDA, cuDNN,
  NCCL, firmware), which nodes run which version.
- `drift`: per node category, the version most of its nodes run (or the one the category pins) and
  the nodes that run another: "3 nodes run driver 535.183.01, the category runs 550.90.07".
- `diff`: what differs between two nodes.
- `where`: which nodes have a package, optionally only in a version range (`<2.31.0`,
  `>=535,<550.90.07`), compared with the package's own ecosystem's ordering.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpufleet.assets.matching import package_key
from gpufleet.assets.records import Installed
from gpufleet.assets.versions import InvalidVersion, scheme_of, sort_key

# What the matrix and drift follow by default: (ecosystem, name) as the agent reports them.
KEY_SOFTWARE: tuple[tuple[str, str], ...] = (
    ("Linux", "kernel"),
    ("NVIDIA", "driver"),
    ("NVIDIA", "cuda-driver"),
    ("NVIDIA", "cuda-toolkit"),
    ("NVIDIA", "cudnn"),
    ("NVIDIA", "nccl"),
    ("firmware", "gpu-vbios"),
    ("firmware", "gpu-inforom"),
    ("firmware", "hca"),
    ("firmware", "bios"),
)

NodePackages = Mapping[str, Iterable[Installed]]  # node name -> what it runs


def _versions(packages: Iterable[Installed], ecosystem: str, name: str) -> list[str]:
    wanted = package_key(ecosystem, name)
    found = {p.version for p in packages if p.ecosystem == ecosystem and package_key(ecosystem, p.name) == wanted}
    return sorted(found)


def software_label(ecosystem: str, name: str) -> str:
    return name if ecosystem in ("Linux", "NVIDIA", "firmware") else f"{ecosystem}:{name}"


def version_matrix(
    nodes: NodePackages, software: Iterable[tuple[str, str]] = KEY_SOFTWARE
) -> dict[str, dict[str, list[str]]]:
    """{software: {version: [nodes]}}; a node with several versions (GPUs with different VBIOS) is
    listed under each; software no node has is left out."""
    matrix: dict[str, dict[str, list[str]]] = {}
    for ecosystem, name in software:
        by_version: dict[str, list[str]] = defaultdict(list)
        for node, packages in sorted(nodes.items()):
            for version in _versions(packages, ecosystem, name):
                by_version[version].append(node)
        if by_version:
            matrix[software_label(ecosystem, name)] = dict(sorted(by_version.items()))
    return matrix


@dataclass
class Drift:
    category: str
    software: str
    baseline: str  # the pinned version, else the one most of the category's nodes run
    pinned: bool
    nodes: dict[str, list[str]] = field(default_factory=dict)  # other version -> nodes running it

    def describe(self) -> str:
        source = "pins" if self.pinned else "mostly runs"
        parts = [
            f"{len(nodes)} node{'s' if len(nodes) != 1 else ''} run {self.software} {version}"
            for version, nodes in sorted(self.nodes.items())
        ]
        return f"{self.category}: " + "; ".join(parts) + f"; the category {source} {self.baseline}"


def drift(
    nodes: NodePackages,
    categories: Mapping[str, str | None],
    pins: Mapping[tuple[str, str], str] | None = None,
    software: Iterable[tuple[str, str]] = KEY_SOFTWARE,
) -> list[Drift]:
    """Nodes whose key software differs from their category's baseline. `pins` maps (category,
    software label) to the version the category should run; without a pin the baseline is the
    version most of its nodes run (ties: the highest)."""
    pins = pins or {}
    members: dict[str, list[str]] = defaultdict(list)
    for node in nodes:
        members[categories.get(node) or "(none)"].append(node)
    found = []
    for category, names in sorted(members.items()):
        for ecosystem, name in software:
            label = software_label(ecosystem, name)
            running = {node: _versions(nodes[node], ecosystem, name) for node in names}
            running = {node: versions for node, versions in running.items() if versions}
            if not running:
                continue
            pinned = pins.get((category, label))
            counts = Counter(v for versions in running.values() for v in versions)
            baseline = pinned or max(counts, key=lambda v: (counts[v], _order(ecosystem, v)))
            odd: dict[str, list[str]] = defaultdict(list)
            for node, versions in sorted(running.items()):
                for version in versions:
                    if version != baseline:
                        odd[version].append(node)
            if odd:
                found.append(Drift(category, label, baseline, pinned is not None, dict(odd)))
    return found


def _order(ecosystem: str, version: str) -> tuple[int, object]:
    try:
        return (1, sort_key(scheme_of(ecosystem), version))
    except InvalidVersion:
        return (0, version)


@dataclass
class Diff:
    only_a: list[Installed]
    only_b: list[Installed]
    changed: list[tuple[Installed, Installed]]


def diff(a: Iterable[Installed], b: Iterable[Installed]) -> Diff:
    """Packages only on one side, and those on both in different versions (by ecosystem, name and
    location: two GPUs' VBIOS are two entries)."""

    def keyed(packages: Iterable[Installed]) -> dict[tuple[str, str, str], Installed]:
        return {(p.ecosystem, package_key(p.ecosystem, p.name), p.location or ""): p for p in packages}

    left, right = keyed(a), keyed(b)
    return Diff(
        only_a=[left[k] for k in sorted(left.keys() - right.keys())],
        only_b=[right[k] for k in sorted(right.keys() - left.keys())],
        changed=[
            (left[k], right[k]) for k in sorted(left.keys() & right.keys()) if left[k].version != right[k].version
        ],
    )


_CLAUSE = re.compile(r"^\s*(<=|>=|==|!=|<|>|=)?\s*([^\s<>=!,]+)\s*$")


def parse_range(text: str) -> list[tuple[str, str]]:
    """`<2.31.0`, `>=535,<550.90.07`, `==1.2.3` or a bare version (==). Raises ValueError."""
    clauses = []
    for part in text.split(","):
        match = _CLAUSE.match(part)
        if match is None:
            raise ValueError(f"not a version range: {text!r} (e.g. '<2.31.0' or '>=535,<550.90.07')")
        op, version = match.groups()
        clauses.append(("==" if op in (None, "=") else op, version))
    return clauses


def in_range(ecosystem: str, version: str, clauses: list[tuple[str, str]]) -> bool:
    """Whether `version` satisfies every clause, in the ecosystem's own ordering. Raises InvalidVersion."""
    scheme = scheme_of(ecosystem)
    key = sort_key(scheme, version)
    for op, bound in clauses:
        other = sort_key(scheme, bound)
        ok = {
            "<": key < other,
            "<=": key <= other,
            ">": key > other,
            ">=": key >= other,
            "==": key == other,
            "!=": key != other,
        }[op]
        if not ok:
            return False
    return True


def where(
    nodes: NodePackages, package: str, clauses: list[tuple[str, str]] | None = None, ecosystem: str | None = None
) -> list[tuple[str, Installed]]:
    """(node, package) for every node with `package` (a binary or source name) in range."""
    found = []
    for node, packages in sorted(nodes.items()):
        for p in packages:
            if ecosystem is not None and p.ecosystem != ecosystem:
                continue
            names = {package_key(p.ecosystem, p.name)} | ({p.source_name.lower()} if p.source_name else set())
            if package_key(p.ecosystem, package) not in names:
                continue
            try:
                if clauses and not in_range(p.ecosystem, p.version, clauses):
                    continue
            except InvalidVersion:
                continue
            found.append((node, p))
    return found
