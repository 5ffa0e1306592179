"""JSON answers with an `ETag`, and `304 Not Modified` for a client that already holds them.

Scripts, the CLI and monitoring systems poll the list endpoints (nodes, GPUs, jobs, alerts, events) every
few seconds. A list answered from plain rows costs the head milliseconds, and a repeat whose answer has not
changed costs it the read and a hash: no serialisation and nothing sent but the status line.

`answer(request, rows)` hashes the body it sends (a strong validator). A list whose rows carry a value that
moves without anything happening worth a new copy (a live node's heartbeat time) passes `version=`: what
the validator is computed over instead. That validator is weak (`W/"..."`, RFC 9110 8.8.1): the answers it
stands for are equivalent, not identical, so a client holding one copy may keep using it. If-None-Match
compares weakly, as RFC 9110 13.1.2 requires, so strong and weak tags both match.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import pydantic_core
from fastapi import Request
from fastapi.responses import Response

# The client must ask again every time (no-cache), and gets a 304 when its copy is current; "private":
# lists are read with a credential, so no shared cache may keep them.
CACHE_CONTROL = "private, no-cache"
_SAME = object()


def _tag(data: bytes, *, weak: bool) -> str:
    digest = hashlib.blake2b(data, digest_size=16).hexdigest()
    return f'W/"{digest}"' if weak else f'"{digest}"'


def _opaque(tag: str) -> str:
    """The tag without its weakness indicator: If-None-Match compares tags weakly."""
    return tag[2:] if tag.startswith("W/") else tag


def not_modified(if_none_match: str | None, tag: str) -> bool:
    """Whether an If-None-Match header names `tag` (or is `*`). Malformed members simply do not match."""
    if not if_none_match:
        return False
    wanted = _opaque(tag)
    for raw in if_none_match.split(","):
        member = raw.strip()
        if member == "*" or _opaque(member) == wanted:
            return True
    return False


def answer(
    request: Request,
    content: Any,
    *,
    version: Any = _SAME,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """`content` as JSON with its ETag, or a bodiless 304 when the request's If-None-Match holds the tag.

    `content` is anything pydantic serialises (dicts and lists of plain values, datetimes, enums, models).
    With `version`, the tag is weak and computed over `version` alone, before the body is built, so a 304
    costs no serialisation at all.
    """
    extra = dict(headers or {})
    if version is _SAME:
        body = pydantic_core.to_json(content)
        tag = _tag(body, weak=False)
    else:
        tag = _tag(pydantic_core.to_json(version), weak=True)
        body = b""
    cache = {"ETag": tag, "Cache-Control": CACHE_CONTROL}
    if not_modified(request.headers.get("if-none-match"), tag):
        return Response(status_code=304, headers=cache | extra)
    if version is not _SAME:
        body = pydantic_core.to_json(content)
    return Response(body, media_type="application/json", headers=cache | extra)
