"""What node agents call: join (with a join token), report inventory, the heartbeat channel, and fetch accounts."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Annotated, TypeVar

from anyio import to_thread
from fastapi import APIRouter, Header, Request, Response, WebSocket, WebSocketDisconnect
from pydantic import ValidationError

from gpufleet.api import conditional
from gpufleet.api.deps import Ctx, allow, authenticate, bearer_token, tx
from gpufleet.api.hub import Channel
from gpufleet.assets import store as assets_store
from gpufleet.assets.records import Distro, Installed
from gpufleet.auth import audit, users
from gpufleet.auth import service as auth
from gpufleet.auth.models import TokenKind
from gpufleet.auth.policy import Permission
from gpufleet.auth.schemas import Principal
from gpufleet.core.db import transaction
from gpufleet.core.errors import (
    Conflict,
    Forbidden,
    GpufleetError,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    Unauthorized,
    Unavailable,
    describe,
)
from gpufleet.inventory import service as inventory
from gpufleet.inventory.models import Node
from gpufleet.lifecycle import burnin
from gpufleet.network import fabric
from gpufleet.network import service as network
from gpufleet.protocol.accounts import AccountList
from gpufleet.protocol.artifacts import NodeCache
from gpufleet.protocol.bounds import plausible_time, storable_time, without_nul
from gpufleet.protocol.inventory import NodeInventory
from gpufleet.protocol.jobs import JobAck, JobCancel, JobHeld, JobOutput, JobUpdate
from gpufleet.protocol.logs import LogLines
from gpufleet.protocol.messages import (
    CLOSE_BAD_MESSAGE,
    CLOSE_FORBIDDEN,
    CLOSE_TOO_LARGE,
    CLOSE_TRY_AGAIN,
    CLOSE_UNAUTHORIZED,
    CLOSE_UNSUPPORTED_DATA,
    MAX_CHANNEL_MESSAGE_BYTES,
    MAX_INVENTORY_BYTES,
    VALUE_ERRORS,
    AnyAgentMessage,
    Events,
    FaultResult,
    Heartbeat,
    Hello,
    JoinRequest,
    JoinResponse,
    Metrics,
    Welcome,
    agent_message_adapter,
)
from gpufleet.protocol.mig import MigResult
from gpufleet.protocol.software import SoftwareInventory
from gpufleet.protocol.topology import MAX_FABRIC_BYTES, IbFabric

log = logging.getLogger(__name__)
router = APIRouter(prefix="/agent", tags=["agent"])
HELLO_TIMEOUT_S = 10.0
# Reports a channel may have waiting for the database; an agent further ahead is asked to reconnect.
REPORTS_LIMIT = 256
RECORD_TRIES = 3  # attempts at a report the database refused for a moment, RECORD_RETRY_S, then twice that apart
RECORD_RETRY_S = 0.2
Report = JobOutput | JobUpdate | JobHeld | NodeCache | MigResult  # about its jobs, its cache, its MIG layouts
Reports = asyncio.Queue[JobUpdate | JobHeld | NodeCache | MigResult]
# What a node is told when it answered or reported for another node's command or rank; the audit record
# says which (the node is not told whose: it has no business knowing).
REFUSED = "refused: a message about another node's command or job; recorded in the audit log"
T = TypeVar("T")


@router.post("/join")
def join(body: JoinRequest, request: Request, ctx: Ctx) -> JoinResponse:
    """Trade a join token for this node's own credential. The token's use is spent only if all succeeds."""
    token = bearer_token(request.headers.get("authorization"))
    request.state.audit_target = body.name
    with tx(ctx) as db:
        spent = auth.consume_join_token(db, ctx.clock, token)
        request.state.actor = f"join-token#{spent.id}"
        node = inventory.join(db, ctx.clock, body.name)
        if body.inventory is not None:
            try:
                if inventory.apply_inventory(db, ctx.clock, node, body.inventory):
                    network.record_neighbors(db, ctx.clock, node.id, body.inventory.neighbors)
            except Conflict as exc:  # another live node's GPU or hostname: the audit record says whose
                request.state.audit_target = f"{body.name}: {exc}"
                raise
        if ctx.settings.burnin_admission:  # a new node takes no work before it passes the profile
            dirs = burnin.profile_dirs(ctx.settings.data_dir, ctx.settings.burnin_profiles_dir)
            workload = ctx.monitoring.judge.workload
            burnin.admit_on_join(db, ctx.clock, workload, node, ctx.settings.burnin_admission, dirs)
        credential = auth.issue_node_credential(db, ctx.clock, node.id, node.name)
    return JoinResponse(
        node_id=node.id,
        name=node.name,
        credential=credential,
        heartbeat_interval_s=ctx.settings.heartbeat_interval_s,
    )


@router.put("/inventory", status_code=204)
async def put_inventory(
    request: Request, caller: Annotated[Principal, allow(Permission.AGENT_REPORT)], ctx: Ctx
) -> None:
    """Replace the calling node's inventory. The node comes from the credential, never from the body."""
    raw = await request.body()
    if len(raw) > MAX_INVENTORY_BYTES:
        raise PayloadTooLarge(f"inventory larger than {MAX_INVENTORY_BYTES} bytes")

    def store() -> None:
        try:  # parsed off the event loop, as the software inventory is
            report = NodeInventory.model_validate_json(raw)
        except ValidationError as exc:
            raise InvalidInput(f"malformed inventory: {describe(exc)}") from None
        if caller.node_id is None:  # the node role is only ever a node credential's; be explicit anyway
            raise Unauthorized("not a node credential")
        try:
            with transaction(ctx.sessions) as session:
                if inventory.report_inventory(session, ctx.clock, caller.node_id, report):
                    network.record_neighbors(session, ctx.clock, caller.node_id, report.neighbors)
        except NotFound:
            raise Unauthorized("node no longer exists") from None
        except Conflict as exc:  # another live node's GPU or hostname: the audit record says whose
            request.state.audit_target = str(exc)
            raise

    await to_thread.run_sync(store)


