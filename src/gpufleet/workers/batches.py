"""Batched writes that one bad row cannot sink.

The head writes what agents send in batches (metric samples, log lines, jobs' output): one transaction
for thousands of rows from hundreds of nodes. A row the database refuses (a NULL where a column needs a
value, a number past a column, a NUL in PostgreSQL text) fails the whole statement; retrying the batch
fails again, and dropping it loses every other node's rows with it. The channel checks what it takes
(protocol.bounds), so a refused row is a gap in that check or a bug: `write_isolating` finds such rows
by bisection (the halves of a failing batch are written apart, down to single rows), drops only those,
and writes the rest. k bad rows among n cost about 2·k·log2(n) extra transactions.

A database that is away (`Unavailable`: unreachable, or locked for too long) is no row's fault: it is
raised at once, for the caller to keep its rows for the next flush or give them up as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.db import transaction
from gpufleet.core.errors import Unavailable

log = logging.getLogger(__name__)
T = TypeVar("T")
# Single rows refused in one flush before the rest of what fails is given up whole: a bug that fails every
# row must not cost two transactions per row of a 60,000-row flush.
MAX_ISOLATED = 32


@dataclass
class Written(Generic[T]):
    """What a batched write did: the rows stored and those refused (dropped)."""

    stored: list[T] = field(default_factory=list)
    refused: list[T] = field(default_factory=list)
    first_error: str | None = None  # the database's reason for the first refusal, for the log


def write_isolating(
    sessions: sessionmaker[Session],
    rows: Sequence[T],
    write: Callable[[Session, list[T]], object],
    *,
    prune: Callable[[Session, list[T]], list[T]] | None = None,
    what: str = "rows",
) -> Written[T]:
    """Write `rows` with `write` in one transaction; if it fails, write them apart, dropping only the
    rows the database refuses. `prune` (in a transaction of its own, after a first failure) may drop rows
    the caller knows to be stale (those of nodes removed while they waited), silently. Raises
    Unavailable when the database is away, having written nothing more."""
    result: Written[T] = Written()
    batch = list(rows)
    if not batch:
        return result
    try:
        _write(sessions, batch, write)
    except Unavailable:
        raise
    except Exception as exc:  # any refusal: the rows are written apart to find whose
        result.first_error = _reason(exc)
        if prune is not None:
            with transaction(sessions, readonly=True) as session:
                batch = prune(session, batch)
        _bisect(sessions, batch, write, result)
        _report(result, len(rows), what)
    else:
        result.stored = batch
    return result


def _bisect(
    sessions: sessionmaker[Session], rows: list[T], write: Callable[[Session, list[T]], object], result: Written[T]
) -> None:
    """Write `rows` known (or likely) to hold a refused row: each half apart, recursively."""
    pending = [rows]
    while pending:
        part = pending.pop()
        if not part:
            continue
        try:
            _write(sessions, part, write)
        except Unavailable:
            raise
        except Exception as exc:  # see write_isolating
            result.first_error = result.first_error or _reason(exc)
            if len(part) == 1 or len(result.refused) >= MAX_ISOLATED:
                result.refused.extend(part)
            else:
                middle = len(part) // 2
                pending += [part[middle:], part[:middle]]  # the first half next: rows keep their order
        else:
            result.stored.extend(part)


def _write(sessions: sessionmaker[Session], rows: list[T], write: Callable[[Session, list[T]], object]) -> None:
    with transaction(sessions) as session:
        write(session, rows)


def _reason(exc: BaseException) -> str:
    """The database's own words where there are some (a Conflict wraps the IntegrityError that says which column)."""
    cause = exc.__cause__ or exc
    return (str(getattr(cause, "orig", None) or cause) or type(cause).__name__).splitlines()[0][:300]


def _report(result: Written[T], total: int, what: str) -> None:
    if result.refused:
        log.warning(
            "dropped %d of %d %s the database refused (%s); wrote the other %d",
            len(result.refused),
            total,
            what,
            result.first_error,
            len(result.stored),
        )
