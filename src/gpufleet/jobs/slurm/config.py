"""slurm.conf's node and partition lines and a gres.conf, rendered from the inventory (as Bright does).

Pure functions over plain data (`InventoryNode`, built from a `Node` row by `from_node`), so the rendering is
tested on data and the same inventory always renders the same text, byte for byte: a diff against the files
in place then shows only real changes.

What is rendered, and why:

- One `NodeName=` line per node shape (CPUs, memory, GPUs and their MIG instances, host name), its nodes as
  a compact hostlist (`gpu[001-016]`). `CPUs=` is the logical CPU count, as `slurmd -C` prints it.
  `RealMemory=` is the memory the agent read from /proc/meminfo (MemTotal, as slurmd reads it) rounded down
  to a whole GiB: MemTotal moves by a few MiB with the kernel version and firmware settings, and a RealMemory
  above what slurmd finds makes Slurm refuse the node ("Low RealMemory"); the rounding also lets nodes of one
  model share a line. A value the inventory lacks is left out (Slurm's default) and said in a warning.
  `NodeHostname=` only where the host's short name differs from the node's name.
- `Gres=gpu:<type>:<count>`, `<type>` the GPU model made into a GRES type (`gres_type`: "NVIDIA H200" is
  `h200`). A node that reported fewer GPUs than it ever had (`expected_gpus`: one fell off the bus) is rendered
  with what it should have, so the config does not follow a fault and Slurm keeps the node out of service
  until it is repaired; a warning names it.
- MIG: a GPU with MIG instances is not a GPU to Slurm but that many GPUs of their Slurm types, which users
  ask for as `--gres=gpu:<type>:2`. The type is Slurm's name for the instance, not NVIDIA's profile name:
  slurmd's NVML plugin (gpu_nvml.c) names a MIG device `<slices>g.<GiB>gb` from its GPU instance's compute
  slices and NVML's memory size (memorySizeMB) in GiB rounded half away from zero (protocol.mig.slurm_type),
  and a type in slurm.conf must be a substring of that name. NVIDIA rounds its profile names otherwise: an
  H200's 1g.18gb has 16384 MiB and is `1g.16gb` to Slurm (an A100 80GB's 3g.40gb, 40192 MiB, is `3g.39gb`; an
  H100's, 40448 MiB, `3g.40gb`), so rendering `1g.18gb` would make Slurm refuse every H200 MIG node. Each
  instance's type is made from its own slices and memory as the agent read them from NVML (`mig_slurm_type`);
  one reported without a memory size takes its profile's type from the profile tables where they give one
  (protocol.mig.slurm_types), and is otherwise left out with a warning. Eight H200 of seven 1g.18gb each are
  `Gres=gpu:1g.16gb:56`, and a node may mix them with whole GPUs (`gpu:h200:4,gpu:1g.16gb:28`; the whole GPUs'
  types first, then the MIG types by size). A GPU in MIG mode with no instances is rendered as a whole GPU,
  with a warning. A gpufleet job of a MIG profile asks Slurm for the same type (jobs.slurm.batch).
- One `PartitionName=` per node category (or per value of the node's `partition` setting, where set: see
  inventory.categories), and a default partition holding every rendered node.
- gres.conf, nodes without MIG instances: `NodeName=... Name=gpu Type=<type> File=/dev/nvidia[0-7]`. The
  inventory has no device minor numbers, so the file of GPU N is taken to be /dev/nvidiaN, N being the GPU's
  index as NVML enumerates it (PCI bus order). The driver numbers its device files in the order it probes the
  GPUs, which is the same order on ordinary servers but is not promised; where it differs, Slurm's
  `AutoDetect=nvml` (which reads the minor numbers from NVML) is the safer choice.
- gres.conf, nodes with MIG instances: `NodeName=... AutoDetect=nvml`, no File= lines. A MIG device's files
  are its GPU's /dev/nvidiaN and two /dev/nvidia-caps/nvidia-capM whose minors only the node knows, so Slurm
  (21.08 or later, built with NVML, as its MIG support requires) reads the node's GPUs and MIG devices from
  NVML. slurmd names each MIG device itself, `<model up to its first '-'>_<slices>g.<GiB>gb` in lower case
  ("nvidia_h200_1g.16gb" for an H200's 1g.18gb), and gives it the longest configured type that is a substring
  of that name; so a whole-GPU type at least as long as a MIG type and contained in its device name
  (`h100_80gb_hbm3` beside `1g.10gb`) would take the MIG devices and leave the whole GPUs unmatched: that node
  is said in a warning. Slurm's NVML plugin also exits on a GPU in MIG mode without instances, which is said
  too where the node has MIG instances (and so AutoDetect=nvml).
- Nodes that never reported an inventory (pre-registered, agent not joined) are left out and listed as
  skipped: rendering them without their GPUs would give Slurm a wrong node.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpufleet.core import hostlist
from gpufleet.core.errors import InvalidInput
from gpufleet.inventory.models import Gpu, Node
from gpufleet.protocol.mig import slurm_type, slurm_types

DEFAULT_PARTITION = "all"
DEVICE_PREFIX = "/dev/nvidia"
MIG_AUTODETECT = "nvml"
# Partition names: what a category may be called (inventory.schemas.Category), which Slurm accepts.
PARTITION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
GRES_TYPE_MAX = 64
# Words in a model name that say who made it or which product line, not which GPU it is: "NVIDIA H200",
# "Tesla V100-SXM2-16GB", "NVIDIA GeForce RTX 4090" become h200, v100-sxm2-16gb, rtx_4090.
_VENDOR_WORDS = ("nvidia", "tesla", "geforce", "quadro")
_NOT_IN_TYPE = re.compile(r"[^a-z0-9-]+")  # each run becomes one "_"
# A GPU instance profile in a MIG profile name: "1g.18gb", also in "1c.3g.71gb" and "1g.18gb+me".
_MIG_PROFILE = re.compile(r"(?<![0-9])([1-8])g\.([0-9]{1,4})gb")

NODES_BLOCK_HEADER = "# Rendered by gpufleet from its inventory (gpufleet slurm config); edits here are overwritten.\n"
GRES_CONF_HEADER = (
    "# gres.conf generated by gpufleet from its inventory (gpufleet slurm config --write); edits here are\n"
    "# overwritten. File=/dev/nvidiaN assumes device minor N is NVML's GPU index N (PCI bus order). Nodes\n"
    "# with MIG instances have AutoDetect=nvml instead: slurmd reads their GPUs and MIG devices from NVML.\n"
    "AutoDetect=off\n"
)


@dataclass(frozen=True)
class InventoryMig:
    """A MIG instance as the rendering reads it: its profile as the agent reported it ("1g.18gb"; "" where
    unknown), and what Slurm names it by: its GPU instance's compute slices and NVML's memory size in MiB
    (memorySizeMB; 0 where unknown)."""

    profile: str
    slices: int = 0
    memory_mib: int = 0


@dataclass(frozen=True)
class InventoryGpu:
    """A GPU as the rendering reads it. `mig`: its MIG instances, empty when MIG is off; `mig_enabled`: the
    GPU is in MIG mode (with or without instances)."""

    index: int
    model: str
    mig_enabled: bool = False
    mig: tuple[InventoryMig, ...] = ()


@dataclass(frozen=True)
class InventoryNode:
    """What the rendering reads of a node. `reported`: the agent has sent an inventory at least once."""

    name: str
    reported: bool
    category: str | None = None
    hostname: str | None = None
    cpus: int | None = None
    memory_mib: int | None = None
    gpus: tuple[InventoryGpu, ...] = ()
    expected_gpus: int = 0
    partition: str | None = None  # the `partition` setting; None: the category names the partition


@dataclass(frozen=True)
class Skipped:
    name: str
    reason: str


@dataclass(frozen=True)
class SlurmConfig:
    """The rendered text. `nodes_block`: the NodeName and PartitionName lines, which go between the markers
    in slurm.conf; `gres_conf`: the whole gres.conf."""

    nodes_block: str
    gres_conf: str
    nodes: list[str] = field(default_factory=list)
    partitions: list[str] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


_Counts = tuple[tuple[str, int], ...]  # (GRES type, count) for a node's Gres=


@dataclass(frozen=True)
class _GresLine:
    type: str
    indexes: tuple[int, ...]


@dataclass(frozen=True)
class _Shape:
    """Everything on a node's NodeName line and its gres.conf lines but its name: nodes of one shape share
    them. `gres`: (type, count) for Gres=; `files`: the gres.conf File= lines (nodes without MIG);
    `autodetect`: the node's gres.conf line is AutoDetect=nvml (nodes with MIG instances)."""

    cpus: int | None
    memory_mib: int | None
    hostname: str | None
    gres: _Counts
    files: tuple[_GresLine, ...]
    autodetect: bool


