"""What the daemon asks of a check source, and the limits every check result keeps to."""

from __future__ import annotations

from typing import Literal, Protocol

from pydantic import TypeAdapter, ValidationError

from gpufleet.protocol.metrics import CheckName, CheckResult, Sample


def _max_length(field: str) -> int:
    """The max_length the protocol sets on a Sample field, so the agent and the head never disagree."""
    for rule in Sample.model_fields[field].metadata:
        if isinstance(getattr(rule, "max_length", None), int):
            return int(rule.max_length)
    raise LookupError(f"Sample.{field} has no max_length")


MAX_CHECKS = _max_length("checks")
MAX_MESSAGE_CHARS = 256  # CheckResult.message's limit

Status = Literal[0, 1, 2]
PASS: Status = 0
FAIL: Status = 1
WARN: Status = 2


class CheckSource(Protocol):
    """The node's checks, run every `checks_interval_s` by the daemon in a worker thread."""

    def run(self) -> list[CheckResult]:
        """One round of every check, blocking until each finished or timed out. Raises nothing on purpose:
        a check that cannot run is a result with status 2, not an exception."""
        ...


_CHECK_NAME: TypeAdapter[str] = TypeAdapter(CheckName)


def valid_name(name: str) -> bool:
    """Whether the protocol accepts `name` as a check name."""
    try:
        _CHECK_NAME.validate_python(name)
    except ValidationError:
        return False
    return True


def clean_line(text: str) -> str:
    """One line fit for a check message: control characters (ANSI colours, tabs) become spaces,
    trimmed to the protocol's 256 characters."""
    return "".join(ch if ch.isprintable() else " " for ch in text).strip()[:MAX_MESSAGE_CHARS]


def result(name: str, status: Status, message: str = "") -> CheckResult:
    """A CheckResult with its message cleaned and trimmed. Raises pydantic.ValidationError for a name
    the protocol refuses (callers validate names first)."""
    return CheckResult(name=name, status=status, message=clean_line(message))
