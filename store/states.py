"""The job state machine, as data.

Every store method that moves a job names its transition here; the SQL then
conditions on the source statuses this table allows, so a transition the design
does not draw cannot be written by accident.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from schemas.errors import InvalidArgument


class Status(StrEnum):
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    WAITING = "WAITING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    DEAD = "DEAD"
    CANCELLED = "CANCELLED"


STATUSES: tuple[str, ...] = tuple(status.value for status in Status)

TERMINAL: frozenset[Status] = frozenset(
    {Status.COMPLETED, Status.FAILED, Status.DEAD, Status.CANCELLED}
)

TRANSITIONS: Mapping[Status, frozenset[Status]] = {
    Status.QUEUED: frozenset(
        {
            Status.RUNNING,  # claim
            Status.DEAD,  # found with its attempts already exhausted
            Status.CANCELLED,  # cancelled before any worker took it
            Status.FAILED,  # its whole-job deadline passed while it waited
        }
    ),
    Status.RUNNING: frozenset(
        {
            Status.COMPLETED,  # settled with a verdict
            Status.FAILED,  # verdict failure, non-retryable error, or a deadline passed
            Status.WAITING,  # parked on an external step
            Status.QUEUED,  # retry with backoff, lease swept, or handed back
            Status.DEAD,  # retryable failure with no attempts left
            Status.CANCELLED,  # its worker (or the sweeper) honoured a cancel request
        }
    ),
    Status.WAITING: frozenset(
        {
            Status.QUEUED,  # complete-step accepted
            Status.FAILED,  # complete-step response rejected, or a deadline passed
            Status.CANCELLED,  # cancelled while parked
        }
    ),
    Status.COMPLETED: frozenset(),
    Status.FAILED: frozenset(),
    Status.DEAD: frozenset(),
    Status.CANCELLED: frozenset(),
}


class IllegalTransition(ValueError):
    """A transition the state machine does not allow: a bug in the caller."""


def allowed(source: Status, target: Status) -> bool:
    return target in TRANSITIONS[source]


def sources_of(target: Status) -> frozenset[Status]:
    """Every status a job may leave to reach ``target``."""
    return frozenset(source for source, targets in TRANSITIONS.items() if target in targets)


def transition(source: Status, target: Status) -> tuple[str, str]:
    """The ``(source, target)`` pair as SQL parameters, refused when not in the table."""
    if not allowed(source, target):
        raise IllegalTransition(f"{source} -> {target} is not a transition of a job")
    return source.value, target.value


def parse_status(value: str) -> Status:
    """A status filter from a caller; anything else is refused with the valid ones."""
    try:
        return Status(value)
    except ValueError:
        raise InvalidArgument(
            f"unknown status {value!r}; valid statuses are {', '.join(STATUSES)}"
        ) from None