def from_node(node: Node, partition: str | None = None) -> InventoryNode:
    """The inventory of a `Node` row (with its GPUs loaded) as the rendering reads it; `partition` is the
    node's resolved `partition` setting."""
    return InventoryNode(
        name=node.name,
        reported=node.inventory_at is not None,
        category=node.category,
        hostname=node.hostname,
        cpus=node.cpus,
        memory_mib=node.memory_total_mib,
        gpus=tuple(InventoryGpu(g.index, g.model, g.mig_mode == "enabled", _mig_of(g)) for g in node.gpus),
        expected_gpus=node.expected_gpus or 0,
        partition=partition,
    )


def _mig_of(gpu: Gpu) -> tuple[InventoryMig, ...]:
    """A `Gpu` row's MIG instances. Read with getattr: a head whose schema predates the column has none."""
    return mig_instances(getattr(gpu, "mig", None))


def mig_instances(column: Iterable[object] | None) -> tuple[InventoryMig, ...]:
    """The MIG instances in a `Gpu` row's `mig` column: protocol.mig.MigInstance as dicts ([] when MIG is off).
    A value of the wrong kind reads as unknown ("" or 0)."""
    return tuple(
        InventoryMig(_text(_field(i, "profile")), _count(_field(i, "slices")), _count(_field(i, "memory_mib")))
        for i in column or ()
    )


