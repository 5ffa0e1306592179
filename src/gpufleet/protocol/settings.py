"""The node settings registry: every key a category or a node may set, defined once.

`NodeSettingValues` is the one definition of each key (its type, default, limits and help). The head
validates with it (`gpufleet.inventory.categories`), the API's schema is generated from it, and the
CLI's help for `category set` and `node set` is written from it. It lives here, in the pure wire
layer, because the CLI installs without the server's dependencies and still has to describe the keys.

Resolution is defaults < category < node: a node's own value wins over its category's, which wins
over the default below.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from gpufleet.protocol.mig import LAYOUT_MAX_CHARS, parse_layout
from gpufleet.protocol.sharing import parse_sharing

# One line of printable text: these values end up in an iPXE script, a Slurm configuration and an
# rsync command's argument, where a newline or control character would start a line of its own.
_LINE = r"^[^\x00-\x1f\x7f]*$"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"  # categories, images, partitions

Line = Annotated[str, StringConstraints(pattern=_LINE)]
# iPXE reads a script line as commands: `&&` and `||` chain another command and `${...}` expands a
# variable, so kernel parameters holding them could make a node boot something else entirely.
_IPXE_SYNTAX = ("&&", "||", "${")


def _no_ipxe_syntax(value: str) -> str:
    found = [token for token in _IPXE_SYNTAX if token in value]
    if found:
        raise ValueError(f"may not contain {' or '.join(found)}: iPXE would read it as a command")
    return value


KernelParams = Annotated[str, StringConstraints(pattern=_LINE), AfterValidator(_no_ipxe_syntax)]


def _mig_layout(value: str) -> str:
    parse_layout(value)  # the syntax here; whether the node's GPU model has the profiles, where it is applied
    return value.strip()


MigLayout = Annotated[str, AfterValidator(_mig_layout)]


def _gpu_sharing(value: str) -> str:
    parse_sharing(value)
    return value.strip()


GpuSharing = Annotated[str, AfterValidator(_gpu_sharing)]
Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]


class NodeSettingValues(BaseModel):
    """Every setting with its default. A category's or a node's stored settings hold only the keys
    set there; the rest come from the level below."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    software_image: Name | None = Field(None, description="the software image the node runs; image sync uses it")
    sync_target: Line = Field(
        "root@{address}:/",
        min_length=1,
        max_length=512,
        description="where image sync writes the node's image; {node} and {address} (its boot address) are "
        "substituted; an absolute path is a local directory",
    )
    partition: Name | None = Field(None, description="the workload manager's partition the node is in")
    kernel_params: KernelParams = Field("", max_length=1024, description="kernel command line appended at network boot")
    expected_gpus: int | None = Field(
        None, ge=0, le=64, description="GPUs the node must have; fewer fails the gpu_count health check"
    )
    gpu_model: Line | None = Field(
        None,
        min_length=1,
        max_length=128,
        description="the GPU model the node must have (matched as a case-insensitive substring)",
    )
    mig_layout: MigLayout | None = Field(
        None,
        max_length=LAYOUT_MAX_CHARS,
        description="the MIG layout of every GPU: none (whole GPUs), all-1g.18gb, 3g.71gb+4g.71gb, "
        "2x1g.18gb+2g.35gb+3g.71gb; applied to each GPU once it is idle (docs/sharing.md); unset: left as it is",
    )
    gpu_sharing: GpuSharing = Field(
        "exclusive",
        max_length=32,
        description="exclusive (a job has its GPUs to itself), time-slicing:N or mps:N: each whole GPU is N "
        "replicas for jobs asking --gpus shared:1, without MIG's isolation (docs/sharing.md)",
    )


@dataclass(frozen=True)
class SettingDef:
    """One key as people and scripts see it."""

    name: str
    type: str  # "str", "int": what a value on the command line is read as
    nullable: bool  # an empty value on the command line means "none"
    default: Any
    help: str


def _type_name(annotation: Any) -> tuple[str, bool]:
    """("int" or "str", whether None is allowed) of a field's annotation."""
    args = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)
    base = next(a for a in args if a is not type(None))
    while get_origin(base) is Annotated:
        base = get_args(base)[0]
    return ("int" if base is int else "str"), type(None) in args


def _registry() -> dict[str, SettingDef]:
    out = {}
    for name, info in NodeSettingValues.model_fields.items():
        type_name, nullable = _type_name(info.annotation)
        out[name] = SettingDef(name, type_name, nullable, info.default, info.description or "")
    return out


SETTINGS: dict[str, SettingDef] = _registry()


def settings_help() -> str:
    """The keys, their types and defaults, for the CLI's help."""
    lines = []
    for s in SETTINGS.values():
        default = "none" if s.default is None else repr(s.default)
        lines.append(f"{s.name} ({s.type}, default {default}): {s.help}")
    return "\n\n".join(lines)


def parse_assignments(items: list[str]) -> dict[str, Any]:
    """KEY=VALUE arguments as the values to send: an empty value of a key that may be none is None.
    Types are checked by the head (one place), which reads "8" as 8 for an int key. Raises ValueError."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"invalid setting {item!r}: use KEY=VALUE")
        known = SETTINGS.get(key)
        out[key] = None if value == "" and known is not None and known.nullable else value
    return out
