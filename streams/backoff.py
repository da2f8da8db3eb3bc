"""The one pause every loop takes between failed tries: exponential, capped, jittered.

The ceiling doubles with each failure in a row, from ``base_s`` up to
``cap_s``; the pause is a random point in the top ``jitter`` fraction of it,
so it never exceeds the cap and a fleet that failed together (a store
restart, a broker outage) does not retry in step. A success resets it.
"""

from __future__ import annotations

import random

# Past this many doublings every ceiling is the cap; it keeps ``2**n`` small.
_MAX_DOUBLINGS = 32


def backoff_delay(
    failures: int,
    *,
    base_s: float,
    cap_s: float,
    jitter: float = 0.5,
    rng: random.Random | None = None,
) -> float:
    """The pause after ``failures`` failures in a row beyond the first (0 for the first)."""
    if base_s <= 0 or cap_s <= 0:
        raise ValueError("base_s and cap_s must be positive")
    if not 0 <= jitter <= 1:
        raise ValueError("jitter must be between 0 and 1")
    ceiling = min(cap_s, base_s * 2.0 ** min(max(failures, 0), _MAX_DOUBLINGS))
    draw = (rng or random).uniform(1.0 - jitter, 1.0)
    return ceiling * draw


class Backoff:
    """Counts failures in a row; ``next()`` is the pause after one more, ``reset()`` a success."""

    def __init__(
        self,
        base_s: float,
        cap_s: float,
        *,
        jitter: float = 0.5,
        rng: random.Random | None = None,
    ) -> None:
        # Checked once here, so a misconfigured loop fails at start, not on its first outage.
        backoff_delay(0, base_s=base_s, cap_s=cap_s, jitter=jitter)
        self.base_s = base_s
        self.cap_s = cap_s
        self.jitter = jitter
        self._rng = rng
        self.failures = 0

    def next(self) -> float:
        """Count one more failure and return the pause before the next try."""
        delay = backoff_delay(
            self.failures, base_s=self.base_s, cap_s=self.cap_s, jitter=self.jitter, rng=self._rng
        )
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0


__all__ = ["Backoff", "backoff_delay"]