def _field(instance: object, name: str) -> object:
    return instance.get(name) if isinstance(instance, dict) else getattr(instance, name, None)


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def gres_type(model: str) -> str:
    """A GPU model name as a GRES type: lower case, the leading vendor and product-line words dropped, each
    run of characters other than letters, digits and '-' (spaces included) made one '_'. "NVIDIA H100 80GB
    HBM3" is `h100_80gb_hbm3`, "NVIDIA A100-SXM4-80GB" `a100-sxm4-80gb`.

    Slurm reads `gpu:<type>:<count>`, so a type must not hold ':' ',' '=' or spaces, and one made only of
    digits would be read as a count: it is prefixed `gpu`. A name with nothing left is `unknown`.
    """
    words = model.lower().split()
    while len(words) > 1 and words[0] in _VENDOR_WORDS:
        words = words[1:]
    name = _NOT_IN_TYPE.sub("_", " ".join(words)).strip("_-")[:GRES_TYPE_MAX].strip("_-")
    if not name:
        return "unknown"
    return f"gpu{name}" if name.isdigit() else name


def _short_host(hostname: str | None) -> str | None:
    return hostname.split(".")[0] if hostname else None


def gpu_instance_profile(profile: str) -> str | None:
    """The GPU instance profile in a MIG profile name, `<slices>g.<GB>gb` as NVIDIA names it ("1g.18gb"): a
    compute-instance profile ("1c.3g.71gb") gives its GPU instance's (`3g.71gb`), a media-extension one
    ("1g.18gb+me") `1g.18gb`, as Slurm names a MIG device by its GPU instance alone. None for a name without
    one ("" where the agent could not read the profile)."""
    match = _MIG_PROFILE.search(profile.lower())
    return f"{int(match[1])}g.{int(match[2])}gb" if match else None


def mig_slurm_type(instance: InventoryMig) -> str | None:
    """The GRES type Slurm gives a MIG instance (protocol.mig.slurm_type): from its own slices and memory, or,
    for one reported without them, from its profile where the profile tables give it one type whatever the
    model. None where neither tells it (an unknown profile, or one that two models size differently)."""
    if instance.slices and instance.memory_mib:
        return slurm_type(instance.slices, instance.memory_mib)
    profile = gpu_instance_profile(instance.profile)
    types = slurm_types(profile) if profile else set()
    return next(iter(types)) if len(types) == 1 else None


def _mig_order(kind: str) -> tuple[int, int, str]:
    match = _MIG_PROFILE.search(kind)
    return (int(match[1]), int(match[2]), kind) if match else (0, 0, kind)


def slurm_mig_device(model: str, kind: str) -> str:
    """The name slurmd's NVML plugin gives a MIG device of Slurm type `kind` on a GPU of `model` (gpu_nvml.c):
    the model name up to its first '-', then '_' and the type, in lower case with spaces made '_'.
    "NVIDIA A100-SXM4-80GB" and `3g.39gb` give `nvidia_a100_3g.39gb`."""
    return f"{model.partition('-')[0]}_{kind}".lower().replace(" ", "_")


