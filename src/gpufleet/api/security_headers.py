"""Security headers on every answer of the head: pages, API, static files, errors and proxied services.

The dashboard's own code satisfies the Content-Security-Policy as it stands: every script is a file
under /static (no inline script, no event-handler attribute, no `eval`: htmx's `hx-on` and trigger
filters are not used), every style is in a stylesheet (no `<style>`, no `style=` attribute: the GPU
map shades its cells by class; htmx's own indicator style is turned off in base.html). So neither
scripts nor styles need 'unsafe-inline'; what another page's injected markup could run is nothing.

The middleware sets the headers itself, over any of the same name a route (or an inference service
behind /services/) answered with: a service cannot loosen the policy of the head's origin.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)
HEADERS: dict[bytes, bytes] = {
    b"content-security-policy": CONTENT_SECURITY_POLICY.encode(),
    b"x-frame-options": b"DENY",  # frame-ancestors for browsers that predate it
    b"x-content-type-options": b"nosniff",
    b"referrer-policy": b"no-referrer",  # URLs carry node names, job ids and hostlists
    b"cross-origin-opener-policy": b"same-origin",
}


class SecurityHeaders:
    """ASGI middleware: HEADERS on every HTTP response, replacing any of the same name."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(name, value) for name, value in message.get("headers", []) if name.lower() not in HEADERS]
                message = {**message, "headers": [*kept, *HEADERS.items()]}
            await send(message)

        await self.app(scope, receive, with_headers)
