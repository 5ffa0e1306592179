"""Storing software sets and advisories, and reading them back for matching.

A software set is stored once per content: its digest is the SHA-256 of its packages in a canonical
order, so two nodes built from one image share one row, and a node reporting what it reported before
changes nothing. Advisories are stored with a hash of their content: importing the same feed again
writes nothing, and a record the feed has since changed replaces the old one.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from gpufleet.assets.matching import AdvisoryIndex, targets
from gpufleet.assets.models import AdvisoryRecord, ImageFinding, ImageSoftware, NodeSoftware, SoftwareSet
from gpufleet.assets.records import Advisory, Distro, Installed, advisory_to_json, affected_from_json
from gpufleet.core.clock import Clock
from gpufleet.inventory.models import Node

_FIELDS = [f.name for f in dataclasses.fields(Installed)]


def _canonical(packages: Iterable[Installed]) -> list[list[str | None]]:
    return sorted(([getattr(p, f) for f in _FIELDS] for p in packages), key=lambda row: [v or "" for v in row])


def encode_set(packages: Iterable[Installed]) -> tuple[str, bytes, int]:
    """(digest, compressed JSON, count) of a package set."""
    rows = _canonical(packages)
    text = json.dumps(rows, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest(), zlib.compress(text.encode(), 6), len(rows)


def decode_set(blob: bytes, interned: dict[tuple[str | None, ...], Installed] | None = None) -> list[Installed]:
    """The packages of a stored set. With `interned`, a package already decoded from another set is
    the same object: sets from one image share all but a few hundred of their thousands of packages."""
    rows = json.loads(zlib.decompress(blob))
    if interned is None:
        return [Installed(*row) for row in rows]
    out = []
    for row in rows:
        key = tuple(row)
        package = interned.get(key)
        if package is None:
            package = interned[key] = Installed(*row)
        out.append(package)
    return out


def report_software(
    session: Session,
    clock: Clock,
    node_id: int,
    distro: Distro | None,
    kernel: str | None,
    packages: list[Installed],
) -> bool:
    """Record what a node runs now; True when it differs from what it ran before."""
    now = clock.now()
    facts = _facts(session, packages, distro, now) | {"kernel": kernel}
    current = session.get(NodeSoftware, node_id)
    if current is None:
        session.add(NodeSoftware(node_id=node_id, reported_at=now, changed_at=now, **facts))
        return True
    current.reported_at = now
    return _changed(current, facts, now)


def _facts(session: Session, packages: list[Installed], distro: Distro | None, now: float) -> dict[str, Any]:
    """The set's digest (the set stored once per content) and the distribution, as columns."""
    digest, blob, count = encode_set(packages)
    if session.get(SoftwareSet, digest) is None:
        session.add(SoftwareSet(digest=digest, packages=blob, count=count, first_seen=now))
        session.flush()
    return {
        "digest": digest,
        "distro_ecosystem": distro.ecosystem if distro else None,
        "distro_release": distro.release if distro else None,
    }


def _changed(row: NodeSoftware | ImageSoftware, facts: dict[str, Any], now: float) -> bool:
    """Apply `facts` to a node's or image's row; True (and `changed_at` moved) when any differed."""
    if all(getattr(row, k) == v for k, v in facts.items()):
        return False
    for k, v in facts.items():
        setattr(row, k, v)
    row.changed_at = now
    return True


def report_image_software(
    session: Session, clock: Clock, image: str, revision: int, distro: Distro | None, packages: list[Installed]
) -> bool:
    """Record what a software image holds at `revision`; True when its packages or distro changed."""
    now = clock.now()
    facts = _facts(session, packages, distro, now)
    current = session.get(ImageSoftware, image)
    if current is None:
        session.add(ImageSoftware(image=image, revision=revision, changed_at=now, **facts))
        return True
    current.revision = revision
    return _changed(current, facts, now)


def forget_image(session: Session, image: str) -> None:
    """An image was removed: it affects nothing any more."""
    session.execute(delete(ImageFinding).where(ImageFinding.image == image))
    session.execute(delete(ImageSoftware).where(ImageSoftware.image == image))


def node_name(session: Session, node_id: int) -> str:
    return session.scalar(select(Node.name).where(Node.id == node_id)) or f"node {node_id}"


# -- advisories ---------------------------------------------------------------------------------


