"""gpufleet mig: MIG layouts declared per node or category, and each GPU's actual layout."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from gpufleet.cli.output import Format, OutputOpt, print_json, table
from gpufleet.cli.state import state
from gpufleet.core.errors import InvalidInput

app = typer.Typer(
    help="MIG (Multi-Instance GPU): declare layouts per node or category; each GPU gets its layout once idle.",
    no_args_is_help=True,
)
NodeOpt = Annotated[str | None, typer.Option("--node", help="one node")]
CategoryOpt = Annotated[str | None, typer.Option("--category", help="every node of a category")]


def _show(found: list[dict[str, Any]], output: Format) -> None:
    if output is Format.json:
        print_json(found)
        return
    rows = [
        {
            "node": n["node"],
            "gpu": str(g["index"]),
            "declared": g["declared"] or "(unset)",
            "actual": g["actual"],
            "state": "in sync"
            if g["in_sync"]
            else ("waiting: GPU busy or being changed" if not g["error"] else "refused"),
            "note": g["problem"] or g["error"] or "",
        }
        for n in found
        for g in n["gpus"]
    ]
    columns = [("node", "NODE"), ("gpu", "GPU"), ("declared", "DECLARED"), ("actual", "ACTUAL"), ("state", "STATE")]
    table(rows, [*columns, ("note", "NOTE")])


@app.command("status")
def status(ctx: typer.Context, node: NodeOpt = None, category: CategoryOpt = None, output: Format = OutputOpt) -> None:
    """Each GPU's declared and actual layout. Exit code 1 while some GPU is not yet in its layout."""
    found = state(ctx).client().mig(node, category)
    _show(found, output)
    if not all(n["in_sync"] for n in found):
        raise typer.Exit(1)


@app.command("set")
def set_layout(
    ctx: typer.Context,
    layout: Annotated[str, typer.Argument(help="none, all-1g.18gb, 3g.71gb+4g.71gb, 2x1g.18gb+2g.35gb+3g.71gb")],
    node: NodeOpt = None,
    category: CategoryOpt = None,
    now: Annotated[
        bool, typer.Option("--now", help="refuse rather than wait when running jobs hold GPUs it would change")
    ] = False,
    output: Format = OutputOpt,
) -> None:
    """Declare a layout; each GPU gets it once its jobs end (no new job lands on it meanwhile)."""
    if (node is None) == (category is None):
        raise InvalidInput("name one --node or one --category")
    _show(state(ctx).client().declare_mig(layout, node=node, category=category, now=now), output)


@app.command("unset")
def unset_layout(
    ctx: typer.Context, node: NodeOpt = None, category: CategoryOpt = None, output: Format = OutputOpt
) -> None:
    """Forget the declared layout: the GPUs stay as they are (a node unset inherits its category's)."""
    if (node is None) == (category is None):
        raise InvalidInput("name one --node or one --category")
    _show(state(ctx).client().declare_mig(None, node=node, category=category), output)
