"""Routers that skip a request at once when none of their routes can match its path.

FastAPI matches a request against every route in order, and an included router against each of its
routes, two or three times per request (to find the route, then to handle it). With some 150 API routes
and the dashboard's behind them, that scan alone cost about 0.5 ms of CPU per request before any work
(measured for a 404: 770 µs, 280 µs with this index). An `IndexedRouter` knows the literal start of each
of its routes' paths (the part before the first `{`); a path that contains none of them cannot match any
route of the router, so it answers NONE without looking at them. It is a necessary condition only: the
routes still decide, so a path that passes behaves exactly as before.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.routing import Match
from starlette.types import Scope


def _literal_heads(router: APIRouter) -> frozenset[str] | None:
    """The literal starts of the router's route paths, or None where one cannot be known (a route
    without a path, or one that starts with a parameter): then the router is always scanned."""
    heads = set()
    for route in router.routes:
        path = getattr(route, "path", None)
        if not isinstance(path, str):
            return None
        head = path.split("{", 1)[0]
        if not head or head == "/":
            return None
        heads.add(head)
    return frozenset(heads)


class IndexedRouter(APIRouter):
    """An APIRouter that includes one router (`over`) or is itself a prefix (`prefix`), and answers
    NONE for a path that cannot reach any of its routes."""

    def __init__(self, *, heads: frozenset[str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        prefix = kwargs.get("prefix")
        self._heads = heads if heads is not None else (frozenset({prefix}) if prefix else None)

    @classmethod
    def over(cls, router: APIRouter) -> IndexedRouter:
        """`router`'s routes behind an index of their paths' literal starts."""
        indexed = cls(heads=_literal_heads(router))
        indexed.include_router(router)
        return indexed

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if self._heads is not None:
            path = scope.get("path", "")  # the full path: it contains every literal of a matching route
            if not any(head in path for head in self._heads):
                return Match.NONE, {}
        return super().matches(scope)
