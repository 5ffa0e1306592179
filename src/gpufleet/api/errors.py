"""The one place that maps the error tree to HTTP responses."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from gpufleet.core.errors import GpufleetError, Unauthorized


def install(app: FastAPI) -> None:
    @app.exception_handler(GpufleetError)
    async def _gpufleet_error(_request: Request, exc: GpufleetError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthorized) else None
        return JSONResponse({"detail": str(exc)}, status_code=exc.http_status, headers=headers)
