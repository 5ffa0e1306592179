"""`GET /metrics`: the fleet in Prometheus' text format, for a Prometheus server holding a token.

Outside `/api/v1` because that is where Prometheus looks by default; authenticated like the API
(bearer token with `metrics:read`), because node names, GPU serials and health are not public.
"""

from __future__ import annotations

import gzip
import itertools
from typing import Annotated

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gpufleet.api.deps import Ctx, allow
from gpufleet.auth.policy import Permission
from gpufleet.auth.schemas import Principal
from gpufleet.core.db import transaction
from gpufleet.monitoring.prometheus import FleetCollector
from gpufleet.network.prometheus import switch_metrics
from gpufleet.prometheus.exposition import CONTENT_TYPE, render

router = APIRouter()


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request, _: Annotated[Principal, allow(Permission.METRICS_READ)], ctx: Ctx) -> Response:
    """What this replica knows: every node's state from the database, the GPUs of the nodes whose
    channels it holds (scrape every replica), and the switches' ports as the leader last polled them.
    Raises Unavailable when the database does not answer."""
    fleet = FleetCollector(ctx.sessions, ctx.monitoring.tracker).collect()
    with transaction(ctx.sessions, readonly=True) as session:
        switches = switch_metrics(session)
    body = render(itertools.chain(fleet, switches))
    headers = {"Vary": "Accept-Encoding"}
    if "gzip" in request.headers.get("accept-encoding", ""):
        # Prometheus asks for gzip. A thousand 8-GPU nodes are about 50 MB of text and 2 MB gzipped,
        # which the fastest level costs about 0.2 s of CPU to make.
        body = gzip.compress(body, compresslevel=1)
        headers["Content-Encoding"] = "gzip"
    return Response(body, media_type=CONTENT_TYPE, headers=headers)
