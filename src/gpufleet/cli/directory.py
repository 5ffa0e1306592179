"""gpufleet directory status|sync"""

from __future__ import annotations

import typer

from gpufleet.cli.output import Format, OutputOpt, fields, print_json, table
from gpufleet.cli.state import state

app = typer.Typer(help="Where users come from (LDAP, single sign-on): status, sync now.", no_args_is_help=True)


@app.command("status")
def status(ctx: typer.Context, output: Format = OutputOpt) -> None:
    """Where users come from, each source's last sync, and what the group mappings cannot apply."""
    found = state(ctx).client().directory_status()
    if output is Format.json:
        print_json(found)
        return
    users = ", ".join(f"{source} {count}" for source, count in found["users"].items())
    fields(
        {"identity_provider": found["identity_provider"], "sso": found["sso"], "users": users},
        [("identity_provider", "Passwords checked by"), ("sso", "Single sign-on"), ("users", "Users by source")],
    )
    if found["sources"]:
        table(
            found["sources"],
            [
                ("source", "Source"),
                ("succeeded_at", "Last sync"),
                ("attempted_at", "Last attempt"),
                ("users", "Users"),
                ("changed", "Changed"),
                ("error", "Error"),
            ],
            title="Syncs",
        )
    problems = found["problems"] + [f"{s['source']}: {p}" for s in found["sources"] for p in s["problems"]]
    for problem in dict.fromkeys(problems):  # a mapping problem is in both lists
        typer.echo(f"problem: {problem}", err=True)


@app.command("sync")
def sync(ctx: typer.Context, output: Format = OutputOpt) -> None:
    """Read every directory user now, as the head does every ldap_sync_interval_s."""
    report = state(ctx).client().directory_sync()
    if output is Format.json:
        print_json(report)
        return
    typer.echo(
        f"{report['users']} directory users: {len(report['created'])} created, {len(report['changed'])} changed, "
        f"{len(report['disabled'])} disabled"
    )
    for name in report["disabled"]:
        typer.echo(f"disabled: {name}")
    for problem in report["problems"]:
        typer.echo(f"problem: {problem}", err=True)
