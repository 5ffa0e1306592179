"""The one place that maps the error tree to HTTP responses."""

from __future__ import annotations

import math

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
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

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        """422 with where and why only. FastAPI's own answer also echoes each error's `input` (and
        `ctx`): a whole request body, secrets and all (a BMC's password), back to the client and any
        log or terminal that prints the answer."""
        errors = [{key: error.get(key) for key in ("loc", "msg", "type")} for error in exc.errors()]
        return JSONResponse({"detail": jsonable_encoder(errors)}, status_code=422)
