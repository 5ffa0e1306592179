"""gpufleet storage: the shared file systems as every node sees them."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from gpufleet.cli.output import Format, OutputOpt, print_json, table
from gpufleet.cli.state import state

app = typer.Typer(help="Shared file systems (NFS, Lustre, GPFS ...) as every node sees them.", no_args_is_help=True)

Status = Annotated[
    str | None, typer.Option("--status", help="only file systems that are ok, slow, degraded (some nodes) or down")
]
Nodes = Annotated[bool, typer.Option("--nodes", help="each node's view too: state, time per operation, fill")]


def _ms(value: Any) -> str:
    return "" if value is None else f"{value:.2f}"


def _pct(value: Any) -> str:
    return "" if value is None else f"{value:.0f} %"


@app.command("list")
def list_storage(ctx: typer.Context, status: Status = None, nodes: Nodes = False, output: Format = OutputOpt) -> None:
    """Each shared file system with its verdict: trouble on some nodes (look at them) or everywhere (look at
    the server). Exit code 1 when one is down or degraded, so scripts can test it."""
    systems = state(ctx).client().storage(status)
    if output is Format.json:
        print_json(systems)
    else:
        rows = [
            {
                "source": fs["source"],
                "type": fs["fstype"],
                "mounts": ", ".join(fs["mountpoints"]),
                "nodes": f"{fs['nodes_ok']}/{fs['nodes_total']}",
                "latency": _ms(fs["latency_ms_median"]),
                "used": _pct(fs["used_pct"]),
                "status": fs["status"],
                "verdict": fs["verdict"],
            }
            for fs in systems
        ]
        columns = [
            ("source", "FILE SYSTEM"),
            ("type", "TYPE"),
            ("mounts", "MOUNTED ON"),
            ("nodes", "NODES OK"),
            ("latency", "MS/OP (MEDIAN)"),
            ("used", "USED"),
            ("status", "STATUS"),
            ("verdict", "VERDICT"),
        ]
        table(rows, columns)
        if nodes:
            for fs in systems:
                node_rows = [
                    {
                        **n,
                        "latency_ms": _ms(n["latency_ms"]),
                        "baseline_ms": _ms(n["baseline_ms"]),
                        "probe_ms": _ms(n["probe_ms"]),
                        "used_pct": _pct(n["used_pct"]),
                        "slow": "slow" if n["slow"] else "",
                    }
                    for n in fs["nodes"]
                ]
                node_columns = [
                    ("node", "NODE"),
                    ("mountpoint", "MOUNT"),
                    ("state", "STATE"),
                    ("latency_ms", "MS/OP"),
                    ("baseline_ms", "USUAL"),
                    ("probe_ms", "PROBE MS"),
                    ("used_pct", "USED"),
                    ("slow", ""),
                ]
                table(node_rows, node_columns, title=f"{fs['source']} ({fs['fstype']})")
    if any(fs["status"] in ("down", "degraded") for fs in systems):
        raise typer.Exit(1)
