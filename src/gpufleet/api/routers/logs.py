"""Searching the log lines agents sent, and the events among them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel
from sqlalchemy import select

from gpufleet.api import conditional
from gpufleet.api.deps import Ctx, allow, tx
from gpufleet.auth.policy import Permission
from gpufleet.auth.schemas import Principal
from gpufleet.core.errors import InvalidInput
from gpufleet.inventory.models import Node
from gpufleet.logs import mining, store

router = APIRouter(prefix="/logs", tags=["logs"])


class LogLineOut(BaseModel):
    id: int
    node: str
    at: datetime
    source: str
    line: str
    kind: str | None
    code: int | None
    severity: str | None
    action: str | None
    pci_bus: str | None
    device: str | None
    gpu: int | None
    gpu_uuid: str | None  # from the node's inventory


class LogTemplateOut(BaseModel):
    category: str
    template_id: int
    template: str
    count: int
    first_seen: datetime
    first_node: str | None
    last_seen: datetime
    learned: bool  # first seen while its category was learning, so not announced as an event


@router.get("/templates")
def list_templates(
    _: Annotated[Principal, allow(Permission.NODES_READ)],
    ctx: Ctx,
    category: Annotated[str | None, Query(max_length=64, description='a node category; "" for none')] = None,
    new: Annotated[bool, Query(description="only templates found after their category's learning")] = False,
) -> list[LogTemplateOut]:
    """The log templates mined per node category, most recently seen first."""
    with tx(ctx, readonly=True) as db:
        names = dict(db.execute(select(Node.id, Node.name)).all())
        return [
            LogTemplateOut(
                category=t.category,
                template_id=t.template_id,
                template=t.template,
                count=t.count,
                first_seen=datetime.fromtimestamp(t.first_seen, UTC),
                first_node=names.get(t.first_node_id) if t.first_node_id is not None else None,
                last_seen=datetime.fromtimestamp(t.last_seen, UTC),
                learned=t.learned,
            )
            for t in mining.templates(db, category, new)
        ]


@router.get("", response_model=list[LogLineOut])
def search_logs(
    _: Annotated[Principal, allow(Permission.NODES_READ)],
    ctx: Ctx,
    request: Request,
    node: Annotated[str | None, Query(max_length=64)] = None,
    since: Annotated[datetime | None, Query(description="only lines at or after this time (ISO 8601)")] = None,
    until: Annotated[datetime | None, Query(description="only lines before this time (ISO 8601)")] = None,
    severity: Annotated[str | None, Query(pattern="^(info|warning|critical)$", description="at least")] = None,
    kind: Annotated[str | None, Query(max_length=32, description="xid, sxid, gpu_off_bus, ib_link, ...")] = None,
    events: Annotated[bool, Query(description="only lines the agents classified as events")] = False,
    q: Annotated[str | None, Query(max_length=256, description="words that must all appear")] = None,
    limit: Annotated[int, Query(ge=1, le=store.MAX_RESULTS)] = 500,
) -> Response:
    """Newest first, with an `ETag`: `If-None-Match` answers 304 while no new line matches."""
    try:
        with tx(ctx, readonly=True) as db:
            found = store.search(
                db,
                node=node,
                since=since.timestamp() if since else None,
                until=until.timestamp() if until else None,
                min_severity=severity,
                kind=kind,
                events_only=events,
                text_query=q,
                limit=limit,
            )
            lines = [
                LogLineOut(
                    id=r.id,
                    node=name,
                    at=datetime.fromtimestamp(r.ts, UTC),
                    source=r.source,
                    line=r.line,
                    kind=r.kind,
                    code=r.code,
                    severity=r.severity,
                    action=r.action,
                    pci_bus=r.pci_bus,
                    device=r.device,
                    gpu=r.gpu,
                    gpu_uuid=uuid,
                )
                for r, name, uuid in found
            ]
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    return conditional.answer(request, lines)