@router.put("/software", status_code=204)
async def put_software(
    request: Request, caller: Annotated[Principal, allow(Permission.AGENT_REPORT)], ctx: Ctx
) -> None:
    """What the calling node runs now (packages, drivers, firmware); the head keeps one copy per
    distinct set and re-evaluates its findings when the set changed."""
    raw = await request.body()

    def store() -> None:
        # Parsed here, off the event loop: a package list runs to megabytes, and the loop reads heartbeats.
        try:
            report = SoftwareInventory.model_validate_json(raw)
        except ValidationError as exc:
            raise InvalidInput(f"malformed software inventory: {describe(exc)}") from None
        distro = Distro(report.distro_ecosystem, report.distro_release or "") if report.distro_ecosystem else None
        packages = [Installed(**p.model_dump()) for p in report.packages]
        if caller.node_id is None:
            raise Unauthorized("not a node credential")
        with transaction(ctx.sessions) as session:
            if session.get(Node, caller.node_id) is None:
                raise Unauthorized("node no longer exists")
            assets_store.report_software(session, ctx.clock, caller.node_id, distro, report.kernel, packages)

    await to_thread.run_sync(store)


@router.put("/fabric", status_code=204)
async def put_fabric(request: Request, caller: Annotated[Principal, allow(Permission.AGENT_REPORT)], ctx: Ctx) -> None:
    """The InfiniBand fabric the calling node's ibnetdiscover sees; it replaces that node's previous report.
    Bounded by MAX_FABRIC_BYTES (here and by the body size limit, before it is read)."""
    raw = await request.body()
    if len(raw) > MAX_FABRIC_BYTES:
        raise PayloadTooLarge(f"fabric larger than {MAX_FABRIC_BYTES} bytes")

    def store() -> None:
        # Parsed here, off the event loop: a large fabric is megabytes and seconds to validate.
        try:
            report = IbFabric.model_validate_json(raw)
        except ValidationError as exc:
            raise InvalidInput(f"malformed InfiniBand fabric: {describe(exc)}") from None
        if caller.node_id is None:
            raise Unauthorized("not a node credential")
        with transaction(ctx.sessions) as session:
            if session.get(Node, caller.node_id) is None:
                raise Unauthorized("node no longer exists")
            changed = fabric.record_fabric(session, ctx.clock, caller.node_id, report)
        request.state.audit_target = (
            f"{len(report.switches)} switches, {len(report.cas)} CAs, {len(report.links)} links"
            + ("" if changed else " (unchanged)")
        )

    await to_thread.run_sync(store)


def _open(ctx: Ctx, token: str) -> tuple[int, str, str | None]:
    who = authenticate(ctx, token)
    if who.kind is not TokenKind.NODE or who.node_id is None:
        raise Unauthorized("the agent channel needs a node credential")
    with transaction(ctx.sessions, readonly=True) as session:
        try:
            name, fingerprint = inventory.channel_identity(session, who.node_id)
        except NotFound:
            raise Unauthorized("node no longer exists") from None
        return who.node_id, name, fingerprint