def _gres(node: InventoryNode, warnings: list[str]) -> tuple[_Counts, tuple[_GresLine, ...], bool]:
    """The node's GPUs as Slurm is told of them: the Gres= (type, count) pairs, whole GPU types first and then
    MIG types by size; the gres.conf File= lines (one per whole GPU type, with its GPU indexes); and whether
    the node has MIG instances (its gres.conf line is then AutoDetect=nvml, and there are no File= lines)."""
    gpus = sorted(node.gpus, key=lambda g: g.index)
    autodetect = any(gpu.mig for gpu in gpus)
    whole: dict[str, list[int]] = {}
    mig: dict[str, int] = {}
    for gpu in gpus:
        if not gpu.mig:
            if gpu.mig_enabled:
                exits = "; slurmd will not start (its NVML plugin exits on a GPU in MIG mode without instances)"
                warnings.append(
                    f"{node.name}: MIG is enabled on GPU {gpu.index} but it has no MIG instances; rendered as a "
                    f"whole GPU{exits if autodetect else ''}"
                )
            whole.setdefault(gres_type(gpu.model), []).append(gpu.index)
            continue
        unknown = 0
        for instance in gpu.mig:
            kind = mig_slurm_type(instance)
            if kind is None:
                unknown += 1
            else:
                mig[kind] = mig.get(kind, 0) + 1
        if unknown:
            warnings.append(
                f"{node.name}: GPU {gpu.index} has {unknown} MIG instance(s) whose Slurm type is unknown (no "
                "memory size reported, and no profile that tells it); left out of Gres=, so Slurm does not "
                "schedule them"
            )
    models = {gres_type(gpu.model) for gpu in gpus}
    if node.expected_gpus > len(gpus):
        if len(models) == 1:
            (only,) = models
            present = {gpu.index for gpu in gpus}
            absent = [i for i in range(node.expected_gpus + len(gpus)) if i not in present]
            whole[only] = sorted(whole.get(only, []) + absent[: node.expected_gpus - len(gpus)])
            how = " (the missing ones as whole GPUs: their MIG layout is unknown)" if autodetect else ""
            warnings.append(
                f"{node.name}: reports {len(gpus)} of its {node.expected_gpus} GPUs; rendered with "
                f"{node.expected_gpus}{how}, so Slurm keeps it out of service until it is repaired"
            )
        else:
            warnings.append(
                f"{node.name}: reports {len(gpus)} of its {node.expected_gpus} GPUs and the model of the missing "
                "ones is unknown; rendered with the GPUs it reports"
            )
    if autodetect:
        _warn_whole_types_taking_mig(node, gpus, sorted(whole), warnings)
    counts = tuple((t, len(indexes)) for t, indexes in sorted(whole.items()))
    counts += tuple((t, mig[t]) for t in sorted(mig, key=_mig_order))
    files = () if autodetect else tuple(_GresLine(t, tuple(indexes)) for t, indexes in sorted(whole.items()))
    return counts, files, autodetect


def _warn_whole_types_taking_mig(
    node: InventoryNode, gpus: Sequence[InventoryGpu], whole: Sequence[str], warnings: list[str]
) -> None:
    """slurmd matches each device NVML finds to the longest configured type that is a substring of its name
    (longest devices first), so a whole-GPU type at least as long as a MIG type, and in that MIG device's
    name, takes MIG devices: the whole GPUs are then left without a type and Slurm refuses the node."""
    devices = sorted(
        {(kind, slurm_mig_device(gpu.model, kind)) for gpu in gpus for i in gpu.mig if (kind := mig_slurm_type(i))}
    )
    for whole_type in whole:
        for kind, device in devices:
            if whole_type in device and len(whole_type) >= len(kind):
                warnings.append(
                    f"{node.name}: slurmd would give its {kind} MIG devices (it names them {device}) the type "
                    f"{whole_type}, the longest configured type in that name, and then refuse the node for the "
                    "whole GPUs left without a type; put all of its GPUs in MIG mode, or none"
                )


def real_memory(memory_mib: int) -> int:
    """RealMemory for a node whose MemTotal is `memory_mib`: rounded down to a whole GiB (below 1 GiB, as is)."""
    return memory_mib // 1024 * 1024 if memory_mib >= 1024 else memory_mib


def _shape(node: InventoryNode, warnings: list[str]) -> _Shape:
    cpus = node.cpus if node.cpus else None
    memory = real_memory(node.memory_mib) if node.memory_mib else None
    if cpus is None:
        warnings.append(f"{node.name}: no CPU count in the inventory; CPUs= left to Slurm (default 1)")
    if memory is None:
        warnings.append(f"{node.name}: no memory size in the inventory; RealMemory= left to Slurm (default 1 MiB)")
    host = _short_host(node.hostname)
    differs = host is not None and node.name not in (host, node.hostname)
    gres, files, autodetect = _gres(node, warnings)
    return _Shape(cpus, memory, host if differs else None, gres, files, autodetect)


