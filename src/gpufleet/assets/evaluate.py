"""Re-evaluating every node's findings against every advisory, whenever either changes.

A pass matches each distinct (software set, distribution) once, however many nodes run it, then
compares what should be found with the stored findings:

- a finding not stored yet opens;
- a stored one whose installed or fixed version, severity or leading advisory changed is updated;
- a stored one no longer found (the package was upgraded past the fix, or removed) is marked fixed
  by gpufleet, and one found again after that reopens;
- a person's verdict (accepted risk, mitigated) is kept as long as the finding stands.

The `Evaluator` keeps the advisory index and the matcher's verdict cache between passes and rebuilds
them only when the advisories change, so a pass after a node's upgrade costs one set's matching.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Table, bindparam, delete, insert, select, update
from sqlalchemy.orm import Session

from gpufleet.assets import store
from gpufleet.assets.links import DEFAULT_LINKS, PackageLink
from gpufleet.assets.matching import Matcher
from gpufleet.assets.models import FindingRecord, ImageFinding, ImageSoftware, NodeSoftware, SoftwareSet
from gpufleet.assets.records import Distro, Finding, Installed
from gpufleet.core.clock import Clock

_Key = tuple[int, str, str, str, str]  # node, problem, ecosystem, package, location
BY_GPUFLEET = "gpufleet"


@dataclass
class Evaluation:
    nodes: int = 0
    sets: int = 0
    images: int = 0
    opened: int = 0
    reopened: int = 0
    updated: int = 0
    fixed: int = 0
    unjudged: int = 0
    seconds: float = 0.0
    critical: dict[str, set[int]] = field(default_factory=dict)  # problem -> nodes newly affected

    @property
    def changed(self) -> bool:
        return bool(self.opened or self.reopened or self.updated or self.fixed)


_KeyTail = tuple[str, str, str, str]  # problem, ecosystem, package, location
_Wanted = tuple[dict[str, Any], str]  # the columns a finding should have, and their signature


def _wanted(finding: Finding) -> tuple[_KeyTail, _Wanted]:
    """What a finding's row should hold (computed once per set, shared by the nodes running it)."""
    pkg = finding.installed
    values = {
        "advisory_id": finding.advisory.id,
        "also": json.dumps(list(finding.also)),
        "installed": pkg.version,
        "fixed": finding.fixed,
        "severity": finding.advisory.severity,
        "cvss_score": finding.advisory.cvss_score,
        "notes": "; ".join(finding.notes),
    }
    signature = hashlib.blake2b(repr(tuple(values.values())).encode(), digest_size=8).hexdigest()
    values["signature"] = signature
    return (finding.key(), pkg.ecosystem, pkg.name, pkg.location or ""), (values, signature)


def _image_row(image: str, tail: _KeyTail, values: dict[str, Any]) -> dict[str, Any]:
    problem, ecosystem, package, location = tail
    keep = ("advisory_id", "installed", "fixed", "severity", "cvss_score")
    return {"image": image, "problem": problem, "ecosystem": ecosystem, "package": package, "location": location} | {
        k: values[k] for k in keep
    }


