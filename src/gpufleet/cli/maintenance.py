"""gpufleet maintenance create|list|show|pause|resume|cancel: rolling maintenance campaigns over many nodes."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gpufleet.cli.output import Format, OutputOpt, fields, print_json, table
from gpufleet.cli.state import state
from gpufleet.client import HeadClient
from gpufleet.core.durations import parse_duration
from gpufleet.core.errors import InvalidInput

app = typer.Typer(
    help="Maintenance campaigns: a change rolled over many nodes, a few at a time, never breaking a running job.",
    no_args_is_help=True,
)
POLL_S = 1.0
PLAYBOOK_MAX_BYTES = 1024 * 1024  # the head refuses more (provisioning.ansible), and its request limit first
ENDED = frozenset({"completed", "cancelled", "stopped"})

ACTION_HELP = (
    "what to do on each node, in order (repeat --action): "
    "sync-image:IMAGE\\[@REVISION] (rsync the node's software_image; @REVISION: only if that is the current one), "
    "packages:install:PKG[,PKG...] and packages:upgrade:PKG[,PKG...] (through Ansible), "
    "ansible:PLAYBOOK (a playbook file here), reboot and power-cycle (through the BMC, then wait for the node), "
    "burn-in:PROFILE (the node must pass it)"
)

Name = Annotated[str, typer.Argument(help="the campaign's name")]


def _seconds(text: str, option: str) -> float:
    """A duration (90s, 10m, 2h, 1d), or 0."""
    if text.strip() == "0":
        return 0.0
    try:
        return float(parse_duration(text))
    except InvalidInput as exc:
        raise InvalidInput(f"{option}: {exc}") from None


def _read_playbook(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InvalidInput(f"cannot read the playbook {path}: {exc.strerror or exc}") from None
    if len(data) > PLAYBOOK_MAX_BYTES:
        raise InvalidInput(f"{path} is larger than {PLAYBOOK_MAX_BYTES // 1024} KiB")
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise InvalidInput(f"{path} is not UTF-8 text") from None


def _actions(given: list[str]) -> tuple[list[str], dict[str, str]]:
    """The actions as the head takes them: an ansible: action names its file here; the head gets the
    file's name and its text."""
    actions: list[str] = []
    playbooks: dict[str, str] = {}
    for text in given:
        kind, _, rest = text.partition(":")
        if kind != "ansible" or not rest:
            actions.append(text)
            continue
        path = Path(rest).expanduser()
        playbook = _read_playbook(path)
        if playbooks.get(path.name, playbook) != playbook:
            raise InvalidInput(f"two different playbooks are named {path.name}: rename one")
        playbooks[path.name] = playbook
        actions.append(f"ansible:{path.name}")
    return actions, playbooks


@app.command("create")
def create(
    ctx: typer.Context,
    name: Name,
    nodes: Annotated[str | None, typer.Option("--nodes", help="a hostlist, e.g. gpu[001-016]")] = None,
    category: Annotated[str | None, typer.Option("--category", help="every node of a category")] = None,
    action: Annotated[list[str] | None, typer.Option("--action", help=ACTION_HELP)] = None,
    max_unavailable: Annotated[
        str,
        typer.Option(
            "--max-unavailable",
            help="campaign nodes out of service at once, N or P% of them (at least 1); nodes already down or "
            "drained by others count too, as the GPU Operator counts them",
        ),
    ] = "1",
    wait_jobs: Annotated[
        str,
        typer.Option(
            "--wait-jobs",
            help="how long a drained node's running jobs may finish (e.g. 30m; 0: at once); then jobs that allow "
            "requeue are requeued, and no other job is ever stopped",
        ),
    ] = "1h",
    overdue: Annotated[
        str,
        typer.Option(
            "--overdue",
            help="a node whose non-requeueable jobs run past --wait-jobs: wait (on, saying so) or fail "
            "(give it back untouched, counted a failure)",
        ),
    ] = "wait",
    keep: Annotated[
        int, typer.Option("--keep", min=0, help="nodes of each category that stay in service at least")
    ] = 0,
    failure_budget: Annotated[
        int, typer.Option("--failure-budget", min=1, help="stop once this many nodes failed")
    ] = 1,
    no_canary: Annotated[
        bool, typer.Option("--no-canary", help="no canary: start on as many nodes as the policy allows")
    ] = False,
    boot_timeout: Annotated[
        str, typer.Option("--boot-timeout", help="how long a node may take to come back after reboot/power-cycle")
    ] = "30m",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="print the nodes in order, the canary and the limit; record nothing")
    ] = False,
    output: Format = OutputOpt,
) -> None:
    """Create a campaign; the head carries it out node by node, even across restarts.

    Each node is taken out (held and drained, under Slurm in Slurm), its jobs may finish, the actions run
    in order (each a task: gpufleet task list), and it is resumed. The canary (the first idle node, unless
    --no-canary) goes alone first; a failed canary, or --failure-budget failed nodes, stops the campaign:
    fix the cause, then `gpufleet maintenance resume NAME` (failed nodes are tried again)."""
    if overdue not in ("wait", "fail"):
        raise InvalidInput("--overdue is wait or fail")
    actions, playbooks = _actions(action or [])
    spec: dict[str, Any] = {
        "name": name,
        "nodes": nodes,
        "category": category,
        "actions": actions,
        "playbooks": playbooks,
        "max_unavailable": max_unavailable,
        "wait_jobs_s": _seconds(wait_jobs, "--wait-jobs"),
        "overdue": overdue,
        "keep": keep,
        "failure_budget": failure_budget,
        "canary": not no_canary,
        "boot_timeout_s": _seconds(boot_timeout, "--boot-timeout"),
    }
    client = state(ctx).client()
    if dry_run:
        plan = client.plan_campaign(spec)
        if output is Format.json:
            print_json(plan)
            return
        typer.echo(f"campaign {plan['name']} would take {plan['hostlist']} ({len(plan['nodes'])} nodes):")
        typer.echo(f"  canary: {plan['canary'] or 'none'}; at most {plan['max_unavailable']} out of service at once")
        for i, text in enumerate(plan["actions"], start=1):
            typer.echo(f"  {i}. {text}")
        return
    _print(client.create_campaign(spec), output)


