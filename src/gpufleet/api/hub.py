"""Live agent channels on this replica, and the delivery of acknowledgements to them.

Each channel has an outbox drained by its own writer task, so the flush loop never waits on a
slow agent's socket.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from anyio import CapacityLimiter
from starlette.websockets import WebSocket

from gpufleet.core.errors import Conflict, Forbidden
from gpufleet.inventory.liveness import Receipt
from gpufleet.protocol.messages import CLOSE_REPLACED, Ack, FaultResult
from gpufleet.protocol.metrics import FaultCommand

OUTBOX_LIMIT = 64
# Threads recording the channels' reports (job updates, held ranks, cache), apart from the request threads:
# however many reports wait on a slow database, an agent's reconnect (its credential checked on a request
# thread) never queues behind them.
REPORT_THREADS = 2


@dataclass(eq=False)
class Channel:
    node_id: int
    name: str
    socket: WebSocket
    address: str = ""  # the agent's address, for the audit records of what the head refused from it
    dropped: int = 0  # messages or items the head dropped for out-of-bounds numbers or times
    outbox: asyncio.Queue[str | tuple[int, str]] = field(default_factory=lambda: asyncio.Queue(OUTBOX_LIMIT))

    def send(self, text: str) -> None:
        with contextlib.suppress(asyncio.QueueFull):  # an agent this far behind gets its acks later
            self.outbox.put_nowait(text)

    def close(self, code: int, reason: str) -> None:
        # A close must never be dropped: make room by discarding pending acks, which no longer matter.
        while self.outbox.full():
            self.outbox.get_nowait()
        self.outbox.put_nowait((code, reason))

    async def write_forever(self) -> None:
        while True:
            item = await self.outbox.get()
            if isinstance(item, tuple):
                await self.socket.close(code=item[0], reason=item[1])
                return
            await self.socket.send_text(item)


class ChannelHub:
    """Open channels by node id. Touched only from the event loop's thread."""

    def __init__(self) -> None:
        self._channels: dict[int, Channel] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        # Commands waiting for their answer, by id: the node each was sent to (id, name), the answer's future.
        self._commands: dict[int, tuple[int, str, asyncio.Future[FaultResult]]] = {}
        self.report_threads: CapacityLimiter | None = None  # set by `bind`, in the serving loop

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.report_threads = CapacityLimiter(REPORT_THREADS)

    def __len__(self) -> int:
        return len(self._channels)

    def register(self, channel: Channel) -> None:
        old = self._channels.get(channel.node_id)
        if old is not None:
            old.close(CLOSE_REPLACED, "replaced by a newer connection of the same node")
        self._channels[channel.node_id] = channel

    def unregister(self, channel: Channel) -> bool:
        """Forget `channel`; False if a newer channel of the node had already replaced it."""
        if self._channels.get(channel.node_id) is channel:
            del self._channels[channel.node_id]
            return True
        return False

    def node_ids(self) -> list[int]:
        return list(self._channels)

    def send(self, node_id: int, text: str) -> None:
        """Send a message down a node's channel if this replica holds it (from the event loop's thread)."""
        channel = self._channels.get(node_id)
        if channel is not None:
            channel.send(text)

    def send_threadsafe(self, node_id: int, text: str) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.send, node_id, text)

    def command(self, node_id: int, command: FaultCommand) -> asyncio.Future[FaultResult]:
        """Send a command down a node's channel; the future gets the agent's answer. Raises Conflict
        when this replica holds no channel of the node."""
        channel = self._channels.get(node_id)
        if channel is None:
            raise Conflict("the node has no open channel to this head (is its agent running?)")
        future: asyncio.Future[FaultResult] = asyncio.get_running_loop().create_future()
        self._commands[command.id] = (node_id, channel.name, future)
        future.add_done_callback(lambda _f: self._commands.pop(command.id, None))
        channel.send(command.model_dump_json())
        return future

    def command_answered(self, node_id: int, result: FaultResult) -> None:
        """Hand node `node_id`'s answer to the command waiting for it. An answer to no waiting command (one
        that timed out) is dropped. Raises Forbidden, taking nothing, when the command was sent to another
        node: ids are small and sequential, so any node could name another's."""
        waiting = self._commands.get(result.id)
        if waiting is None:
            return
        sent_to, name, future = waiting
        if sent_to != node_id:
            raise Forbidden(f"fault command {result.id} of node {name}")
        if not future.done():
            future.set_result(result)

    def acknowledge(self, receipts: dict[int, Receipt]) -> None:
        """Called from the flush thread once receipts are durable; hands the acks to the event loop."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._deliver, receipts)

    def _deliver(self, receipts: dict[int, Receipt]) -> None:
        for node_id, receipt in receipts.items():
            channel = self._channels.get(node_id)
            if channel is not None:
                channel.send(Ack(seq=receipt.seq).model_dump_json())

    def disconnect(self, node_ids: list[int], code: int, reason: str) -> None:
        """Close these nodes' channels (callable from any thread, e.g. a route removing nodes)."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._disconnect, node_ids, code, reason)

    def _disconnect(self, node_ids: list[int], code: int, reason: str) -> None:
        for node_id in node_ids:
            channel = self._channels.get(node_id)
            if channel is not None:
                channel.close(code, reason)
