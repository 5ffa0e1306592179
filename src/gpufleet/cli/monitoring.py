"""gpufleet metrics show, gpufleet health, gpufleet alert ..."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from gpufleet.cli.logs import parse_overrides
from gpufleet.cli.output import Format, OutputOpt, print_json, table
from gpufleet.cli.state import state
from gpufleet.core.durations import parse_duration
from gpufleet.core.errors import InvalidInput

metrics_app = typer.Typer(help="Metrics the agents sampled.", no_args_is_help=True)
alert_app = typer.Typer(help="Alerts: list, acknowledge, silence; where they are sent.", no_args_is_help=True)
receiver_app = typer.Typer(help="Where alert notifications go: webhook, slack, email.", no_args_is_help=True)
rule_app = typer.Typer(help="Threshold alert rules: built-in and your own.", no_args_is_help=True)
policy_app = typer.Typer(help="Health thresholds and disabled checks per node category.", no_args_is_help=True)
alert_app.add_typer(receiver_app, name="receiver")
alert_app.add_typer(rule_app, name="rule")


@metrics_app.command("show")
def show_metrics(
    ctx: typer.Context,
    node: str,
    metric: Annotated[str, typer.Option(help="metric name, e.g. gpu_util, power_w, cpu_util")],
    gpu: Annotated[int | None, typer.Option(help="GPU index (else --entity, else the host)")] = None,
    entity: Annotated[str | None, typer.Option(help="host, gpu:N, disk:/MOUNT, nic:IF, ib:DEV/PORT")] = None,
    since: Annotated[str, typer.Option(help="how far back, e.g. 15m, 1h, 7d")] = "1h",
    step: Annotated[str | None, typer.Option(help="bucket width, e.g. 1m (default: about 120 points)")] = None,
    output: Format = OutputOpt,
) -> None:
    """One metric of one node over time, averaged per step."""
    if gpu is not None and entity is not None:
        raise InvalidInput("give --gpu or --entity, not both")
    parse_duration(since)  # a bad duration is the user's error, said before any request
    target = f"gpu:{gpu}" if gpu is not None else entity or "host"
    series = state(ctx).client().metrics(node, target, metric, since, step)
    if output is Format.json:
        print_json(series)
        return
    rows = [{"ts": _time(p["ts"]), "value": f"{p['value']:.6g}"} for p in series["points"]]
    table(
        rows, [("ts", "Time (UTC)"), ("value", metric)], title=f"{node} {target} {metric}, step {series['step_s']:g} s"
    )
    if not rows:
        typer.echo("no samples in that range")


def _time(ts: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def health(
    ctx: typer.Context,
    names: Annotated[str | None, typer.Argument(help="a node, or a hostlist expression")] = None,
    output: Format = OutputOpt,
) -> None:
    """Each node's health verdict and why; exit code 1 if any shown node is failed."""
    rows = state(ctx).client().fleet_health(names)
    if output is Format.json:
        print_json(rows)
    else:
        shown = [r | {"reasons": "; ".join(r["reasons"]), "drain_reason": r["drain_reason"] or ""} for r in rows]
        table(
            shown,
            [
                ("node", "Node"),
                ("state", "State"),
                ("health", "Health"),
                ("reasons", "Why"),
                ("drain_reason", "Drained"),
            ],
        )
    if any(r["health"] == "failed" for r in rows):
        raise typer.Exit(1)


@alert_app.command("list")
def list_alerts(
    ctx: typer.Context,
    status: Annotated[str | None, typer.Option(help="firing or resolved")] = None,
    node: Annotated[str | None, typer.Option(help="only this node's")] = None,
    output: Format = OutputOpt,
) -> None:
    """Alerts, newest first."""
    rows = state(ctx).client().list_alerts(status, node)
    if output is Format.json:
        print_json(rows)
        return
    table(
        rows,
        [
            ("id", "ID"),
            ("status", "Status"),
            ("severity", "Severity"),
            ("rule", "Rule"),
            ("node_name", "Node"),
            ("summary", "Summary"),
            ("starts_at", "Since"),
            ("acked_by", "Acked by"),
        ],
    )