@router.websocket("/channel")
async def channel(ws: WebSocket) -> None:
    """Heartbeats in, acknowledgements out. Closes with 44xx and the reason on any protocol error."""
    ctx: Ctx = ws.app.state.ctx
    await ws.accept()
    try:
        token = bearer_token(ws.headers.get("authorization"))
        node_id, name, fingerprint = await to_thread.run_sync(_open, ctx, token)
    except Unauthorized as exc:
        await ws.close(code=CLOSE_UNAUTHORIZED, reason=str(exc)[:120])
        return
    except GpufleetError as exc:
        # Not a refusal of the credential (the database busy or away during a reconnect storm): 4401 here
        # would send every agent to join again with its join token.
        await ws.close(code=CLOSE_TRY_AGAIN, reason=f"head busy, reconnect: {exc}"[:120])
        return
    chan = Channel(node_id=node_id, name=name, socket=ws, address=ws.client.host if ws.client else "")
    writer = asyncio.create_task(chan.write_forever())
    reports: Reports = asyncio.Queue(REPORTS_LIMIT)
    worker = asyncio.create_task(_record_forever(ctx, chan, reports))
    ctx.hub.register(chan)
    closing: tuple[int, str] | None = None
    try:
        closing = await _serve(ctx, ws, chan, fingerprint, reports)
    except TimeoutError:
        closing = (CLOSE_BAD_MESSAGE, "no heartbeat within ten intervals")
    except GpufleetError as exc:
        # A message the head could not record (the database stayed locked through a join storm): close,
        # so the agent reconnects and sends it again, rather than letting it escape to an HTTP error
        # handler that cannot answer on a WebSocket.
        log.warning("node %s: closing its channel: %s", name, exc)
        closing = (CLOSE_TRY_AGAIN, f"head busy, reconnect: {exc}")
    except (WebSocketDisconnect, RuntimeError):
        pass  # the agent went away, or this side closed the socket (node replaced or removed)
    finally:
        if ctx.hub.unregister(chan):
            ctx.monitoring.tracker.forget(node_id)  # another replica may hold the node now
        for task in (worker, writer):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    if closing is not None:
        with contextlib.suppress(Exception):
            await ws.close(code=closing[0], reason=closing[1][:120])


async def _serve(
    ctx: Ctx, ws: WebSocket, chan: Channel, fingerprint: str | None, reports: Reports
) -> tuple[int, str] | None:
    """Read the agent's messages until it goes; returns the close code and reason for a protocol error.

    Nothing here waits on the database: what must be written (job updates and held ranks, the cache
    report) goes to the channel's `reports` queue, in order, for `_record_forever`; all of these the agent
    sends again after a reconnect until acknowledged. A read loop that awaited a write
    stopped reading this node's heartbeats for as long as the write queued behind a join storm's
    inventories (seconds), and a live node was marked down with its heartbeats sitting unread.

    What the head stores is checked here, at the edge (protocol.bounds): a message with a number out of
    bounds is dropped whole, an item with an implausible time alone, and the channel stays open; so no
    batch write of samples or lines can fail on what one node sent."""
    interval: float | None = None
    while True:
        timeout = HELLO_TIMEOUT_S if interval is None else max(interval * 10, HELLO_TIMEOUT_S)
        # asyncio.timeout, not wait_for: no task and future per message at 1,000 messages a second.
        async with asyncio.timeout(timeout):
            text = await _receive_text(ws)
        message = _parse(chan, text)
        if message is None:
            continue  # dropped: a number out of bounds
        if isinstance(message, tuple):
            return message
        if isinstance(message, FaultResult):  # may come before hello: a simulated crashed node says none
            try:
                ctx.hub.command_answered(chan.node_id, message)
            except Forbidden as exc:
                await _refused(ctx, chan, message.type, str(exc))
                return CLOSE_FORBIDDEN, REFUSED
        elif isinstance(message, Hello):
            interval = message.heartbeat_interval_s
            wanted = message.inventory_fingerprint is None or message.inventory_fingerprint != fingerprint
            chan.send(Welcome(node=chan.name, inventory_wanted=wanted).model_dump_json())
            ctx.loops.book.record(chan.node_id, ctx.clock.now(), interval, 0)
        elif interval is None:
            return CLOSE_BAD_MESSAGE, f"{message.type} before hello"
        elif not _handle(ctx, chan, message, interval, reports):
            return CLOSE_TRY_AGAIN, f"head busy: {REPORTS_LIMIT} reports wait to be recorded; reconnect"