@app.command("list")
def list_(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 100,
    output: Format = OutputOpt,
) -> None:
    """Campaigns, newest first."""
    rows = state(ctx).client().list_campaigns(limit)
    if output is Format.json:
        print_json(rows)
        return
    for row in rows:
        row["progress"] = _progress(row)
        row["out"] = f"{row['unavailable']}/{row['max_unavailable']}"
    table(
        rows,
        [
            ("name", "Campaign"),
            ("state", "State"),
            ("progress", "Done"),
            ("out", "Out/max"),
            ("failures", "Failed"),
            ("created_by", "By"),
            ("created_at", "Created"),
            ("reason", "Reason"),
        ],
    )


@app.command("show")
def show(
    ctx: typer.Context,
    name: Name,
    follow: Annotated[
        bool, typer.Option("--follow", help="follow it until it ends or stops; exit 1 unless it completed")
    ] = False,
    output: Format = OutputOpt,
) -> None:
    """A campaign and each node's progress, in the order the campaign takes them."""
    client = state(ctx).client()
    campaign = client.show_campaign(name)
    if follow:
        campaign = _follow(client, campaign, output)
    _print(campaign, output)
    if follow and campaign["state"] != "completed":
        raise typer.Exit(1)


@app.command("pause")
def pause(ctx: typer.Context, name: Name, output: Format = OutputOpt) -> None:
    """Take no new node; nodes waiting for their jobs are given back, nodes being acted on finish."""
    _print(state(ctx).client().campaign_action(name, "pause"), output)


@app.command("resume")
def resume(ctx: typer.Context, name: Name, output: Format = OutputOpt) -> None:
    """Go on after a pause or a stop; failed nodes are tried again (from the action that failed)."""
    _print(state(ctx).client().campaign_action(name, "resume"), output)


@app.command("cancel")
def cancel(ctx: typer.Context, name: Name, output: Format = OutputOpt) -> None:
    """End the campaign: nodes not started are skipped; failed ones stay drained with why, for a person
    to resume (gpufleet node resume); nodes being acted on finish first."""
    _print(state(ctx).client().campaign_action(name, "cancel"), output)


def _progress(campaign: dict[str, Any]) -> str:
    phases: dict[str, int] = campaign.get("phases") or {}
    finished = sum(phases.get(p, 0) for p in ("done", "failed", "skipped"))
    return f"{finished}/{campaign['total']}"


def _follow(client: HeadClient, campaign: dict[str, Any], output: Format) -> dict[str, Any]:
    console = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[out]} out, {task.fields[failed]} failed"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=output is Format.json or not console.is_terminal,
    ) as progress:
        bar = progress.add_task(f"campaign {campaign['name']}", total=campaign["total"], out=0, failed=0)
        while True:
            phases = campaign.get("phases") or {}
            busy = any(phases.get(p, 0) for p in ("waiting", "acting"))
            finished = sum(phases.get(p, 0) for p in ("done", "failed", "skipped"))
            progress.update(bar, completed=finished, out=campaign["unavailable"], failed=phases.get("failed", 0))
            if campaign["state"] in ENDED and not busy:
                return campaign
            time.sleep(POLL_S)
            campaign = client.show_campaign(campaign["name"])


def _print(campaign: dict[str, Any], output: Format) -> None:
    if output is Format.json:
        print_json(campaign)
        return
    summary = dict(campaign)
    summary["progress"] = _progress(campaign)
    summary["out"] = f"{campaign['unavailable']} of at most {campaign['max_unavailable']}"
    summary["actions"] = ", ".join(campaign["actions"])
    fields(
        summary,
        [
            ("name", "Campaign"),
            ("state", "State"),
            ("reason", "Reason"),
            ("actions", "Actions"),
            ("progress", "Done"),
            ("out", "Out of service"),
            ("failures", "Failed"),
            ("created_by", "By"),
            ("created_at", "Created"),
        ],
    )
    total = len(campaign["actions"])
    rows = []
    for node in campaign.get("nodes", []):
        step = f"{min(node['action'] + 1, total)}/{total} {node['action_text']}" if node["action_text"] else ""
        rows.append(node | {"canary": "canary" if node["canary"] else "", "step": step})
    table(
        rows,
        [
            ("node", "Node"),
            ("phase", "Phase"),
            ("canary", ""),
            ("step", "Action"),
            ("task_id", "Task"),
            ("detail", "Detail"),
        ],
    )