@alert_app.command("ack")
def ack(ctx: typer.Context, alert_id: int, output: Format = OutputOpt) -> None:
    """Acknowledge a firing alert: someone is on it."""
    alert = state(ctx).client().ack_alert(alert_id)
    if output is Format.json:
        print_json(alert)
    else:
        typer.echo(f"alert {alert_id} acknowledged by {alert['acked_by']}")


@alert_app.command("silence")
def silence(
    ctx: typer.Context,
    comment: Annotated[str, typer.Option(help="why (shown with the silence)")],
    rule: Annotated[str | None, typer.Option(help="NodeFailed, NodeDegraded or NodeDown")] = None,
    node: Annotated[str | None, typer.Option(help="only this node's alerts")] = None,
    duration: Annotated[str, typer.Option("--for", help="how long, e.g. 2h")] = "2h",
    output: Format = OutputOpt,
) -> None:
    """Mute notifications of matching alerts for a while (alerts still fire and are listed)."""
    spec = {"rule": rule, "node": node, "duration_s": parse_duration(duration), "comment": comment}
    created = state(ctx).client().add_silence(spec)
    if output is Format.json:
        print_json(created)
    else:
        typer.echo(f"silence {created['id']} until {created['expires_at']}")


@alert_app.command("silences")
def silences(ctx: typer.Context, output: Format = OutputOpt) -> None:
    """Silences in force."""
    rows = state(ctx).client().list_silences()
    if output is Format.json:
        print_json(rows)
        return
    columns = [("id", "ID"), ("rule", "Rule"), ("node", "Node"), ("author", "By"), ("comment", "Why")]
    table(rows, [*columns, ("expires_at", "Until")])


def _add(ctx: typer.Context, spec: dict[str, Any], output: Format) -> None:
    created = state(ctx).client().add_receiver({k: v for k, v in spec.items() if v is not None})
    if output is Format.json:
        print_json(created)
    else:
        typer.echo(f"receiver {created['name']} ({created['type']}) sends to {created['target']}")


@receiver_app.command("add-webhook")
def add_webhook(
    ctx: typer.Context,
    name: str,
    url: Annotated[str, typer.Option(help="where to POST Alertmanager-style JSON")],
    output: Format = OutputOpt,
) -> None:
    """A webhook receiving Alertmanager's webhook JSON (version 4)."""
    _add(ctx, {"type": "webhook", "name": name, "url": url}, output)


@receiver_app.command("add-slack")
def add_slack(
    ctx: typer.Context,
    name: str,
    url: Annotated[str, typer.Option(help="the incoming-webhook URL (kept secret)")],
    output: Format = OutputOpt,
) -> None:
    """A Slack-style incoming webhook (Slack, Mattermost, Rocket.Chat)."""
    _add(ctx, {"type": "slack", "name": name, "url": url}, output)


@receiver_app.command("add-email")
def add_email(
    ctx: typer.Context,
    name: str,
    host: Annotated[str, typer.Option(help="SMTP server")],
    sender: Annotated[str, typer.Option("--from", help="From: address")],
    to: Annotated[list[str], typer.Option(help="recipient (repeatable)")],
    port: Annotated[int, typer.Option(help="SMTP port")] = 25,
    starttls: Annotated[bool, typer.Option(help="upgrade the connection with STARTTLS")] = False,
    username: Annotated[str | None, typer.Option(help="SMTP login (password from GPUFLEET_SMTP_PASSWORD)")] = None,
    output: Format = OutputOpt,
) -> None:
    """Email over SMTP."""
    import os

    spec = {
        "type": "email",
        "name": name,
        "host": host,
        "port": port,
        "sender": sender,
        "to": to,
        "starttls": starttls,
        "username": username,
        "password": os.environ.get("GPUFLEET_SMTP_PASSWORD") if username else None,
    }
    _add(ctx, spec, output)


@receiver_app.command("list")
def list_receivers(ctx: typer.Context, output: Format = OutputOpt) -> None:
    """Receivers, secrets masked."""
    rows = state(ctx).client().list_receivers()
    if output is Format.json:
        print_json(rows)
    else:
        table(rows, [("name", "Name"), ("type", "Type"), ("target", "Sends to")])


