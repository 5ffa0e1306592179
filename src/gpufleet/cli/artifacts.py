"""gpufleet model|dataset list|show|register|remove: the registries of checkpoints and datasets that jobs
name (`job submit --model NAME --dataset NAME`) and the agents stage into their node cache.

`register` computes the checksum here, from the location as this machine sees it (a shared filesystem
mounted on the login node and the compute nodes alike), so the head never reads the data; an http(s)
location needs `--sha256` and `--size`, as the CLI does not download it.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from gpufleet.cli.output import Format, OutputOpt, fields, print_json, size_mb, table
from gpufleet.cli.state import state
from gpufleet.core.errors import InvalidInput
from gpufleet.protocol.artifacts import ArtifactError, check_source, digest, local_path

Ref = Annotated[
    str, typer.Argument(help="NAME[:VERSION] (no version: the one registered last)", metavar="NAME[:VERSION]")
]


def _access(row: dict[str, Any]) -> str:
    if row["project"] is None:
        return "every project"
    return ", ".join([row["project"], *row["shared_with"]])


def _checksum(location: str, sha256: str | None, size: int | None) -> tuple[str, int]:
    """The location's checksum and size, computed here when this machine can read it."""
    try:
        check_source(location)
        path = local_path(location)
        if path is not None and not path.exists() and sha256 is not None and size is not None:
            return sha256, size  # a path only the nodes mount: the checksum given is what they check
        if path is not None:
            computed, computed_size = digest(path)
            if sha256 is not None and sha256 != computed:
                raise InvalidInput(f"{location} hashes to {computed}, not the --sha256 given")
            return computed, computed_size
    except ArtifactError as exc:
        raise InvalidInput(str(exc)) from None
    if sha256 is None or size is None:
        raise InvalidInput("an http(s) location needs --sha256 and --size: the CLI does not download it")
    return sha256, size


def registry(kind: str, help_text: str) -> typer.Typer:
    """The commands of one registry, `kind` being "model" or "dataset"."""
    app = typer.Typer(help=help_text, no_args_is_help=True)
    kinds = f"{kind}s"

    @app.command("list")
    def list_(ctx: typer.Context, output: Format = OutputOpt) -> None:
        """Every version: size, licence, who may use it and how many nodes cache it."""
        rows = state(ctx).client().list_artifacts(kinds)
        if output is Format.json:
            print_json(rows)
            return
        shown = [r | {"size": size_mb(r["size_bytes"]), "access": _access(r), "cached": len(r["nodes"])} for r in rows]
        columns = [("ref", kind.capitalize()), ("size", "Size"), ("format", "Format"), ("licence", "Licence")]
        columns += [("access", "Used by"), ("cached", "Cached on")]
        table(shown, columns, title=f"{len(rows)} {kind}(s)")

    @app.command("show")
    def show(ctx: typer.Context, ref: Ref, output: Format = OutputOpt) -> None:
        """One version, and the nodes whose cache holds it."""
        row = state(ctx).client().show_artifact(kinds, ref)
        if output is Format.json:
            print_json(row)
            return
        shown = row | {"size": size_mb(row["size_bytes"]), "access": _access(row), "cached": ", ".join(row["nodes"])}
        if row.get("location_hidden"):
            shown["location"] = "(not shown: your projects may not use it)"
        keys = [("ref", kind), ("location", "location"), ("sha256", "sha256"), ("size", "size")]
        keys += [("framework", "framework"), ("format", "format"), ("licence", "licence"), ("source", "source")]
        keys += [("access", "used by"), ("cached", "cached on"), ("description", "description")]
        fields(shown, keys)

    @app.command("register")
    def register(
        ctx: typer.Context,
        ref: Annotated[str, typer.Argument(help="NAME:VERSION", metavar="NAME:VERSION")],
        location: Annotated[
            str, typer.Argument(help="a file or directory on a shared filesystem (path or file://), or an http(s) URL")
        ],
        project: Annotated[
            str | None, typer.Option(help="the project that owns it (none: every project may use it)")
        ] = None,
        share: Annotated[list[str] | None, typer.Option(help="another project that may use it (repeatable)")] = None,
        framework: Annotated[str | None, typer.Option(help="pytorch, jax, ...")] = None,
        format_: Annotated[str | None, typer.Option("--format", help="safetensors, gguf, parquet, ...")] = None,
        licence: Annotated[str, typer.Option(help="its licence, e.g. apache-2.0")] = "",
        source: Annotated[str, typer.Option(help="where it came from, e.g. a Hugging Face id")] = "",
        description: Annotated[str, typer.Option(help="what it is")] = "",
        sha256: Annotated[str | None, typer.Option(help="its checksum (needed for an http(s) location)")] = None,
        size: Annotated[
            int | None, typer.Option(min=0, help="its size in bytes (needed for an http(s) location)")
        ] = None,
        output: Format = OutputOpt,
    ) -> None:
        """Register a version. The checksum is computed here from the location; every node checks its copy."""
        name, _, version = ref.partition(":")
        if not version:
            raise InvalidInput(f"give the version too, NAME:VERSION, e.g. {name or kind}:1")
        sha256, size = _checksum(location, sha256, size)
        body = {
            "kind": kind,
            "name": name,
            "version": version,
            "location": location,
            "sha256": sha256,
            "size_bytes": size,
            "framework": framework,
            "format": format_,
            "licence": licence,
            "source": source,
            "project": project,
            "shared_with": share or [],
            "description": description,
        }
        row = state(ctx).client().register_artifact(kinds, body)
        if output is Format.json:
            print_json(row)
        else:
            typer.echo(f"registered {kind} {row['ref']}: {size_mb(row['size_bytes'])}, sha256 {row['sha256']}")

    @app.command("remove")
    def remove(ctx: typer.Context, ref: Annotated[str, typer.Argument(metavar="NAME:VERSION")]) -> None:
        """Remove one version. Queued jobs keep what they were given; node caches keep copies until evicted."""
        name, _, version = ref.partition(":")
        if not version:
            raise InvalidInput(f"name the version to remove: {name}:VERSION")
        state(ctx).client().remove_artifact(kinds, ref)
        typer.echo(f"removed {kind} {ref}")

    return app


models = registry("model", "Models: pretrained checkpoints and fine-tuned results that jobs and services load.")
datasets = registry("dataset", "Datasets: what jobs read, with who may use them; staged once per node and reused.")
