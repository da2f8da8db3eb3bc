"""Telling the store's failures apart: an outage worth waiting out, or a value
the database will never accept.

An outage (a dropped connection, a pool that cannot hand out a connection, a
server restarting) says nothing about the job, so callers put the job back
untouched. A refused value (a JSON string holding U+0000, which ``jsonb``
cannot store; a row past a size limit) fails the same way on every try, so
treating it as an outage would requeue the job forever.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import psycopg
import psycopg.errors
import psycopg_pool

from schemas.errors import FailedPrecondition, Unavailable, UnstorableValue, WorkflowJobsError

log = logging.getLogger(__name__)

# SQLSTATE class 22 (data exceptions) and 54 (program limits).
_REFUSED_VALUES: tuple[type[BaseException], ...] = (
    psycopg.DataError,
    psycopg.errors.ProgramLimitExceeded,
)

_OUTAGES: tuple[type[BaseException], ...] = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    psycopg_pool.PoolTimeout,
    psycopg_pool.PoolClosed,
    OSError,
    TimeoutError,
)


def is_outage(exc: BaseException) -> bool:
    """True when retrying the same statement later may well succeed."""
    return isinstance(exc, _OUTAGES) and not isinstance(exc, _REFUSED_VALUES)


@contextlib.contextmanager
def outages_as_unavailable() -> Iterator[None]:
    """Raise an outage inside the block as ``Unavailable``, the project's own error.

    Callers outside the store (the verbs) then tell "retry later" from a bad
    request without knowing the database driver.
    """
    try:
        yield
    except Exception as exc:
        if not is_outage(exc):
            raise
        log.warning("the store is unreachable: %s", exc)
        raise Unavailable(f"the store is unreachable: {exc}") from exc


def database_failure(exc: BaseException) -> WorkflowJobsError | None:
    """The one-line error a command with a connection of its own reports instead
    of ``exc`` (libpq adds hint lines): a database it cannot reach, or one the
    migrations have not made yet. None for anything else."""
    lines = str(exc).strip().splitlines()
    detail = lines[0] if lines else type(exc).__name__
    if is_outage(exc):
        return Unavailable(f"cannot reach the database: {detail}")
    if isinstance(exc, psycopg.errors.UndefinedTable):
        return FailedPrecondition(
            f"the database is not migrated ({detail}): run `wfjobs migrate` first"
        )
    return None


def refused_value(exc: BaseException, what: str) -> UnstorableValue | None:
    """The error to raise instead of ``exc`` when the database refused a value."""
    if isinstance(exc, _REFUSED_VALUES):
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return UnstorableValue(f"the database refused to {what}: {detail}")
    return None
