"""How long the event loop went without a turn while something ran on it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def with_longest_gap(work: Awaitable[T]) -> tuple[T, float]:
    """``work``'s result and the longest wait, in seconds, between two wakes of a 10 ms sleep.

    By the wall clock, so it also counts a worker thread holding the
    interpreter lock (which thread CPU time would not), and time the kernel
    gave other processes: assert with a margin.
    """
    gaps: list[float] = []

    async def tick() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

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