@receiver_app.command("remove")
def remove_receiver(ctx: typer.Context, name: str) -> None:
    state(ctx).client().remove_receiver(name)
    typer.echo(f"receiver {name} removed")


@rule_app.command("list")
def list_rules(ctx: typer.Context, output: Format = OutputOpt) -> None:
    """Threshold rules (node health and liveness alerts are always on)."""
    rows = state(ctx).client().list_alert_rules()
    if output is Format.json:
        print_json(rows)
        return
    shown = [
        r | {"when": f"{r['entity_kind']} {r['metric']} {r['op']} {r['threshold']:g} for {r['for_s']:g} s"}
        for r in rows
    ]
    table(shown, [("name", "Rule"), ("when", "Fires when"), ("severity", "Severity"), ("created_by", "By")])


@rule_app.command("add")
def add_rule(
    ctx: typer.Context,
    name: str,
    metric: Annotated[str, typer.Option(help="e.g. gpu_temp_c, power_w, disk_used_pct")],
    entity: Annotated[str, typer.Option(help="host, gpu, disk, nic or ib")],
    op: Annotated[str, typer.Option(help="> >= < <= == !=")],
    value: Annotated[float, typer.Option(help="the threshold")],
    duration: Annotated[str, typer.Option("--for", help="how long it must hold, e.g. 2m (0s: at once)")] = "0s",
    severity: Annotated[str, typer.Option(help="critical, warning or info")] = "warning",
    output: Format = OutputOpt,
) -> None:
    """Fire when an entity's metric compares true for a while, e.g.
    `gpufleet alert rule add GpuHot --metric gpu_temp_c --entity gpu --op '>=' --value 83 --for 5m`."""
    for_s = 0 if duration.strip() in ("0", "0s") else parse_duration(duration)
    rule = {"name": name, "metric": metric, "entity_kind": entity, "op": op, "threshold": value, "for_s": for_s}
    created = state(ctx).client().add_alert_rule(rule | {"severity": severity})
    if output is Format.json:
        print_json(created)
    else:
        typer.echo(f"rule {created['name']} added")


@rule_app.command("remove")
def remove_rule(ctx: typer.Context, name: str) -> None:
    state(ctx).client().remove_alert_rule(name)
    typer.echo(f"rule {name} removed")


@policy_app.command("list")
def list_policies(ctx: typer.Context, output: Format = OutputOpt) -> None:
    """The categories with their own health policy (`default` applies to the rest)."""
    rows = state(ctx).client().list_health_policies()
    if output is Format.json:
        print_json(rows)
        return
    table(rows, [("category", "Category"), ("policy", "Policy"), ("updated_by", "By"), ("updated_at", "When")])


@policy_app.command("set")
def set_policy(
    ctx: typer.Context,
    category: Annotated[str, typer.Argument(help="a node category, or `default` for every other node")],
    disable: Annotated[list[str] | None, typer.Option(help="a check not to run (repeatable)")] = None,
    threshold: Annotated[list[str] | None, typer.Option("--set", help="KEY=VALUE, e.g. gpu_temp_c=85")] = None,
    xid_action: Annotated[
        list[str] | None, typer.Option("--xid-action", help="CODE=ACTION over the Xid table, e.g. 13=ignore")
    ] = None,
    output: Format = OutputOpt,
) -> None:
    """Replace a category's health policy (unset thresholds take their defaults)."""
    policy: dict[str, Any] = {"disabled": disable or []}
    if xid_action:
        policy["xid_actions"] = {str(code): action for code, action in parse_overrides(xid_action).overrides.items()}
    for item in threshold or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise InvalidInput(f"invalid --set {item!r}: use KEY=VALUE")
        try:
            policy[key] = float(value)
        except ValueError:
            raise InvalidInput(f"invalid --set {item!r}: the value must be a number") from None
    saved = state(ctx).client().set_health_policy(category, policy)
    if output is Format.json:
        print_json(saved)
    else:
        typer.echo(f"health policy of {category} saved")


@policy_app.command("remove")
def remove_policy(ctx: typer.Context, category: str) -> None:
    state(ctx).client().remove_health_policy(category)
    typer.echo(f"health policy of {category} removed (the default applies)")
