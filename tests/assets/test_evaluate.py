"""The head's side on both backends: software sets stored once, advisories imported idempotently,
findings opened, updated, fixed by an upgrade and reopened, a person's verdict kept, and the report."""

from __future__ import annotations

import dataclasses

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.assets import report, store
from gpufleet.assets.evaluate import Evaluator
from gpufleet.assets.models import FindingRecord, SoftwareSet
from gpufleet.assets.records import Advisory, Affected, Distro, Installed, Range
from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.core.errors import InvalidInput
from gpufleet.inventory import service as inventory
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.monitoring.models import Alert
from gpufleet.workers.asset_loops import AssetLoops

# One database: matching logic (tests/assets' store tests run both).
pytestmark = pytest.mark.one_database

BOOKWORM = Distro("Debian", "12")
GLIBC = Advisory(
    "DSA-5514-1",
    ("CVE-2023-4911",),
    "glibc - security update",
    "osv",
    severity="critical",
    cvss_score=9.8,
    affected=(
        Affected(
            "Debian",
            "glibc",
            "12",
            (Range("ECOSYSTEM", (("introduced", "0"), ("fixed", "2.36-9+deb12u3"))),),
            fixed="2.36-9+deb12u3",
        ),
    ),
)
REQUESTS = Advisory(
    "PYSEC-2023-74",
    ("CVE-2023-32681",),
    "requests leaks Proxy-Authorization",
    "osv",
    severity="medium",
    cvss_score=6.1,
    affected=(
        Affected("PyPI", "requests", None, (Range("ECOSYSTEM", (("introduced", "2.3.0"), ("fixed", "2.31.0"))),)),
    ),
)


def image(glibc: str = "2.36-9+deb12u1", requests: str = "2.28.1") -> list[Installed]:
    return [
        Installed("Debian", "libc6", glibc, "glibc", glibc, "amd64"),
        Installed("Debian", "libc-bin", glibc, "glibc", glibc, "amd64"),
        Installed("Debian", "bash", "5.2.15-2+b2", "bash", "5.2.15-2", "amd64"),
        Installed("PyPI", "requests", requests, location="/opt/venv"),
    ]


@pytest.fixture
def fleet(sessions: sessionmaker[Session], clock: FakeClock) -> dict[str, int]:
    with transaction(sessions) as s:
        ids = {n.name: n.id for n in inventory.add_nodes(s, clock, ["n1", "n2", "n3"], NodeSettings())}
        for name in ("n1", "n2"):
            assert store.report_software(s, clock, ids[name], BOOKWORM, "6.1.0-18-amd64", image())
        store.report_software(s, clock, ids["n3"], Distro("Ubuntu", "22.04"), "5.15.0", image())
        store.import_advisories(s, clock, [GLIBC, REQUESTS])
    return ids


def evaluate(sessions: sessionmaker[Session], clock: FakeClock, evaluator: Evaluator | None = None):  # type: ignore[no-untyped-def]
    with transaction(sessions) as s:
        return (evaluator or Evaluator()).evaluate(s, clock)


def findings(sessions: sessionmaker[Session]) -> list[tuple[int, str, str, str, str, str | None]]:
    with transaction(sessions, readonly=True) as s:
        rows = s.scalars(
            select(FindingRecord).order_by(FindingRecord.node_id, FindingRecord.problem, FindingRecord.package)
        )
        return [(f.node_id, f.problem, f.package, f.status, f.installed, f.fixed) for f in rows]


def test_one_set_per_content_and_a_repeat_report_changes_nothing(
    sessions: sessionmaker[Session], clock: FakeClock, fleet: dict[str, int]
) -> None:
    with transaction(sessions) as s:
        assert s.scalar(select(func.count()).select_from(SoftwareSet)) == 1  # three nodes, one image
        assert not store.report_software(s, clock, fleet["n1"], BOOKWORM, "6.1.0-18-amd64", list(reversed(image())))


