"""gpufleet cve: advisories and their impact.

`cve scan` works without a server, for CI pipelines and image checks: an inventory file (dpkg status,
dpkg-query, `apt list --installed`, rpm, `pip freeze`, `pip list --format=json`, or gpufleet's own
export) against advisory files (OSV JSON/YAML, OSV's zip archives, NVD CVE JSON 2.0, CSAF 2.0), with
the matcher the head uses. `cve import` sends advisories to the head; `cve report` and `cve findings`
read what the head found across the fleet.
"""

from __future__ import annotations

import csv
import enum
import io
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from gpufleet.assets.advisories.load import AdvisoryError, load_paths
from gpufleet.assets.installed import detect_and_parse, parse_distro_arg
from gpufleet.assets.links import package_links
from gpufleet.assets.matching import AdvisoryIndex, Matcher
from gpufleet.assets.records import SEVERITIES, Finding, advisory_to_json
from gpufleet.cli.logs import read_log
from gpufleet.cli.output import Format, OutputOpt, print_json, table
from gpufleet.cli.state import state
from gpufleet.core.errors import InvalidInput

app = typer.Typer(help="Advisories (CVEs) and which nodes they affect.", no_args_is_help=True)


def finding_json(finding: Finding) -> dict[str, Any]:
    advisory, installed = finding.advisory, finding.installed
    return {
        "problem": finding.key(),
        "advisory": advisory.id,
        "aliases": list(advisory.aliases),
        "also": list(finding.also),
        "package": installed.name,
        "ecosystem": installed.ecosystem,
        "source_package": installed.source_name,
        "location": installed.location,
        "installed": installed.version,
        "fixed": finding.fixed,
        "severity": advisory.severity,
        "cvss_score": advisory.cvss_score,
        "summary": advisory.summary,
        "notes": list(finding.notes),
    }


def _severity_at_least(value: str | None) -> str | None:
    if value is not None and value not in SEVERITIES:
        raise InvalidInput(f"--fail-on must be one of {', '.join(SEVERITIES[:4])}")
    return value


@app.command("scan")
def scan(
    ctx: typer.Context,
    inventory: Annotated[
        Path,
        typer.Option(
            "--inventory",
            help="dpkg status, dpkg-query, dpkg -l, apt list, rpm, pip freeze or a gpufleet export; - for stdin",
        ),
    ],
    advisories: Annotated[
        list[Path],
        typer.Option(
            "--advisories",
            help="OSV, NVD or CSAF files, directories or OSV zip archives: --advisories A B C, or repeated",
        ),
    ],
    more_advisories: Annotated[
        list[Path] | None,
        typer.Argument(
            metavar="PATH", help="more advisory paths: the B and C of `--advisories A B C`", show_default=False
        ),
    ] = None,
    distro: Annotated[
        str | None,
        typer.Option(help="the inventory's distribution, e.g. ubuntu:22.04 (dpkg, apt and rpm lists need it)"),
    ] = None,
    fail_on: Annotated[
        str | None, typer.Option(help="exit 1 when a finding is at least this severe: critical, high, medium, low")
    ] = None,
    link: Annotated[
        list[str] | None,
        typer.Option(
            "--link",
            help="PACKAGE = ECOSYSTEM:NAME: a distribution package advised under another name, beyond the"
            " built-in links and the package_links setting (repeat)",
        ),
    ] = None,
    output: Format = OutputOpt,
) -> None:
    """Match an inventory file against advisory files, offline. One finding per problem and package."""
    threshold = _severity_at_least(fail_on)
    try:
        links = package_links([*state(ctx).settings().package_links, *(link or [])])
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    try:
        parsed = detect_and_parse(read_log(inventory), parse_distro_arg(distro) if distro else None)
    except ValueError as exc:
        raise InvalidInput(f"{inventory}: {exc}") from None
    try:
        index = AdvisoryIndex(advisory for _origin, advisory in load_paths([*advisories, *(more_advisories or [])]))
    except AdvisoryError as exc:
        raise InvalidInput(str(exc)) from None
    result = Matcher(index, links).scan(parsed.packages, parsed.distro)
    rank: dict[str, int] = {s: i for i, s in enumerate(SEVERITIES)}
    findings = sorted(result.findings, key=lambda f: (rank[f.advisory.severity], f.key(), f.installed.name))
    if output is Format.json:
        print_json([finding_json(f) for f in findings])
    else:
        rows = [
            {
                "severity": f.advisory.severity,
                "problem": f.key(),
                "advisory": f.advisory.id,
                "package": f.installed.name,
                "installed": f.installed.version,
                "fixed": f.fixed or "no fix yet",
            }
            for f in findings
        ]
        table(
            rows,
            [
                ("severity", "Severity"),
                ("problem", "Problem"),
                ("advisory", "Advisory"),
                ("package", "Package"),
                ("installed", "Installed"),
                ("fixed", "Fixed in"),
            ],
        )
    for note in parsed.notes:
        typer.echo(f"note: {note}", err=True)
    for package, advisory_id, why in result.unjudged[:20]:
        typer.echo(f"note: {package.name} {package.version} not judged against {advisory_id}: {why}", err=True)
    distro_text = f" ({parsed.distro.ecosystem} {parsed.distro.release})" if parsed.distro else ""
    typer.echo(
        f"{len(findings)} findings in {result.packages} packages{distro_text} against {index.advisories} advisories",
        err=True,
    )
    if threshold is not None and any(rank[f.advisory.severity] <= rank[threshold] for f in findings):
        raise typer.Exit(1)