def _parse(chan: Channel, text: str | None) -> AnyAgentMessage | tuple[int, str] | None:
    """The message in a frame; a close code and reason for a frame that is not one; None for a message
    dropped for a number out of bounds (the channel stays open)."""
    if text is None:
        return CLOSE_UNSUPPORTED_DATA, "binary frame: the agent channel carries JSON in text frames"
    if len(text) > MAX_CHANNEL_MESSAGE_BYTES:
        return CLOSE_TOO_LARGE, "message too large"
    try:
        return agent_message_adapter.validate_json(without_nul(text))
    except ValidationError as exc:
        if not _out_of_bounds_only(exc):
            return CLOSE_BAD_MESSAGE, f"malformed message: {describe(exc)}"
        _dropped(chan, f"a message with a number out of bounds: {describe(exc)}")
        return None


def _handle(ctx: Ctx, chan: Channel, message: AnyAgentMessage, interval: float, reports: Reports) -> bool:
    """Hand a message after the hello on, keeping only the items whose times the head stores. False when
    `reports` is full (the agent is asked to reconnect)."""
    now = ctx.clock.now()
    if isinstance(message, Heartbeat):
        ctx.loops.book.record(chan.node_id, now, interval, message.seq)
    elif isinstance(message, Metrics):
        if samples := _in_time(chan, message.samples, lambda s: (s.ts,), now, "sample"):
            ctx.monitoring.ingest(chan.node_id, samples)
    elif isinstance(message, Events):
        if events := _in_time(chan, message.events, lambda e: (e.ts,), now, "event"):
            ctx.monitoring.events(chan.node_id, events)
    elif isinstance(message, LogLines):
        if lines := _in_time(chan, message.lines, lambda line: (line.ts,), now, "log line"):
            ctx.monitoring.log_lines(chan.node_id, lines)
    elif isinstance(message, NodeCache):
        entries = _in_time(
            chan, message.entries, lambda e: (e.copied_at, e.last_used_at), now, "cache entry", storable_time
        )
        return _take(ctx, chan, message.model_copy(update={"entries": entries}), reports)
    elif isinstance(message, JobOutput | JobUpdate | JobHeld | MigResult):
        return _take(ctx, chan, message, reports)
    return True


