"""The head's side of the agent channel, in-process: welcome, acks, a record of every message, commands out.

Speaks the protocol through the same pydantic models as the real head, over a real WebSocket on
loopback, so the agent under test runs its real channel code.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TypeVar

from pydantic import BaseModel
from websockets.asyncio.server import Server, ServerConnection, serve

from gpufleet.protocol.messages import (
    CLOSE_UNAUTHORIZED,
    MAX_CHANNEL_MESSAGE_BYTES,
    Ack,
    AnyAgentMessage,
    Heartbeat,
    Hello,
    Welcome,
    agent_message_adapter,
)

M = TypeVar("M", bound=BaseModel)


class FakeHead:
    def __init__(self, inventory_wanted: bool = False, credentials: set[str] | None = None) -> None:
        self.inventory_wanted = inventory_wanted
        # The node credentials it knows (None: any): others are refused as the real head refuses them.
        self.credentials = credentials
        self.presented: list[str] = []  # the credential of every channel opened, in order
        self.messages: list[AnyAgentMessage] = []
        self.sizes: list[int] = []
        self.connection: ServerConnection | None = None
        self._server: Server | None = None

    async def start(self, port: int = 0) -> int:
        """Listen on 127.0.0.1 (a free port by default); return the port."""
        self._server = await serve(self._handle, "127.0.0.1", port, max_size=MAX_CHANNEL_MESSAGE_BYTES)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        token = ws.request.headers.get("Authorization", "").removeprefix("Bearer ")
        self.presented.append(token)
        if self.credentials is not None and token not in self.credentials:
            await ws.close(CLOSE_UNAUTHORIZED, "unknown token")
            return
        hello = agent_message_adapter.validate_json(await ws.recv())
        assert isinstance(hello, Hello)
        await ws.send(Welcome(node="n1", inventory_wanted=self.inventory_wanted).model_dump_json())
        self.connection = ws
        with contextlib.suppress(Exception):
            async for raw in ws:
                self.sizes.append(len(raw))
                message = agent_message_adapter.validate_json(raw)
                self.messages.append(message)
                if isinstance(message, Heartbeat):
                    await ws.send(Ack(seq=message.seq).model_dump_json())

    async def send(self, message: BaseModel) -> None:
        assert self.connection is not None
        await self.connection.send(message.model_dump_json())

    def of(self, kind: type[M]) -> list[M]:
        return [m for m in self.messages if isinstance(m, kind)]

    async def until(self, condition: Callable[[], object], seconds: float = 5.0) -> None:
        """Wait until `condition()` holds; fail the test after `seconds`."""
        async with asyncio.timeout(seconds):
            while True:  # polled: the agent under test has no hook to signal on
                if condition():
                    return
                await asyncio.sleep(0.01)
