"""The root command: global options, then the noun groups."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpufleet import __version__
from gpufleet.cli import (
    ansible,
    artifacts,
    assets,
    audit,
    burnin,
    categories,
    config,
    cve,
    deploy,
    directory,
    environments,
    export,
    images,
    jobs,
    logs,
    maintenance,
    mig,
    monitoring,
    nodes,
    power,
    projects,
    provision,
    services,
    slurm,
    slurm_accounts,
    storage,
    switches,
    tasks,
    templates,
    tokens,
    users,
)
from gpufleet.cli.state import CliState

app = typer.Typer(
    name="gpufleet",
    help="gpufleet: an open-source GPU cluster manager.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpufleet {__version__}")
        raise typer.Exit


@app.callback()
def root(
    ctx: typer.Context,
    server: Annotated[str | None, typer.Option(help="head node URL (env GPUFLEET_SERVER)")] = None,
    token: Annotated[str | None, typer.Option(help="API token (env GPUFLEET_TOKEN)")] = None,
    config_file: Annotated[Path | None, typer.Option("--config", help="TOML config file (env GPUFLEET_CONFIG)")] = None,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True)] = False,
) -> None:
    ctx.obj = CliState(config_file=config_file, overrides={"server": server, "token": token})


app.add_typer(nodes.app, name="node")
app.add_typer(tokens.app, name="token")
app.add_typer(config.app, name="config")
app.add_typer(audit.app, name="audit")
app.add_typer(users.app, name="user")
app.add_typer(projects.app, name="project")
app.add_typer(monitoring.metrics_app, name="metrics")
app.add_typer(monitoring.alert_app, name="alert")
app.add_typer(export.app, name="export")
app.add_typer(jobs.app, name="job")
app.add_typer(jobs.report_app, name="report")
app.add_typer(monitoring.policy_app, name="health-policy")
app.add_typer(slurm.app, name="slurm")
app.add_typer(logs.app, name="logs")
app.add_typer(logs.events_app, name="events")
app.add_typer(cve.app, name="cve")
app.add_typer(assets.app, name="assets")
app.add_typer(provision.network_app, name="network")
app.add_typer(provision.provision_app, name="provision")
app.add_typer(tasks.app, name="task")
app.add_typer(ansible.app, name="ansible")
app.add_typer(images.app, name="image")
app.add_typer(power.power_app, name="power")
app.add_typer(power.bmc_app, name="bmc")
app.add_typer(storage.app, name="storage")
app.add_typer(mig.app, name="mig")
app.add_typer(switches.switch_app, name="switch")
nodes.app.command("set-mac")(provision.set_mac)
nodes.app.command("deploy-agent")(deploy.deploy_agent)
app.add_typer(categories.app, name="category")
app.add_typer(environments.app, name="env")
app.add_typer(templates.app, name="template")
app.add_typer(artifacts.models, name="model")
app.add_typer(artifacts.datasets, name="dataset")
app.add_typer(services.app, name="service")
app.add_typer(burnin.app, name="burn-in")
app.add_typer(maintenance.app, name="maintenance")
app.add_typer(directory.app, name="directory")
nodes.app.command("set")(categories.node_set)
nodes.app.command("unset")(categories.node_unset)
slurm.app.add_typer(slurm_accounts.app, name="accounts")
app.command("health")(monitoring.health)
app.command("login")(config.login)