async def _receive_text(ws: WebSocket) -> str | None:
    """The next frame's text; None for a binary frame. Raises WebSocketDisconnect once the agent went."""
    frame = await ws.receive()
    if frame["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(frame.get("code", 1000), frame.get("reason"))
    text = frame.get("text")
    return text if isinstance(text, str) else None


def _out_of_bounds_only(exc: ValidationError) -> bool:
    """Whether a message failed only on numbers out of bounds (protocol.messages.VALUE_ERRORS), and is not
    a hello: a channel opens only on a valid hello."""
    errors = exc.errors()
    return all(e["type"] in VALUE_ERRORS and e["loc"][:1] != ("hello",) for e in errors)


def _in_time(
    chan: Channel,
    items: list[T],
    times: Callable[[T], Iterable[float]],
    now: float,
    what: str,
    keep: Callable[[float, float], bool] = plausible_time,
) -> list[T]:
    """The items whose times the head stores (protocol.bounds: `plausible_time`, or `keep`); the others are
    dropped."""
    kept = [item for item in items if all(keep(ts, now) for ts in times(item))]
    if len(kept) < len(items):
        why = "timed before 2000 or over a day ahead of the head" if keep is plausible_time else "timed past year 9999"
        _dropped(chan, f"{len(items) - len(kept)} {what}(s) {why}")
    return kept


def _dropped(chan: Channel, what: str) -> None:
    """Count a drop; say so once per channel (a node sending nothing else would flood the log)."""
    chan.dropped += 1
    level = logging.WARNING if chan.dropped == 1 else logging.DEBUG
    log.log(level, "node %s: dropped %s (further drops on this channel are logged at debug level)", chan.name, what)


async def _refused(ctx: Ctx, chan: Channel, message_type: str, target: str) -> None:
    """Record in the audit log that node `chan` sent a `message_type` about another node's `target`."""
    log.warning("node %s sent %s about %s: refused, closing its channel", chan.name, message_type, target)

    def write() -> None:
        with transaction(ctx.sessions) as session:
            audit.record(
                session,
                ctx.clock,
                actor=f"node:{chan.name}",
                action=f"agent.channel.{message_type}",
                target=target,
                source=chan.address,
                result=403,
            )

    try:
        await to_thread.run_sync(write)
    except Exception:  # the refusal stands; losing its record must be loud, not fatal
        log.exception("could not write the audit record of node %s's refused %s", chan.name, message_type)


def _take(ctx: Ctx, chan: Channel, message: Report, reports: Reports) -> bool:
    """Hand a job or cache message on without waiting; False when `reports` is full (the agent re-sends
    what was not acknowledged once it reconnects)."""
    if isinstance(message, JobOutput):
        # Straight into the output buffer, as it arrives: the agent does not send output twice, so it must
        # not wait in `reports` (dropped with the channel), and the buffer write never blocks.
        ctx.jobs.output(chan.node_id, message)
        return True
    try:
        reports.put_nowait(message)
    except asyncio.QueueFull:
        return False
    return True


async def _record_forever(ctx: Ctx, chan: Channel, reports: Reports) -> None:
    """Record a channel's reports one at a time, in the order they came. A report the database refused for
    a moment (a deadlock, a lock held by a process that just died) is tried again in place: closing the
    channel would cost a reconnect, whose handshake needs the same database, and a thousand of those at
    once starve the heartbeats. One still unrecorded after RECORD_TRIES closes the channel, so the agent
    reconnects and sends it again."""
    while True:
        message = await reports.get()
        try:
            for attempt in range(RECORD_TRIES):
                try:
                    await _record(ctx, chan, message)
                    break
                except Unavailable:
                    if attempt == RECORD_TRIES - 1:
                        raise
                    await asyncio.sleep(RECORD_RETRY_S * 2**attempt)
        except Forbidden as exc:  # about another node's rank: nothing was recorded
            await _refused(ctx, chan, message.type, str(exc))
            chan.close(CLOSE_FORBIDDEN, REFUSED)
            return
        except GpufleetError as exc:
            log.warning("node %s: closing its channel: %s", chan.name, exc)
            chan.close(CLOSE_TRY_AGAIN, f"head busy, reconnect: {exc}"[:120])
            return
        except Exception:  # a bug must not leave the channel open with nobody recording its reports
            log.exception("node %s: recording its %s failed; closing its channel", chan.name, message.type)
            chan.close(CLOSE_TRY_AGAIN, "head error while recording a report, reconnect")
            return


async def _record(ctx: Ctx, chan: Channel, message: JobUpdate | JobHeld | NodeCache | MigResult) -> None:
    threads = ctx.hub.report_threads
    if isinstance(message, MigResult):
        await to_thread.run_sync(ctx.jobs.record_mig, chan.node_id, message, limiter=threads)
    elif isinstance(message, NodeCache):
        await to_thread.run_sync(ctx.jobs.record_cache, chan.node_id, message, limiter=threads)
    elif isinstance(message, JobUpdate):
        # Acknowledged once durable, so the agent forgets a rank's end only when the head has it.
        await to_thread.run_sync(ctx.jobs.record_update, chan.node_id, message, limiter=threads)
        if message.state == "exited":
            chan.send(JobAck(job_id=message.job_id, run=message.run, rank=message.rank).model_dump_json())
    else:
        for stray in await to_thread.run_sync(ctx.jobs.record_held, chan.node_id, message, limiter=threads):
            stop = JobCancel(job_id=stray.job_id, run=stray.run, rank=stray.rank, reason="not a live rank of this node")
            chan.send(stop.model_dump_json())


@router.get(
    "/accounts",
    response_model=AccountList,
    # An account without a home of its own is sent without the field, as before it existed: an agent older
    # than the field (its Account forbids unknown keys) still reads the list.
    response_model_exclude_none=True,
    responses={304: {"description": "not modified: the accounts still have the version named in If-None-Match"}},
)
def get_accounts(
    response: Response,
    _: Annotated[Principal, allow(Permission.AGENT_REPORT)],
    ctx: Ctx,
    if_none_match: Annotated[str | None, Header(max_length=4096)] = None,
) -> AccountList | Response:
    """The cluster users' accounts for the calling node to apply (`accounts_sync`), with the list's
    version as ETag. A node that sends the version it holds in If-None-Match gets an empty 304, so a
    thousand nodes polling cost a read each and no transfer."""
    with tx(ctx, readonly=True) as db:
        listing = users.accounts_for_nodes(db)
    etag = f'"{listing.version}"'
    if conditional.not_modified(if_none_match, etag):
        return Response(status_code=304, headers={"ETag": etag})
    response.headers["ETag"] = etag
    return listing
