"""gpufleet slurm config: slurm.conf's node and partition lines and gres.conf, from gpufleet's inventory.

The head renders the text (`GET /api/v1/slurm/config`); this command runs where the files are, on the Slurm
controller, and by default only prints it. `--dry-run` shows the diff against the files in place and changes
nothing; `--write` replaces the lines between slurm.conf's markers (`core.managed_block`: every other byte
stays) and rewrites gres.conf, each atomically with a `.bak` of the previous version.

Before anything is written both files are read and the result checked, so a bad path or a slurm.conf that
already defines one of the rendered nodes or partitions outside the markers (Slurm would see it twice)
fails with one line and leaves both files as they were.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from gpufleet.cli.output import Format, OutputOpt, print_json
from gpufleet.cli.state import state
from gpufleet.client import HeadClient
from gpufleet.core import hostlist, managed_block
from gpufleet.core.errors import InvalidInput

app = typer.Typer(
    help="Slurm: its node, partition and GPU configuration from gpufleet's inventory.", no_args_is_help=True
)

BLOCK = "nodes"  # slurm.conf's markers: "# BEGIN gpufleet managed nodes" ... "# END gpufleet managed nodes"
_COMMENT = re.compile(r"(?<!\\)#.*")


@dataclass(frozen=True)
class Change:
    """One file: what it holds now and what it would hold."""

    path: Path
    old: str
    new: str

    @property
    def changed(self) -> bool:
        return self.old != self.new

    def diff(self) -> str:
        return managed_block.unified_diff(self.old, self.new, str(self.path))


@dataclass(frozen=True)
class Definition:
    """A NodeName or PartitionName line of slurm.conf (1-based `line`)."""

    key: str  # "nodename" or "partitionname"
    names: tuple[str, ...]
    line: int
    default: bool = False  # a partition with Default=YES


def definitions(text: str, skip: tuple[int, int] | None = None) -> list[Definition]:
    """The nodes and partitions `text` defines, outside the lines `skip` (0-based, inclusive: the managed
    block). Slurm's keys are case-insensitive; NodeName=DEFAULT and PartitionName=DEFAULT lines set defaults
    and define nothing; a hostlist this parser cannot expand is left out (Slurm has the last word on it)."""
    found = []
    for number, raw in enumerate(text.splitlines()):
        if skip is not None and skip[0] <= number <= skip[1]:
            continue
        words = _COMMENT.sub("", raw).split()
        if not words or "=" not in words[0]:
            continue
        key, value = words[0].split("=", 1)
        key = key.casefold()
        if key not in ("nodename", "partitionname") or value.casefold() == "default":
            continue
        try:
            names = tuple(hostlist.expand(value)) if key == "nodename" else (value,)
        except InvalidInput:
            continue
        default = any(w.casefold() == "default=yes" for w in words[1:])
        found.append(Definition(key, names, number + 1, default))
    return found


def check_slurm_conf(old: str, rendered: dict[str, Any]) -> list[str]:
    """Refuse a slurm.conf that defines a rendered node or partition outside the managed block (Slurm would
    read it twice); warn about what Slurm would take differently than meant. Raises InvalidInput."""
    block = managed_block.find(old, BLOCK)
    outside = definitions(old, block)
    nodes, partitions = set(rendered["nodes"]), set(rendered["partitions"])
    problems = []
    for d in outside:
        if d.key == "nodename" and nodes.intersection(d.names):
            twice = hostlist.collect(sorted(nodes.intersection(d.names)))
            problems.append(f"node(s) {twice} (line {d.line})")
        elif d.key == "partitionname" and d.names[0] in partitions:
            problems.append(f"partition {d.names[0]} (line {d.line})")
    if problems:
        raise InvalidInput(
            f"slurm.conf already defines {', '.join(problems)} outside the gpufleet block: Slurm would read them "
            f"twice; delete those lines, or put the '{managed_block.markers(BLOCK)[0]}' and "
            f"'{managed_block.markers(BLOCK)[1]}' lines around them"
        )
    warnings = []
    for d in outside:
        if d.key == "partitionname" and d.default and rendered["partitions"]:
            warnings.append(
                f"slurm.conf also makes partition {d.names[0]} the default (line {d.line}): Slurm takes the last "
                "Default=YES it reads"
            )
    if "Gres=" in rendered["slurm_conf"] and not _has_gpu_gres_type(old, block):
        warnings.append("slurm.conf has no GresTypes=gpu line: Slurm refuses Gres=gpu:... without it")
    return warnings


def _has_gpu_gres_type(text: str, block: tuple[int, int] | None) -> bool:
    for number, raw in enumerate(text.splitlines()):
        if block is not None and block[0] <= number <= block[1]:
            continue
        key, _, value = _COMMENT.sub("", raw).strip().partition("=")
        if key.strip().casefold() == "grestypes" and "gpu" in {v.strip() for v in value.split(",")}:
            return True
    return False


def read_current(slurm_conf: Path | None, gres_conf: Path | None) -> dict[Path, str]:
    """The files as they are now. A missing gres.conf reads as empty (a new one; its directory must exist); a
    missing slurm.conf is an error, since only its managed block is ours. Raises InvalidInput."""
    current = {}
    if slurm_conf is not None:
        current[slurm_conf] = managed_block.read_text(slurm_conf)
    if gres_conf is not None:
        current[gres_conf] = managed_block.read_text(gres_conf, missing_ok=True)
    return current


def plan(
    rendered: dict[str, Any], current: dict[Path, str], slurm_conf: Path | None, gres_conf: Path | None
) -> tuple[list[Change], list[str]]:
    """What each given file would become (slurm.conf first), and warnings. Raises InvalidInput."""
    changes, warnings = [], []
    if slurm_conf is not None:
        old = current[slurm_conf]
        warnings += check_slurm_conf(old, rendered)
        changes.append(Change(slurm_conf, old, managed_block.place(old, rendered["slurm_conf"], BLOCK)))
    if gres_conf is not None:
        changes.append(Change(gres_conf, current[gres_conf], rendered["gres_conf"]))
    return changes, warnings


def fetch(client: HeadClient, default_partition: str) -> dict[str, Any]:
    """The rendered configuration from the head."""
    return client.slurm_config(default_partition)


def _notes(rendered: dict[str, Any], warnings: list[str]) -> None:
    for skipped in rendered["skipped"]:
        typer.echo(f"skipped {skipped['name']}: {skipped['reason']}", err=True)
    for warning in [*rendered["warnings"], *warnings]:
        typer.echo(f"warning: {warning}", err=True)


@app.command("config")
def config(
    ctx: typer.Context,
    slurm_conf: Annotated[
        Path | None, typer.Option("--slurm-conf", help="the slurm.conf to compare (--dry-run) or update (--write)")
    ] = None,
    gres_conf: Annotated[
        Path | None,
        typer.Option("--gres-conf", help="the gres.conf to compare or rewrite (default: beside --slurm-conf)"),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="print the diff against the files; change nothing")
    ] = False,
    write: Annotated[
        bool, typer.Option("--write", help="update slurm.conf's managed block and rewrite gres.conf (keeps .bak)")
    ] = False,
    default_partition: Annotated[
        str, typer.Option(help="the partition holding every node; each category gets its own too")
    ] = "all",
    output: Format = OutputOpt,
) -> None:
    """Render slurm.conf's node and partition lines and gres.conf from the inventory.

    Prints them by default. slurm.conf keeps everything outside the lines
    '# BEGIN gpufleet managed nodes' and '# END gpufleet managed nodes' (added at its end if missing).
    """
    if dry_run and write:
        raise InvalidInput("--dry-run and --write exclude each other")
    if (dry_run or write) and slurm_conf is None and gres_conf is None:
        raise InvalidInput("--dry-run and --write need --slurm-conf (and gres.conf beside it) or --gres-conf")
    if not (dry_run or write) and (slurm_conf is not None or gres_conf is not None):
        raise InvalidInput("--slurm-conf and --gres-conf name the files for --dry-run or --write: add one of them")
    if gres_conf is None and slurm_conf is not None:
        gres_conf = slurm_conf.parent / "gres.conf"  # Slurm reads gres.conf from slurm.conf's directory
    if slurm_conf is not None and gres_conf is not None and slurm_conf.resolve() == gres_conf.resolve():
        raise InvalidInput(f"--slurm-conf and --gres-conf name the same file: {slurm_conf}")
    current = read_current(slurm_conf, gres_conf)  # a bad path is said before the head is asked
    client = state(ctx).client()
    try:
        rendered = fetch(client, default_partition)
    finally:
        client.close()
    if not (dry_run or write):
        _show(rendered, output)
        return
    changes, warnings = plan(rendered, current, slurm_conf, gres_conf)
    if dry_run:
        _dry_run(rendered, changes, warnings, output)
    else:
        _write(rendered, changes, warnings, output)


def _show(rendered: dict[str, Any], output: Format) -> None:
    if output is Format.json:
        print_json(rendered)
        return
    typer.echo("# slurm.conf: the node and partition lines, between these markers")
    typer.echo(managed_block.wrap(rendered["slurm_conf"], BLOCK))
    typer.echo("# gres.conf")
    typer.echo(rendered["gres_conf"], nl=False)
    _notes(rendered, [])


def _dry_run(rendered: dict[str, Any], changes: list[Change], warnings: list[str], output: Format) -> None:
    if output is Format.json:
        files = [{"path": str(c.path), "changed": c.changed, "diff": c.diff()} for c in changes]
        print_json({"files": files, "warnings": [*rendered["warnings"], *warnings], "skipped": rendered["skipped"]})
        return
    for change in changes:
        typer.echo(change.diff() if change.changed else f"{change.path}: no change", nl=not change.changed)
    _notes(rendered, warnings)


def _write(rendered: dict[str, Any], changes: list[Change], warnings: list[str], output: Format) -> None:
    done: list[dict[str, Any]] = []
    # gres.conf first: a slurm.conf naming GPUs that gres.conf lacks is the worse half-state.
    for change in reversed(changes):
        backup = None
        if change.changed:
            try:
                backup = managed_block.write_atomic(change.path, change.new)
            except InvalidInput as exc:
                written = [d["path"] for d in done if d["changed"]]
                raise InvalidInput(
                    f"{exc}" + (f" (already written: {', '.join(written)})" if written else "")
                ) from None
        done.append({"path": str(change.path), "changed": change.changed, "backup": str(backup) if backup else None})
    done.reverse()
    if output is Format.json:
        print_json({"files": done, "warnings": [*rendered["warnings"], *warnings], "skipped": rendered["skipped"]})
        return
    for item in done:
        if not item["changed"]:
            typer.echo(f"{item['path']}: no change")
        else:
            kept = f" (previous version in {item['backup']})" if item["backup"] else " (new file)"
            typer.echo(f"{item['path']}: updated{kept}")
    if any(item["changed"] for item in done):
        typer.echo(
            "Slurm reads these files when its daemons start: copy them to the nodes (unless they run configless), "
            "then restart slurmctld and the slurmd of the changed nodes (Slurm 22.05's `scontrol reconfigure` "
            "cannot add or remove nodes)"
        )
    _notes(rendered, warnings)
