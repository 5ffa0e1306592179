"""Tables for metric samples, their roll-ups, alerts and silences.

Samples are stored one row per (node, time): the whole sample (every entity's values) as compact
JSON. A node's three hundred values arrive together; one row and one encode for all of them, instead
of one per value or per GPU, is what lets the head store hundreds of thousands of values a second
(bench/ingest.py). Queries are rarer than writes and pay instead, decoding a row to pick one value.
Times are Unix seconds (floats): they are compared and bucketed, never shown raw.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from gpufleet.core.db import Base, UTCDateTime


class MetricSample(Base):
    __tablename__ = "metric_samples"
    __table_args__ = (Index("ix_metric_samples_node_ts", "node_id", "ts"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    ts: Mapped[float] = mapped_column(Float, index=True)
    values: Mapped[str] = mapped_column(Text)  # {"entity": {"metric": value, ...}, ...}
    # The few GPU values the fleet views need (store.SUMMARY_METRICS), same shape: the GPU map reads a
    # thousand nodes' newest samples, and decoding a thousand 12 KB `values` takes longer than a page may.
    summary: Mapped[str | None] = mapped_column(Text, default=None)


class MetricRollup(Base):
    """One bucket (a minute by default) of one node: per entity and metric [min, max, sum, count]."""

    __tablename__ = "metric_rollups"
    __table_args__ = (Index("ix_metric_rollups_node_bucket", "node_id", "bucket"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    bucket: Mapped[float] = mapped_column(Float, index=True)
    values: Mapped[str] = mapped_column(Text)  # {"entity": {"metric": [min, max, sum, count], ...}, ...}
    summary: Mapped[str | None] = mapped_column(Text, default=None)  # the GPUs' part, as in MetricSample


class FleetRollup(Base):
    """One bucket of the whole fleet: per GPU metric [sum, count] of every GPU's mean in the bucket.

    Written with the node roll-ups, from them (`store.fleet_rollup_rows`), so the dashboard's fleet
    charts read one small row per minute instead of a thousand node rows. sum/count is the fleet's
    mean (utilisation, temperature); sum alone is the fleet's total (power, memory used).
    """

    __tablename__ = "fleet_rollups"

    id: Mapped[int] = mapped_column(primary_key=True)
    bucket: Mapped[float] = mapped_column(Float, unique=True, index=True)
    values: Mapped[str] = mapped_column(Text)  # {"metric": [sum, count], ...}


class Alert(Base):
    """One alert: firing until its condition clears, then resolved. At most one firing per fingerprint."""

    __tablename__ = "alerts"

    id: Mapped[int] = mapped_column(primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64), index=True)
    rule: Mapped[str] = mapped_column(String(64))
    severity: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16), index=True)  # firing | resolved
    node_id: Mapped[int | None] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), index=True)
    node_name: Mapped[str] = mapped_column(String(64))
    gpu: Mapped[int | None] = mapped_column(Integer, default=None)
    summary: Mapped[str] = mapped_column(String(512))
    labels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    starts_at: Mapped[datetime] = mapped_column(UTCDateTime())
    ends_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    acked_by: Mapped[str | None] = mapped_column(String(128), default=None)
    acked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    silenced: Mapped[bool] = mapped_column(default=False)


class Silence(Base):
    """Mutes notifications for alerts matching every given matcher until it expires."""

    __tablename__ = "silences"

    id: Mapped[int] = mapped_column(primary_key=True)
    rule: Mapped[str | None] = mapped_column(String(64), default=None)
    node_name: Mapped[str | None] = mapped_column(String(64), default=None)
    author: Mapped[str] = mapped_column(String(128))
    comment: Mapped[str] = mapped_column(String(512))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)


class Receiver(Base):
    """Where notifications go (see monitoring.notifiers for the kinds and their fields)."""

    __tablename__ = "alert_receivers"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class AlertRule(Base):
    """A threshold rule: fire when `metric` of an entity of `entity_kind` compares true for `for_s`."""

    __tablename__ = "alert_rules"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    metric: Mapped[str] = mapped_column(String(64))
    entity_kind: Mapped[str] = mapped_column(String(8))  # host | gpu | disk | nic | ib
    op: Mapped[str] = mapped_column(String(2))
    threshold: Mapped[float] = mapped_column(Float)
    for_s: Mapped[float] = mapped_column(Float)
    severity: Mapped[str] = mapped_column(String(16))
    created_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class HealthPolicyRow(Base):
    """The health thresholds and disabled checks of one node category (`default`: every other node)."""

    __tablename__ = "health_policies"

    category: Mapped[str] = mapped_column(String(64), primary_key=True)
    policy: Mapped[dict[str, Any]] = mapped_column(JSON)
    updated_by: Mapped[str] = mapped_column(String(128))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