def findings_csv(rows: list[dict[str, Any]], columns: list[str]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


IMPORT_BATCH = 500


@app.command("import")
def import_(
    ctx: typer.Context,
    paths: Annotated[
        list[Path], typer.Argument(help="OSV (JSON, YAML, OSV's zip archives), NVD 2.0 or CSAF files or directories")
    ],
) -> None:
    """Send advisories to the head, in batches, with a progress bar. Importing again changes nothing."""
    client = state(ctx).client()
    totals = {"new": 0, "updated": 0, "unchanged": 0}
    batch: list[dict[str, Any]] = []

    def send() -> None:
        for key, count in client.import_advisories(batch).items():
            totals[key] = totals.get(key, 0) + count
        batch.clear()

    try:
        with Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=False,
        ) as progress:
            task = progress.add_task("importing advisories", total=None)
            for _origin, advisory in load_paths(paths):
                batch.append(advisory_to_json(advisory))
                if len(batch) >= IMPORT_BATCH:
                    send()
                progress.advance(task)
            if batch:
                send()
    except AdvisoryError as exc:
        raise InvalidInput(f"{exc} (advisories before it were imported)") from None
    typer.echo(f"{totals['new']} new, {totals['updated']} updated, {totals['unchanged']} unchanged")


SeverityOpt = Annotated[str | None, typer.Option(help="at least: critical, high, medium or low")]
StatusOpt = Annotated[
    list[str] | None, typer.Option("--status", help="open, accepted, mitigated, fixed (repeat; default: all but fixed)")
]


class ReportFormat(enum.StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


REPORT_COLUMNS = [
    "problem", "severity", "cvss_score", "advisory", "fix_available", "nodes", "images", "packages", "summary",
]  # fmt: skip


@app.command("report")
def report(
    ctx: typer.Context,
    severity: SeverityOpt = None,
    status: StatusOpt = None,
    node: Annotated[str | None, typer.Option(help="only this node's problems")] = None,
    output: Annotated[ReportFormat, typer.Option("--output", "-o", help="table, json or csv")] = ReportFormat.table,
) -> None:
    """Per problem (CVE): the nodes and packages it affects, installed and fixed versions, severity."""
    problems = state(ctx).client().cve_report(severity=severity, status=status, node=node)
    if output is ReportFormat.json:
        print_json(problems)
        return
    rows = [
        p
        | {
            "nodes": f"{len(p['nodes'])}: {p['hostlist']}",
            "images": ", ".join(p.get("images", [])),
            "packages": "; ".join(
                f"{x['package']} {'/'.join(x['installed'])} -> {x['fixed'] or 'no fix'}" for x in p["packages"]
            ),
        }
        for p in problems
    ]
    if output is ReportFormat.csv:
        typer.echo(findings_csv(rows, REPORT_COLUMNS), nl=False)
        return
    table(
        rows,
        [
            ("severity", "Severity"),
            ("problem", "Problem"),
            ("nodes", "Nodes"),
            ("images", "Images"),
            ("packages", "Packages"),
            ("summary", "Summary"),
        ],
    )


@app.command("findings")
def findings(
    ctx: typer.Context,
    node: Annotated[str, typer.Argument(help="the node")],
    status: StatusOpt = None,
    output: Format = OutputOpt,
) -> None:
    """One node's findings, most severe first (ids for `cve set-status`)."""
    rows = state(ctx).client().cve_findings(node, status)
    if output is Format.json:
        print_json(rows)
        return
    table(
        [r | {"fixed": r["fixed"] or "no fix yet"} for r in rows],
        [
            ("id", "Id"),
            ("severity", "Severity"),
            ("problem", "Problem"),
            ("package", "Package"),
            ("installed", "Installed"),
            ("fixed", "Fixed in"),
            ("status", "Status"),
            ("status_reason", "Why"),
        ],
    )


@app.command("set-status")
def set_status(
    ctx: typer.Context,
    finding_id: Annotated[int, typer.Argument(help="the finding's id (cve findings NODE)")],
    status: Annotated[str, typer.Argument(help="open, accepted (risk accepted), mitigated or fixed")],
    reason: Annotated[str | None, typer.Option(help="why: required for accepted and mitigated")] = None,
) -> None:
    """Record a verdict on a finding, with who (you) and why."""
    changed = state(ctx).client().set_finding_status(finding_id, status, reason)
    what = f"{changed['problem']} in {changed['package']} on {changed['node']}"
    typer.echo(f"finding {changed['id']} ({what}): {changed['status']}")
