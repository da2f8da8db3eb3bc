"""How long the event loop went without a turn while something ran on it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def with_longest_gap(work: Awaitable[T]) -> tuple[T, float]:
    """``work``'s result and the longest wait, in seconds, between two wakes of a 10 ms sleep.

    A wait counts for the CPU time the loop's own thread spent in it (at most
    the wall clock's): what the loop ran instead of its other work. Time the
    kernel gave other processes, or another thread of this one, does not
    count, so a suite running beside the test stretches the measure little;
    still, assert with a margin. It measures work that holds the loop, not a
    blocking wait on I/O, which takes no CPU.
    """
    gaps: list[float] = []

    async def tick() -> None:
        last, ran = time.monotonic(), time.thread_time()
        while True:
            await asyncio.sleep(0.01)
            now, running = time.monotonic(), time.thread_time()
            gaps.append(min(now - last, running - ran))
            last, ran = now, running

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.05)  # ticking before the work starts
    try:
        result = await work
        # A hold just before ``work`` ended is only counted when the ticker
        # wakes, which it may not have done yet.
        await asyncio.sleep(0.02)
    finally:
        ticker.cancel()
    return result, max(gaps, default=0.0)


__all__ = ["with_longest_gap"]