def test_findings_per_node_with_each_distribution_matched_apart(
    sessions: sessionmaker[Session], clock: FakeClock, fleet: dict[str, int]
) -> None:
    result = evaluate(sessions, clock)
    assert (result.nodes, result.sets, result.opened) == (3, 2, 7)  # two glibc binaries share one finding
    n1, n2, n3 = fleet["n1"], fleet["n2"], fleet["n3"]
    assert findings(sessions) == [
        (n1, "CVE-2023-32681", "requests", "open", "2.28.1", "2.31.0"),
        (n1, "CVE-2023-4911", "libc-bin", "open", "2.36-9+deb12u1", "2.36-9+deb12u3"),
        (n1, "CVE-2023-4911", "libc6", "open", "2.36-9+deb12u1", "2.36-9+deb12u3"),
        (n2, "CVE-2023-32681", "requests", "open", "2.28.1", "2.31.0"),
        (n2, "CVE-2023-4911", "libc-bin", "open", "2.36-9+deb12u1", "2.36-9+deb12u3"),
        (n2, "CVE-2023-4911", "libc6", "open", "2.36-9+deb12u1", "2.36-9+deb12u3"),
        (n3, "CVE-2023-32681", "requests", "open", "2.28.1", "2.31.0"),  # a Debian advisory: not on Ubuntu
    ]
    assert result.critical == {"CVE-2023-4911": {n1, n2}}
    again = evaluate(sessions, clock)
    assert not again.changed
    assert again.critical == {}


def test_an_upgrade_fixes_a_finding_and_a_downgrade_reopens_it(
    sessions: sessionmaker[Session], clock: FakeClock, fleet: dict[str, int]
) -> None:
    evaluator = Evaluator()
    evaluate(sessions, clock, evaluator)
    with transaction(sessions) as s:
        assert store.report_software(s, clock, fleet["n1"], BOOKWORM, "6.1.0-18-amd64", image(glibc="2.36-9+deb12u3"))
    result = evaluate(sessions, clock, evaluator)
    assert (result.fixed, result.opened) == (2, 0)  # installed == fixed is not affected
    with transaction(sessions, readonly=True) as s:
        fixed = s.scalars(select(FindingRecord).where(FindingRecord.status == "fixed")).all()
        assert {(f.node_id, f.package, f.status_by) for f in fixed} == {
            (fleet["n1"], "libc6", "gpufleet"),
            (fleet["n1"], "libc-bin", "gpufleet"),
        }
    with transaction(sessions) as s:
        store.report_software(s, clock, fleet["n1"], BOOKWORM, "6.1.0-18-amd64", image())
    result = evaluate(sessions, clock, evaluator)
    assert result.reopened == 2
    assert result.critical == {"CVE-2023-4911": {fleet["n1"]}}


def test_a_verdict_is_kept_and_needs_a_reason(
    sessions: sessionmaker[Session], clock: FakeClock, fleet: dict[str, int]
) -> None:
    evaluate(sessions, clock)
    with transaction(sessions) as s:
        finding = s.scalars(select(FindingRecord).where(FindingRecord.package == "requests")).first()
        assert finding is not None
        with pytest.raises(InvalidInput, match="reason is required"):
            report.set_status(s, clock, finding.id, "accepted", "alice", " ")
        report.set_status(s, clock, finding.id, "accepted", "alice", "no proxy on these nodes")
        accepted_id = finding.id
    assert not evaluate(sessions, clock).changed
    with transaction(sessions, readonly=True) as s:
        kept = s.get(FindingRecord, accepted_id)
        assert kept is not None
        assert (kept.status, kept.status_by, kept.status_reason) == ("accepted", "alice", "no proxy on these nodes")


def test_importing_again_changes_nothing_and_a_changed_record_updates_findings(
    sessions: sessionmaker[Session], clock: FakeClock, fleet: dict[str, int]
) -> None:
    evaluator = Evaluator()
    evaluate(sessions, clock, evaluator)
    with transaction(sessions) as s:
        assert dataclasses.astuple(store.import_advisories(s, clock, [GLIBC, REQUESTS])) == (0, 0, 2)
        later = dataclasses.replace(
            GLIBC,
            affected=(
                dataclasses.replace(
                    GLIBC.affected[0], ranges=(Range("ECOSYSTEM", (("introduced", "0"), ("fixed", "2.36-9+deb12u4"))),)
                ),
            ),
        )
        assert dataclasses.astuple(store.import_advisories(s, clock, [later])) == (0, 1, 0)
    result = evaluate(sessions, clock, evaluator)  # the evaluator notices the advisories changed
    assert result.updated == 4
    assert {f[5] for f in findings(sessions) if f[1] == "CVE-2023-4911"} == {"2.36-9+deb12u4"}


