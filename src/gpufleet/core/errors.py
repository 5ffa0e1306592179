"""The one error tree. The API maps each class to an HTTP status in one place, the CLI to an exit code."""

from __future__ import annotations

from pydantic import ValidationError


def describe(exc: ValidationError, default_where: str = "") -> str:
    """The first problem of a pydantic error as one line: `field.path: message`."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or default_where
    return f"{where}: {first['msg']}" if where else str(first["msg"])


class GpufleetError(Exception):
    """Base of every error gpufleet raises on purpose; its message is meant for the user."""

    http_status = 500
    exit_code = 1


class InvalidInput(GpufleetError):
    """The request or command is malformed (bad hostlist, bad value). 400, not 422: 422 is FastAPI's
    schema-validation answer, with its own documented body shape."""

    http_status = 400
    exit_code = 2


class NotFound(GpufleetError):
    http_status = 404
    exit_code = 3


class Conflict(GpufleetError):
    """The change clashes with what exists (duplicate name, wrong state)."""

    http_status = 409
    exit_code = 4


class Unauthorized(GpufleetError):
    """No credential, or one that is unknown, expired, revoked or used up."""

    http_status = 401
    exit_code = 5


class Forbidden(GpufleetError):
    """A valid credential that may not do this."""

    http_status = 403
    exit_code = 6


class TooManyRequests(GpufleetError):
    """The caller must wait before trying again (e.g. after repeated failed logins)."""

    http_status = 429
    exit_code = 5

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class PayloadTooLarge(GpufleetError):
    http_status = 413
    exit_code = 2


class Unavailable(GpufleetError):
    """A service gpufleet depends on (the head node, the database) cannot be reached."""

    http_status = 503
    exit_code = 7


class BadGateway(GpufleetError):
    """Something gpufleet forwards to (an inference service's replica) failed the call or timed out."""

    http_status = 502
    exit_code = 7


class ConfigError(GpufleetError):
    """The configuration file or environment holds an invalid value."""

    exit_code = 2
