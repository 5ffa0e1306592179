"""The one place that maps the error tree to HTTP responses."""

from __future__ import annotations

import math

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from gpufleet.core.errors import GpufleetError, TooManyRequests, Unauthorized


def install(app: FastAPI) -> None:
    @app.exception_handler(GpufleetError)
    async def _gpufleet_error(_request: Request, exc: GpufleetError) -> JSONResponse:
        headers: dict[str, str] | None = None
        if isinstance(exc, Unauthorized):
            headers = {"WWW-Authenticate": "Bearer"}
        elif isinstance(exc, TooManyRequests):
            headers = {"Retry-After": str(math.ceil(exc.retry_after_s))}
        return JSONResponse({"detail": str(exc)}, status_code=exc.http_status, headers=headers)