class Evaluator:
    def __init__(self, links: Iterable[PackageLink] = DEFAULT_LINKS) -> None:
        """`links`: the other ecosystems distribution packages are advised under (assets.links)."""
        self.links = tuple(links)
        self._version: tuple[int, float] | None = None
        self._matcher: Matcher | None = None
        self._sets: dict[str, list[Installed]] = {}  # decoded software sets, by digest
        self._interned: dict[tuple[str | None, ...], Installed] = {}  # one object per distinct package

    def state(self, session: Session) -> tuple[Any, ...]:
        """What a pass depends on: it changes when advisories, any node's software or any image's do."""
        software = session.execute(
            select(NodeSoftware.node_id, NodeSoftware.digest, NodeSoftware.changed_at).order_by(NodeSoftware.node_id)
        ).all()
        images = session.execute(
            select(ImageSoftware.image, ImageSoftware.digest, ImageSoftware.changed_at).order_by(ImageSoftware.image)
        ).all()
        return (
            store.advisories_version(session),
            hash(tuple(tuple(r) for r in software)),
            hash(tuple(tuple(r) for r in images)),
        )

    def _matcher_for(self, session: Session) -> Matcher:
        version = store.advisories_version(session)
        if self._matcher is None or version != self._version:
            self._matcher = Matcher(store.advisory_index(session), self.links)
            self._version = version
        return self._matcher

    def _packages(self, session: Session, digest: str) -> list[Installed]:
        packages = self._sets.get(digest)
        if packages is None:
            row = session.get(SoftwareSet, digest)
            packages = store.decode_set(row.packages, self._interned) if row is not None else []
            self._sets[digest] = packages
        return packages

    def evaluate(self, session: Session, clock: Clock) -> Evaluation:
        started = time.perf_counter()
        result = Evaluation()
        matcher = self._matcher_for(session)
        desired: dict[_Key, _Wanted] = {}
        by_set: dict[tuple[str, Distro | None], list[tuple[_KeyTail, _Wanted]]] = {}
        software = NodeSoftware
        nodes = session.execute(
            select(software.node_id, software.digest, software.distro_ecosystem, software.distro_release)
        ).all()

        def judged(digest: str, ecosystem: str | None, release: str | None) -> list[tuple[_KeyTail, _Wanted]]:
            distro = Distro(ecosystem, release) if ecosystem and release else None
            wanted = by_set.get((digest, distro))
            if wanted is None:
                scanned = matcher.scan(self._packages(session, digest), distro)
                wanted = by_set[(digest, distro)] = [_wanted(f) for f in scanned.findings]
                result.unjudged += len(scanned.unjudged)
            return wanted

        for node_id, digest, ecosystem, release in nodes:
            for tail, want in judged(digest, ecosystem, release):
                desired[(node_id, *tail)] = want
        image = ImageSoftware
        images = session.execute(select(image.image, image.digest, image.distro_ecosystem, image.distro_release)).all()
        image_rows = [
            _image_row(name, tail, want)
            for name, digest, ecosystem, release in images
            for tail, (want, _) in judged(digest, ecosystem, release)
        ]
        self._sets = {digest: self._sets[digest] for digest, _ in by_set if digest in self._sets}
        if len(self._interned) > 4 * sum(len(p) for p in self._sets.values()):
            self._interned = {}  # sets came and went: start afresh rather than grow
        result.nodes, result.sets, result.images = len(nodes), len(by_set), len(images)
        self._apply(session, clock.now(), desired, result)
        # A handful of images: replacing their findings wholesale is simpler than diffing, and they
        # carry no workflow to keep.
        session.execute(delete(ImageFinding))
        if image_rows:
            session.execute(insert(ImageFinding), image_rows)
        result.seconds = time.perf_counter() - started
        return result

    def _apply(self, session: Session, now: float, desired: dict[_Key, _Wanted], result: Evaluation) -> None:
        updates, seen = _changes(session.execute(select(*_COLUMNS)).all(), desired, now, result)
        inserts = _inserts(desired, seen, now, result)
        # Core statements on the table, not the ORM's bulk paths: a first pass writes hundreds of
        # thousands of rows, and the ORM's per-row bookkeeping would double the time.
        table: Table = FindingRecord.__table__  # type: ignore[assignment]
        connection = session.connection()
        if inserts and connection.dialect.name == "postgresql":
            _copy(connection, table, inserts)
        elif inserts:
            connection.execute(insert(table), inserts)
        # One executemany per shape of change: every parameter set of one statement has the same keys.
        shapes: dict[frozenset[str], list[dict[str, Any]]] = {}
        for change in updates:
            shapes.setdefault(frozenset(change), []).append(change)
        for keys, batch in shapes.items():
            columns: dict[str, Any] = {k: bindparam(k) for k in keys if k != "id"}
            statement = update(table).where(table.c.id == bindparam("finding_id")).values(columns)
            connection.execute(statement, [{"finding_id": c["id"]} | c for c in batch])


_COLUMNS = (
    FindingRecord.id,
    FindingRecord.node_id,
    FindingRecord.problem,
    FindingRecord.ecosystem,
    FindingRecord.package,
    FindingRecord.location,
    FindingRecord.status,
    FindingRecord.signature,
)


def _changes(
    rows: Sequence[Any], desired: dict[_Key, _Wanted], now: float, result: Evaluation
) -> tuple[list[dict[str, Any]], set[_Key]]:
    """Updates to stored findings (changed, fixed, reopened), and the keys still found. Rows are
    compared by signature: one string per row, not seven columns."""
    updates: list[dict[str, Any]] = []
    seen: set[_Key] = set()
    for finding_id, node_id, problem, ecosystem, package, location, status, signature in rows:
        key = (node_id, problem, ecosystem, package, location)
        want = desired.get(key)
        if want is None:
            if status != "fixed":
                updates.append(_status(finding_id, "fixed", "no affected version is installed any more", now))
                result.fixed += 1
            continue
        seen.add(key)
        values, wanted_signature = want
        change = values if signature != wanted_signature else {}
        if status == "fixed":
            change = change | _status(finding_id, "open", "an affected version is installed again", now)
            result.reopened += 1
            if values["severity"] == "critical":
                result.critical.setdefault(problem, set()).add(node_id)
        elif change:
            result.updated += 1
        if change:
            updates.append({"id": finding_id, "updated_at": now} | change)
    return updates, seen


def _inserts(desired: dict[_Key, _Wanted], seen: set[_Key], now: float, result: Evaluation) -> list[dict[str, Any]]:
    inserts = []
    for key, (want, _signature) in desired.items():
        if key in seen:
            continue
        node_id, problem, ecosystem, package, location = key
        base = {"node_id": node_id, "problem": problem, "ecosystem": ecosystem, "package": package}
        inserts.append(base | {"location": location, "status": "open", "first_seen": now, "updated_at": now} | want)
        result.opened += 1
        if want["severity"] == "critical":
            result.critical.setdefault(problem, set()).add(node_id)
    return inserts


def _copy(connection: Connection, table: Table, rows: list[dict[str, Any]]) -> None:
    """PostgreSQL's COPY, through the transaction's own psycopg connection: a first evaluation of a
    large fleet inserts hundreds of thousands of findings, several times faster than INSERTs."""
    columns = list(rows[0])
    cursor = connection.connection.driver_connection.cursor()  # type: ignore[union-attr]
    names = ", ".join(columns)
    with cursor.copy(f"COPY {table.name} ({names}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row([row[c] for c in columns])


def _status(finding_id: int, status: str, reason: str, now: float) -> dict[str, Any]:
    return {
        "id": finding_id,
        "status": status,
        "status_by": BY_GPUFLEET,
        "status_reason": reason,
        "status_at": now,
        "updated_at": now,
    }
