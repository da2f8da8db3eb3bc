"""The retention loop: every ``WFJOBS_RETENTION_INTERVAL_S``, one pass of deletes.

Every process with the worker role runs one; an advisory lock lets one pass
run at a time in the whole fleet (see ``store.retention``), so the others
simply find the lock taken and wait for their next turn. A pass that fails
because the store is away is logged and tried again on the next tick; any
other failure is a defect and crashes the process, loudly.

Ages are written ``<whole number><unit>``, the unit one of ``s``, ``m``, ``h``
or ``d`` (``90s``, ``15m``, ``12h``, ``30d``), at most a hundred years
(``36500d``); ``0`` keeps forever.
``WFJOBS_JOB_RETENTION`` is a comma-separated list: a bare age applies to
every terminal status, ``STATUS=age`` overrides one of them
(``30d,COMPLETED=7d,DEAD=90d``).
"""

from __future__ import annotations

import logging
import random
import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import mode

from store.errors import is_outage
from store.retention import PassResult, RetentionPolicy, RetentionStore
from store.states import TERMINAL, Status
from streams.convert import timestamp_json
from streams.health import PartHealth

log = logging.getLogger(__name__)

DEFAULT_OUTBOX_RETENTION = "7d"
DEFAULT_JOB_RETENTION = "30d"

_DURATION = re.compile(r"(\d+)([smhd])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# A hundred years: longer is what 0 (keep forever) says.
MAX_AGE_S = 36_500 * 86_400
_TERMINAL_NAMES = ", ".join(sorted(status.value for status in TERMINAL))


def parse_duration(variable: str, raw: str) -> timedelta | None:
    """``raw`` as an age; ``None`` (keep forever) for zero. Errors name ``variable``."""
    text = raw.strip()
    if text == "0":
        return None
    match = _DURATION.fullmatch(text)
    if match is None:
        raise ValueError(
            f"{variable} must be an age like 90s, 15m, 12h or 30d (0 keeps forever), got {raw!r}"
        )
    seconds = int(match.group(1)) * _UNITS[match.group(2)]
    if seconds > MAX_AGE_S:
        # A cutoff that far back is before any date Postgres holds: the first
        # pass would fail, and with it the process.
        raise ValueError(
            f"{variable} must be at most {MAX_AGE_S // _UNITS['d']}d (0 keeps forever), got {raw!r}"
        )
    return timedelta(seconds=seconds) if seconds else None


def parse_job_retention(variable: str, raw: str) -> dict[Status, timedelta | None]:
    """Ages per terminal status from ``30d`` or ``30d,COMPLETED=7d,DEAD=0``.

    A bare age sets every terminal status (the default ``30d`` when there is
    none); ``STATUS=age`` overrides one, at most once each.
    """
    default: timedelta | None = parse_duration(variable, DEFAULT_JOB_RETENTION)
    overrides: dict[Status, timedelta | None] = {}
    bare_seen = False
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        name, equals, age = item.partition("=")
        if not equals:
            if bare_seen:
                raise ValueError(
                    f"{variable} has more than one age for every status; give one, "
                    f"then STATUS=age overrides (got {raw!r})"
                )
            bare_seen = True
            default = parse_duration(variable, item)
            continue
        key = name.strip().upper()
        try:
            status = Status(key)
        except ValueError:
            status = None
        if status is None or status not in TERMINAL:
            raise ValueError(
                f"{variable}: {name.strip()!r} is not a terminal status; only "
                f"{_TERMINAL_NAMES} jobs are ever deleted"
            )
        if status in overrides:
            raise ValueError(f"{variable} gives the age of {status} jobs twice")
        overrides[status] = parse_duration(f"{variable} ({status})", age)
    return {status: overrides.get(status, default) for status in sorted(TERMINAL)}


def parse_policy(outbox: str, jobs: str) -> RetentionPolicy:
    """The policy of ``WFJOBS_OUTBOX_RETENTION`` and ``WFJOBS_JOB_RETENTION``."""
    return RetentionPolicy(
        outbox=parse_duration("WFJOBS_OUTBOX_RETENTION", outbox),
        jobs=parse_job_retention("WFJOBS_JOB_RETENTION", jobs),
    )


def describe(policy: RetentionPolicy) -> str:
    """The policy in one line, for the log and for health."""

    def age(value: timedelta | None) -> str:
        return "forever" if value is None else _short(value)

    jobs = ", ".join(f"{status} {age(value)}" for status, value in sorted(policy.jobs.items()))
    return f"outbox {age(policy.outbox)}; jobs {jobs}"


def _short(value: timedelta) -> str:
    seconds = int(value.total_seconds())
    for unit in ("d", "h", "m"):
        if seconds % _UNITS[unit] == 0:
            return f"{seconds // _UNITS[unit]}{unit}"
    return f"{seconds}s"


class RetentionLoop(mode.Service):
    """Runs ``RetentionStore.run_pass`` every ``interval_s`` for the life of the process."""

    def __init__(
        self,
        store: RetentionStore,
        policy: RetentionPolicy,
        *,
        interval_s: float,
        **kwargs: Any,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        super().__init__(**kwargs)
        self._store = store
        self.policy = policy
        self.interval_s = interval_s
        self.passes = 0
        # Passes skipped because another process held the fleet's lock.
        self.skipped = 0
        self.deleted = 0
        self.last_pass: PassResult | None = None
        self.last_pass_at: datetime | None = None
        self.last_error = ""

    async def on_start(self) -> None:
        log.info("retention: %s, every %.0fs", describe(self.policy), self.interval_s)

    @mode.Service.task
    async def _run(self) -> None:
        # A random first delay keeps a fleet started together from all asking
        # for the lock at the same moment.
        await self.sleep(random.uniform(0, self.interval_s))
        while not self.should_stop:
            await self.run_once()
            await self.sleep(self.interval_s)

    async def run_once(self, *, now: datetime | None = None) -> PassResult | None:
        """One pass; ``None`` when the store could not be reached (tried again next tick)."""
        started = time.monotonic()
        try:
            result = await self._store.run_pass(self.policy, now=now)
        except Exception as exc:
            if not is_outage(exc):
                raise
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("retention: pass failed, trying again later: %s", self.last_error)
            return None
        self.last_error = ""
        self.last_pass_at = datetime.now(UTC)
        if not result.ran:
            self.skipped += 1
            return result
        self.passes += 1
        self.deleted += result.deleted
        self.last_pass = result
        if result.deleted:
            jobs = ", ".join(f"{count} {status}" for status, count in result.jobs.items() if count)
            log.info(
                "retention: deleted %d outbox row(s), job(s): %s, %d snapshot(s) in %.1fs",
                result.outbox_rows,
                jobs or "none",
                result.snapshots,
                time.monotonic() - started,
            )
        return result

    def health(self) -> PartHealth:
        # Retention that cannot run is not a stuck process: a restart would not
        # help, and nothing is lost by deleting later. It is reported, not failed.
        detail: dict[str, Any] = {
            "policy": describe(self.policy),
            "passes": self.passes,
            "skipped": self.skipped,
            "deleted": self.deleted,
            "last_pass_at": timestamp_json(self.last_pass_at) if self.last_pass_at else None,
        }
        if self.last_error:
            return PartHealth(
                "retention", summary=f"last pass failed: {self.last_error}", detail=detail
            )
        return PartHealth("retention", detail=detail)


__all__ = [
    "DEFAULT_JOB_RETENTION",
    "DEFAULT_OUTBOX_RETENTION",
    "RetentionLoop",
    "describe",
    "parse_duration",
    "parse_job_retention",
    "parse_policy",
]
