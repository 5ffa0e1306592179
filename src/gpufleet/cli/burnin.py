"""gpufleet burn-in list|show|cancel|fleet|held|profiles, and `gpufleet node burn-in NAMES --profile P`."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from gpufleet.cli.output import Format, OutputOpt, fields, print_json, table
from gpufleet.cli.state import state

app = typer.Typer(help="Burn-in: acceptance runs on nodes, their results, the fleet's figures.", no_args_is_help=True)

RUN_COLUMNS = [
    ("id", "Run"),
    ("node", "Node"),
    ("profile", "Profile"),
    ("state", "State"),
    ("reason", "Reason"),
    ("created_at", "Started"),
]
STEP_COLUMNS = [
    ("name", "Step"),
    ("state", "State"),
    ("measured", "Value"),
    ("limit", "Threshold"),
    ("partner", "Partner"),
    ("job_id", "Job"),
    ("detail", "Detail"),
]
POLL_S = 2.0


def start(
    ctx: typer.Context,
    names: list[str],
    profile: str,
    resume: bool,
    wait: bool,
    output: Format,
) -> None:
    client = state(ctx).client()
    runs = client.start_burnin(names, profile, resume)
    if wait:
        runs = _wait(ctx, [r["id"] for r in runs])
    if output is Format.json:
        print_json(runs)
        return
    table(runs, RUN_COLUMNS, title=f"Burn-in ({profile})")
    if wait and any(r["state"] != "passed" for r in runs):
        raise typer.Exit(1)


def _wait(ctx: typer.Context, ids: list[int]) -> list[dict[str, Any]]:
    client = state(ctx).client()
    while True:
        runs = [client.get_burnin(i) for i in ids]
        if all(r["state"] not in ("queued", "running") for r in runs):
            return runs
        time.sleep(POLL_S)


def step_rows(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Steps with their value and threshold as people read them: "412 TFLOPS", "≥ 600"."""
    rows = []
    for s in steps:
        measured = "" if s["value"] is None else f"{s['value']:.4g} {s['unit']}".strip()
        limit = "" if s["threshold"] is None else f"{'≥' if s['better'] == 'higher' else '≤'} {s['threshold']:g}"
        rows.append(s | {"measured": measured, "limit": limit})
    return rows


@app.command("list")
def list_runs(
    ctx: typer.Context,
    node: Annotated[str | None, typer.Option(help="only this node's runs")] = None,
    run_state: Annotated[
        str | None, typer.Option("--state", help="queued, running, passed, failed or cancelled")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=500)] = 100,
    output: Format = OutputOpt,
) -> None:
    """Burn-in runs, newest first."""
    runs = state(ctx).client().list_burnins(node, run_state, limit)
    if output is Format.json:
        print_json(runs)
    else:
        table(runs, RUN_COLUMNS, title="Burn-in runs")


@app.command("show")
def show(ctx: typer.Context, run_id: int, output: Format = OutputOpt) -> None:
    """One run with each step's value, threshold and verdict."""
    run = state(ctx).client().get_burnin(run_id)
    if output is Format.json:
        print_json(run)
        return
    show_run(run)


def show_run(run: dict[str, Any], title: str = "Steps") -> None:
    fields(
        run,
        [
            ("id", "Run"),
            ("node", "Node"),
            ("profile", "Profile"),
            ("state", "State"),
            ("reason", "Reason"),
            ("gpu_model", "GPU model"),
            ("batch", "Batch"),
            ("requested_by", "Requested by"),
            ("started_at", "Started"),
            ("ended_at", "Ended"),
        ],
    )
    table(step_rows(run["steps"]), STEP_COLUMNS, title=title)


@app.command("cancel")
def cancel(ctx: typer.Context, run_id: int, output: Format = OutputOpt) -> None:
    """Stop a run. Its node stays drained until someone resumes it (`gpufleet node resume`)."""
    run = state(ctx).client().cancel_burnin(run_id)
    if output is Format.json:
        print_json(run)
    else:
        typer.echo(f"burn-in {run_id} of {run['node']} cancelled; the node stays drained")


@app.command("fleet")
def fleet(
    ctx: typer.Context,
    step: Annotated[str | None, typer.Option(help="only this step")] = None,
    output: Format = OutputOpt,
) -> None:
    """Each step's figures across the fleet per GPU model: slowest, median, fastest, and the outliers."""
    metrics = state(ctx).client().burnin_fleet(step)
    if output is Format.json:
        print_json(metrics)
        return
    rows = []
    for m in metrics:
        values = m["values"]
        outliers = [f"{v['node']} ({v['value']:.4g}, {v['outlier']})" for v in values if v["outlier"]]
        worst, best = (values[0], values[-1]) if values else (None, None)
        rows.append(
            {
                "step": m["step"],
                "gpu_model": m["gpu_model"] or "-",
                "nodes": len(values),
                "worst": f"{worst['node']} {worst['value']:.4g}" if worst else "",
                "median": f"{m['median']:.4g} {m['unit']}",
                "best": f"{best['node']} {best['value']:.4g}" if best else "",
                "outliers": ", ".join(outliers) or ("-" if m["judged"] else "too few nodes to judge"),
            }
        )
    table(
        rows,
        [
            ("step", "Step"),
            ("gpu_model", "GPU model"),
            ("nodes", "Nodes"),
            ("worst", "Worst"),
            ("median", "Median"),
            ("best", "Best"),
            ("outliers", "Outliers"),
        ],
        title="Burn-in figures across the fleet",
    )


@app.command("held")
def held(ctx: typer.Context, output: Format = OutputOpt) -> None:
    """Nodes held out of service by burn-in or maintenance, with why."""
    nodes = state(ctx).client().burnin_held()
    if output is Format.json:
        print_json(nodes)
    else:
        table(nodes, [("node", "Node"), ("hold", "Hold"), ("state", "State"), ("drain_reason", "Why")])


@app.command("profiles")
def profiles(ctx: typer.Context, output: Format = OutputOpt) -> None:
    """The burn-in profiles (built-in and the admins'), their steps and thresholds per GPU model."""
    found = state(ctx).client().burnin_profiles()
    if output is Format.json:
        print_json(found)
        return
    for p in found["profiles"]:
        rows = [
            s
            | {
                "threshold": ", ".join(f"{k}: {v:g}" for k, v in s["threshold"].items()) or "-",
                "better": "at least" if s["better"] == "higher" else "at most",
                "pairs": _together(s),
            }
            for s in p["steps"]
        ]
        columns = [
            ("name", "Step"),
            ("kind", "Kind"),
            ("seconds", "Seconds"),
            ("pairs", "Nodes"),
            ("better", "Value"),
            ("threshold", "Threshold by GPU model"),
        ]
        table(rows, columns, title=f"{p['name']} ({p['origin']}): {p['description']}")
    for problem in found["problems"]:
        typer.echo(f"warning: {problem}", err=True)


def _together(step: dict[str, Any]) -> str:
    """How many nodes a step measures together: pairs, a group of N, or blank for one node."""
    if not step["pairs"]:
        return ""
    group = step.get("group") or 2  # a head from before groups says only `pairs`
    return "pairs" if group == 2 else f"groups of {group}"
