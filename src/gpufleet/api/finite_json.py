"""JSON request bodies hold finite numbers only: `NaN`, `Infinity` and `-Infinity` are refused (400).

They are no JSON (RFC 8259 has no such numbers), but Python's `json.loads`, which FastAPI parses
bodies with, takes them, and a pydantic `float` field takes the float it makes. Let in, a NaN
threshold compares false with everything (an alert rule that never fires, which the API then
answered with a misleading 409), and an Infinity is stored as `null` or breaks a PostgreSQL JSON
column. Refused here, once, before any route: no schema or hand-read body can forget to.

Only bodies that hold one of the words are parsed a second time, so the cost on every other body is
a byte search.
"""

from __future__ import annotations

import json
from typing import NoReturn

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpufleet.core.errors import InvalidInput

_CONSTANTS = (b"NaN", b"Infinity")


class _NotFinite(Exception):
    def __init__(self, constant: str) -> None:
        super().__init__(constant)
        self.constant = constant


def _refuse(constant: str) -> NoReturn:
    raise _NotFinite(constant)


def is_json(scope: Scope) -> bool:
    """Whether FastAPI would parse this request's body as JSON: `application/json` or `application/*+json`."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            media: bytes = value.split(b";", 1)[0].strip().lower()
            return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))
    return False


def non_finite(body: bytes) -> str | None:
    """The first NaN, Infinity or -Infinity in a JSON document, or None. A word inside a string is
    text, not a number; a body that is no JSON at all is left to FastAPI's own answer."""
    try:
        # json.loads detects UTF-16 and UTF-32 as FastAPI's parse does: search the text, not the bytes.
        text = body.decode(json.detect_encoding(body)) if body[:4].count(0) else body
    except UnicodeDecodeError:
        return None  # the route's parser refuses it too
    if isinstance(text, bytes):
        if not any(constant in text for constant in _CONSTANTS):
            return None
    elif not any(constant.decode() in text for constant in _CONSTANTS):
        return None
    try:
        json.loads(text, parse_constant=_refuse)
    except _NotFinite as found:
        return found.constant
    except (ValueError, RecursionError):  # not JSON, or nested past the parser: the route's parser says so
        return None
    return None


class FiniteJsonBodies:
    """ASGI middleware: a JSON body holding a non-finite number is answered 400 before any route runs.
    Placed inside the body size limit, so the body it reads is already bounded."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_json(scope):
            await self.app(scope, receive, send)
            return
        body = bytearray()
        last: Message | None = None
        while True:
            message = await receive()
            if message["type"] != "http.request":
                last = message  # the client went away: let the route see it
                break
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        constant = non_finite(bytes(body)) if last is None else None
        if constant is not None:
            await _answer(send, f"the request body holds {constant}: JSON numbers must be finite")
            return
        replay: list[Message] = [{"type": "http.request", "body": bytes(body), "more_body": False}]
        if last is not None:
            replay.append(last)

        async def replayed() -> Message:
            return replay.pop(0) if replay else await receive()

        await self.app(scope, replayed, send)


async def _answer(send: Send, detail: str) -> None:
    content = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": InvalidInput.http_status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": content})