def test_the_report_groups_by_problem_most_severe_first(
    sessions: sessionmaker[Session], clock: FakeClock, fleet: dict[str, int]
) -> None:
    evaluate(sessions, clock)
    with transaction(sessions, readonly=True) as s:
        found = report.problems(s)
        assert [(p.problem, p.severity, p.hostlist, p.fix_available) for p in found] == [
            ("CVE-2023-4911", "critical", "n[1-2]", True),
            ("CVE-2023-32681", "medium", "n[1-3]", True),
        ]
        assert [(p.package, p.installed, p.fixed) for p in found[0].packages] == [
            ("libc-bin", ["2.36-9+deb12u1"], "2.36-9+deb12u3"),
            ("libc6", ["2.36-9+deb12u1"], "2.36-9+deb12u3"),
        ]
        assert found[0].advisory == "DSA-5514-1"
        assert found[0].summary == "glibc - security update"
        assert [p.problem for p in report.problems(s, severity="high")] == ["CVE-2023-4911"]
        assert [p.problem for p in report.problems(s, node="n3")] == ["CVE-2023-32681"]
        assert [f.problem for f in report.node_findings(s, "n1")] == [
            "CVE-2023-4911",
            "CVE-2023-4911",
            "CVE-2023-32681",
        ]
        with pytest.raises(InvalidInput):
            report.problems(s, severity="dire")


def test_the_leaders_pass_alerts_once_per_critical_problem_and_resolves_it(
    sessions: sessionmaker[Session], clock: FakeClock, fleet: dict[str, int]
) -> None:
    fired: list[Alert] = []
    loops = AssetLoops(sessions=sessions, clock=clock, is_leader=lambda: True, on_alerts=fired.extend)
    assert loops.evaluate_once() is not None
    assert [(a.rule, a.node_name, a.severity, a.status, a.summary) for a in fired] == [
        ("CriticalVulnerability", "fleet", "critical", "firing", "CVE-2023-4911 (critical) affects 2 nodes: n[1-2]")
    ]
    assert loops.evaluate_once() is None  # nothing changed: no pass
    with transaction(sessions) as s:
        for name in ("n1", "n2"):
            store.report_software(s, clock, fleet[name], BOOKWORM, "6.1.0-18-amd64", image(glibc="2.36-9+deb12u3"))
    loops.evaluate_once()
    assert [(a.rule, a.status) for a in fired[1:]] == [("CriticalVulnerability", "resolved")]
    follower = AssetLoops(sessions=sessions, clock=clock, is_leader=lambda: False)
    assert follower.evaluate_once(force=True) is None


def test_images_are_in_the_report_beside_nodes_and_a_new_revision_fixes_them(
    sessions: sessionmaker[Session], clock: FakeClock, fleet: dict[str, int]
) -> None:
    """An advisory's reach includes the images nodes are built from: an image that holds the affected
    package is listed with the problem, a problem only an image has still shows, and an image's new
    revision with the fix drops it."""
    with transaction(sessions) as s:
        assert store.report_image_software(s, clock, "gpu-bookworm", 1, BOOKWORM, image())
        assert not store.report_image_software(s, clock, "gpu-bookworm", 2, BOOKWORM, image())  # same content
        store.report_image_software(s, clock, "jammy-base", 1, Distro("Ubuntu", "22.04"), image())
        # n1-n3 upgrade glibc and requests: only the images still hold the old glibc.
        for node_id in fleet.values():
            store.report_software(s, clock, node_id, BOOKWORM, "6.1.0-18-amd64", image("2.36-9+deb12u3", "2.31.0"))
    evaluator = Evaluator()
    assert evaluate(sessions, clock, evaluator).images == 2
    with transaction(sessions, readonly=True) as s:
        found = {p.problem: p for p in report.problems(s)}
        assert (found["CVE-2023-4911"].nodes, found["CVE-2023-4911"].images) == ([], ["gpu-bookworm"])
        assert found["CVE-2023-4911"].fix_available
        assert found["CVE-2023-32681"].images == ["gpu-bookworm", "jammy-base"]  # PyPI: any distro
        assert report.problems(s, node="n1") == []  # a node's report has no images in it
        assert report.problems(s, statuses=("accepted",)) == []  # images carry no workflow

    with transaction(sessions) as s:  # the image's next revision carries both fixes
        assert store.report_image_software(s, clock, "gpu-bookworm", 3, BOOKWORM, image("2.36-9+deb12u3", "2.31.0"))
        store.forget_image(s, "jammy-base")
    evaluate(sessions, clock, evaluator)
    with transaction(sessions, readonly=True) as s:
        assert report.problems(s) == []
