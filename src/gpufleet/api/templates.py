"""The Jinja2 templates of the web pages and their static files, both from the gpufleet/web package.

Static files are served at /static (see `api.app`); templates link to them through `static_url`,
which adds a hash of the file's content, so a browser never keeps an old htmx or stylesheet after
an upgrade while the files themselves may be cached for a long time.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi.staticfiles import StaticFiles as _StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.responses import Response
from starlette.types import Scope

WEB = Path(__file__).resolve().parents[1] / "web"
STATIC_DIR = WEB / "static"
VENDOR_FILES = ("vendor/htmx.min.js", "vendor/uPlot.iife.min.js", "vendor/uPlot.min.css")


@functools.cache
def static_url(name: str) -> str:
    """The URL of a file under web/static with a version query from its content (read once per process).

    A missing file (the front-end packages not copied in: `make assets`) gets no version, and answers 404.
    """
    path = STATIC_DIR / name
    try:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    except OSError:
        return f"/static/{name}"
    return f"/static/{name}?v={digest}"


def missing_vendor_files() -> list[str]:
    """The front-end packages' files that `make assets` has not copied into the package."""
    return [name for name in VENDOR_FILES if not (STATIC_DIR / name).is_file()]


def urlencode_with(query: dict[str, str], **changes: Any) -> str:
    """`query` as a query string with some parameters changed (a sortable column's link)."""
    return urlencode({**query, **{k: str(v) for k, v in changes.items()}})


TEMPLATES = Jinja2Templates(directory=str(WEB / "templates"))
TEMPLATES.env.globals["static_url"] = static_url
TEMPLATES.env.filters["urlencode_with"] = urlencode_with


class StaticFiles(_StaticFiles):
    """Starlette's static files, kept by browsers for a year when asked for by a versioned URL."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        if response.status_code == 200 and b"v=" in scope.get("query_string", b""):
            response.headers["Cache-Control"] = "public, max-age=31536000, immutable"
        return response