def to_record(advisory: Advisory) -> dict[str, Any]:
    """The columns of an advisory row (all but imported_at): its wire form, with the lists as JSON."""
    values = advisory_to_json(advisory)
    values |= {
        "key": advisory.key(),
        "aliases": json.dumps(values["aliases"]),
        "affected": json.dumps(values["affected"], separators=(",", ":")),
        "targets": "\n".join(sorted("\t".join((e, r or "", p)) for e, r, p in targets(advisory))),
    }
    values["content_hash"] = hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()
    return values


@dataclass
class ImportCounts:
    new: int = 0
    updated: int = 0
    unchanged: int = 0


def import_advisories(session: Session, clock: Clock, advisories: list[Advisory]) -> ImportCounts:
    """Insert new advisories, replace changed ones, leave the same ones alone (idempotent)."""
    counts = ImportCounts()
    # imported_at doubles as a change stamp (see advisories_version): it must grow with every import
    # that changes something, even two within one clock tick.
    last = session.scalar(select(func.max(AdvisoryRecord.imported_at))) or 0.0
    now = max(clock.now(), last + 0.001)
    latest = {a.id: a for a in advisories}  # the last copy of an id in one batch wins
    stored = {row.id: row for row in session.scalars(select(AdvisoryRecord).where(AdvisoryRecord.id.in_(list(latest))))}
    for advisory in latest.values():
        values = to_record(advisory)
        row = stored.get(advisory.id)
        if row is None:
            session.add(AdvisoryRecord(imported_at=now, **values))
            counts.new += 1
        elif row.content_hash != values["content_hash"]:
            for name, value in values.items():
                setattr(row, name, value)
            row.imported_at = now
            counts.updated += 1
        else:
            counts.unchanged += 1
    return counts


def advisories_version(session: Session) -> tuple[int, float]:
    """(count, last import): what changes whenever the stored advisories do."""
    count, last = session.execute(select(func.count(), func.max(AdvisoryRecord.imported_at))).one()
    return int(count), float(last or 0.0)


def advisory_index(session: Session) -> AdvisoryIndex:
    """Every stored advisory, indexed by its target keys and parsed only when a package asks for it."""
    a = AdvisoryRecord
    index = AdvisoryIndex()
    columns = (a.id, a.aliases, a.summary, a.source, a.severity, a.cvss_score, a.cvss_vector, a.published, a.modified)
    for row in session.execute(select(a.targets, *columns, a.affected)):
        keys = []
        for line in row[0].split("\n"):
            if line:
                ecosystem, release, package = line.split("\t")
                keys.append((ecosystem, release or None, package))
        index.add_lazy(keys, functools.partial(_advisory, tuple(row[1:])))
    return index


def _advisory(row: tuple[Any, ...]) -> Advisory:
    id_, aliases, summary, source, severity, score, vector, published, modified, affected = row
    return Advisory(
        id=id_,
        aliases=tuple(json.loads(aliases)),
        summary=summary,
        source=source,
        severity=severity,
        cvss_score=score,
        cvss_vector=vector,
        published=published,
        modified=modified,
        affected=tuple(affected_from_json(x) for x in json.loads(affected)),
    )


@dataclass
class NodeSoftwareView:
    name: str
    category: str | None
    distro: Distro | None
    kernel: str | None
    reported_at: float
    changed_at: float
    packages: list[Installed]


def node_software(session: Session, names: Iterable[str] | None = None) -> dict[str, NodeSoftwareView]:
    """What each node (those named, else all that reported) runs; each set decoded once."""
    query = select(Node.name, Node.category, NodeSoftware).join(NodeSoftware, NodeSoftware.node_id == Node.id)
    if names is not None:
        query = query.where(Node.name.in_(list(names)))
    rows = session.execute(query).all()
    digests = {row.NodeSoftware.digest for row in rows}
    sets = {
        s.digest: decode_set(s.packages)
        for s in session.scalars(select(SoftwareSet).where(SoftwareSet.digest.in_(digests)))
    }
    out = {}
    for name, category, soft in rows:
        distro = Distro(soft.distro_ecosystem, soft.distro_release or "") if soft.distro_ecosystem else None
        out[name] = NodeSoftwareView(
            name, category, distro, soft.kernel, soft.reported_at, soft.changed_at, sets.get(soft.digest, [])
        )
    return out
