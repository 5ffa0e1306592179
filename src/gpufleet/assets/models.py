"""What the head keeps about software and advisories.

- `software_sets`: a set of installed packages, stored once per distinct content (its digest). Nodes
  built from one image report the same set, so a fleet of a thousand nodes holds a handful of sets,
  and matching judges each set once.
- `node_software`: which set each node runs now, its distro and kernel, and when it last changed.
- `advisories`: every advisory imported (OSV, NVD, CSAF), with what it affects, as JSON.
- `image_software`: which set each software image holds (provisioning records it at every revision),
  so an advisory's reach includes the images nodes will be built from, not only the nodes running now.
- `image_findings`: what affects each image, recomputed by every evaluation that sees the images or the
  advisories change. Images carry no workflow: an image is fixed by a new revision, not a verdict.
- `findings`: one row per (node, problem, package): an advisory affects a package installed on a
  node. Findings carry a workflow (open, accepted, mitigated, fixed) with who and why; a finding
  whose package was upgraded past the fix is marked fixed by the next evaluation, and reopens if the
  package comes back.
"""

from __future__ import annotations

from sqlalchemy import Float, ForeignKey, Index, Integer, LargeBinary, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from gpufleet.core.db import Base

FINDING_STATUSES = ("open", "accepted", "mitigated", "fixed")


class SoftwareSet(Base):
    __tablename__ = "software_sets"

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    packages: Mapped[bytes] = mapped_column(LargeBinary)  # zlib-compressed JSON list (see assets.store)
    count: Mapped[int] = mapped_column(Integer)
    first_seen: Mapped[float] = mapped_column(Float)


class NodeSoftware(Base):
    __tablename__ = "node_software"

    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), primary_key=True)
    digest: Mapped[str] = mapped_column(ForeignKey("software_sets.digest"), index=True)
    distro_ecosystem: Mapped[str | None] = mapped_column(String(32))
    distro_release: Mapped[str | None] = mapped_column(String(32))
    kernel: Mapped[str | None] = mapped_column(String(128))
    reported_at: Mapped[float] = mapped_column(Float)
    changed_at: Mapped[float] = mapped_column(Float)


class AdvisoryRecord(Base):
    __tablename__ = "advisories"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    key: Mapped[str] = mapped_column(String(128), index=True)  # the problem's CVE, else the id
    aliases: Mapped[str] = mapped_column(Text)  # JSON list
    summary: Mapped[str] = mapped_column(Text)
    source: Mapped[str] = mapped_column(String(8))
    severity: Mapped[str] = mapped_column(String(16))
    cvss_score: Mapped[float | None] = mapped_column(Float)
    cvss_vector: Mapped[str | None] = mapped_column(String(256))
    published: Mapped[str | None] = mapped_column(String(40))
    modified: Mapped[str | None] = mapped_column(String(40))
    affected: Mapped[str] = mapped_column(Text)  # JSON list of assets.records.Affected
    targets: Mapped[str] = mapped_column(Text)  # "ecosystem\trelease\tpackage" lines: the index keys
    content_hash: Mapped[str] = mapped_column(String(64))  # re-importing the same record changes nothing
    imported_at: Mapped[float] = mapped_column(Float)


class FindingRecord(Base):
    __tablename__ = "findings"
    __table_args__ = (
        UniqueConstraint("node_id", "problem", "ecosystem", "package", "location"),
        Index("ix_findings_status_severity", "status", "severity"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    # No index of its own: the unique constraint's index leads with node_id.
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    problem: Mapped[str] = mapped_column(String(128), index=True)  # the advisory key: one CVE, one finding
    advisory_id: Mapped[str] = mapped_column(String(128))  # the advisory that leads (most severe)
    also: Mapped[str] = mapped_column(Text, default="[]")  # JSON list: other advisories of the problem
    ecosystem: Mapped[str] = mapped_column(String(32))
    package: Mapped[str] = mapped_column(String(256))
    location: Mapped[str] = mapped_column(String(256), default="")
    installed: Mapped[str] = mapped_column(String(256))
    fixed: Mapped[str | None] = mapped_column(String(256))
    severity: Mapped[str] = mapped_column(String(16))
    cvss_score: Mapped[float | None] = mapped_column(Float)
    notes: Mapped[str] = mapped_column(Text, default="")
    signature: Mapped[str] = mapped_column(String(16))  # a digest of the columns above: what a pass compares
    status: Mapped[str] = mapped_column(String(16), default="open")
    status_by: Mapped[str | None] = mapped_column(String(128))
    status_reason: Mapped[str | None] = mapped_column(String(1024))
    status_at: Mapped[float | None] = mapped_column(Float)
    first_seen: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)  # the evaluation or person that last changed it


class ImageSoftware(Base):
    __tablename__ = "image_software"

    # The image's name, not a foreign key: images belong to provisioning, a layer above this one,
    # which tells us when one is removed (store.forget_image).
    image: Mapped[str] = mapped_column(String(128), primary_key=True)
    digest: Mapped[str] = mapped_column(ForeignKey("software_sets.digest"), index=True)
    distro_ecosystem: Mapped[str | None] = mapped_column(String(32))
    distro_release: Mapped[str | None] = mapped_column(String(32))
    revision: Mapped[int] = mapped_column(Integer)  # the image revision these packages were read from
    changed_at: Mapped[float] = mapped_column(Float)


class ImageFinding(Base):
    __tablename__ = "image_findings"
    __table_args__ = (UniqueConstraint("image", "problem", "ecosystem", "package", "location"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    image: Mapped[str] = mapped_column(String(128))
    problem: Mapped[str] = mapped_column(String(128), index=True)
    advisory_id: Mapped[str] = mapped_column(String(128))
    ecosystem: Mapped[str] = mapped_column(String(32))
    package: Mapped[str] = mapped_column(String(256))
    location: Mapped[str] = mapped_column(String(256), default="")
    installed: Mapped[str] = mapped_column(String(256))
    fixed: Mapped[str | None] = mapped_column(String(256))
    severity: Mapped[str] = mapped_column(String(16))
    cvss_score: Mapped[float | None] = mapped_column(Float)