def _node_line(names: str, shape: _Shape) -> str:
    words = [f"NodeName={names}"]
    if shape.hostname:
        words.append(f"NodeHostname={shape.hostname}")
    if shape.cpus is not None:
        words.append(f"CPUs={shape.cpus}")
    if shape.memory_mib is not None:
        words.append(f"RealMemory={shape.memory_mib}")
    if shape.gres:
        words.append("Gres=" + ",".join(f"gpu:{kind}:{count}" for kind, count in shape.gres))
    return " ".join(words)


def _gres_lines(names: str, shape: _Shape, device_prefix: str) -> list[str]:
    if shape.autodetect:
        return [f"NodeName={names} AutoDetect={MIG_AUTODETECT}"]
    return [
        f"NodeName={names} Name=gpu Type={g.type} File={hostlist.collect([f'{device_prefix}{i}' for i in g.indexes])}"
        for g in shape.files
    ]


def _grouped(nodes: Iterable[tuple[InventoryNode, _Shape]]) -> list[tuple[str, _Shape]]:
    """Nodes of one shape as one hostlist, in the order of each shape's first node."""
    groups: dict[_Shape, list[str]] = {}
    for node, shape in nodes:
        groups.setdefault(shape, []).append(node.name)
    return [(hostlist.collect(names), shape) for shape, names in groups.items()]


def render(
    nodes: Sequence[InventoryNode],
    *,
    default_partition: str = DEFAULT_PARTITION,
    device_prefix: str = DEVICE_PREFIX,
) -> SlurmConfig:
    """The node and partition lines of slurm.conf and a gres.conf for `nodes`.

    `default_partition` names the partition that holds every rendered node (Default=YES); each category
    gets its own partition beside it. `device_prefix` + the GPU index is each GPU's device file (tests point
    it at fake devices). Raises InvalidInput for a partition name Slurm would not read, or a category that
    has the default partition's name (the two partitions would collide).
    """
    if not PARTITION_NAME.match(default_partition):
        raise InvalidInput(
            f"invalid partition name {default_partition!r}: use letters, digits, '.', '_' and '-' (max 63)"
        )
    if default_partition.casefold() == "default":
        raise InvalidInput("the partition cannot be called DEFAULT: Slurm reads that as defaults for partitions")
    warnings: list[str] = []
    skipped: list[Skipped] = []
    shaped: list[tuple[InventoryNode, _Shape]] = []
    for node in sorted(nodes, key=lambda n: n.name):
        if not node.reported:
            skipped.append(Skipped(node.name, "no inventory reported yet (the agent has not joined)"))
            continue
        shaped.append((node, _shape(node, warnings)))
    categories: dict[str, list[str]] = {}
    for node, _ in shaped:
        group = node.partition or node.category
        if group:
            categories.setdefault(group, []).append(node.name)
    for category in list(categories):
        if category.casefold() == "default" or not PARTITION_NAME.match(category):
            # PartitionName=DEFAULT (in any case) sets defaults for the partitions after it: never a partition.
            warnings.append(
                f"category {category!r} cannot name a Slurm partition; its nodes are only in the default one"
            )
            del categories[category]
    if default_partition in categories:
        raise InvalidInput(
            f"category {default_partition!r} has the default partition's name: choose another default partition"
        )
    node_lines: list[str] = []
    gres_lines: list[str] = []
    for expression, shape in _grouped(shaped):
        node_lines.append(_node_line(expression, shape))
        gres_lines.extend(_gres_lines(expression, shape, device_prefix))
    partition_lines = []
    names = [node.name for node, _ in shaped]
    if names:
        partition_lines.append(
            f"PartitionName={default_partition} Nodes={hostlist.collect(names)} Default=YES State=UP"
        )
    for category in sorted(categories):
        partition_lines.append(f"PartitionName={category} Nodes={hostlist.collect(categories[category])} State=UP")
    block = NODES_BLOCK_HEADER + "".join(f"{line}\n" for line in node_lines + partition_lines)
    gres = GRES_CONF_HEADER + "".join(f"{line}\n" for line in gres_lines)
    partitions = ([default_partition] if names else []) + sorted(categories)
    return SlurmConfig(block, gres, names, partitions, skipped, warnings)
