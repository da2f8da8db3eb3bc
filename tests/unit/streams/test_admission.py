"""The admission rule on its own: when it reads the backlog and when it refuses."""

from __future__ import annotations

import pytest

from schemas.errors import ResourceExhausted
from streams.admission import Admission


class Backlog:
    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.reads = 0

    async def count_queued(self, *, limit: int) -> int:
        self.reads += 1
        return min(self.depth, limit)


async def test_no_cap_never_reads_the_store() -> None:
    backlog = Backlog(10_000)
    admission = Admission(0)
    await admission.check(backlog)
    assert backlog.reads == 0 and not admission.enabled


async def test_the_backlog_is_read_at_most_once_per_refresh() -> None:
    now = [100.0]
    backlog = Backlog(1)
    admission = Admission(3, refresh_s=1.0, clock=lambda: now[0])
    await admission.check(backlog)
    admission.admitted()
    await admission.check(backlog)
    admission.admitted()
    assert backlog.reads == 1
    # Three counted here, though the store was last seen with one.
    with pytest.raises(ResourceExhausted, match="WFJOBS_MAX_QUEUED_JOBS"):
        await admission.check(backlog)
    now[0] += 1.0
    await admission.check(backlog)  # read again: the store still says one
    assert backlog.reads == 2


def test_a_negative_cap_is_refused() -> None:
    with pytest.raises(ValueError):
        Admission(-1)
