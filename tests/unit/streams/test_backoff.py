"""The shared backoff: doubles per failure, never past the cap, jittered below the ceiling."""

from __future__ import annotations

import random

import pytest

from streams.backoff import Backoff, backoff_delay


def test_the_ceiling_doubles_then_stays_at_the_cap() -> None:
    ceilings = [backoff_delay(n, base_s=0.5, cap_s=5.0, jitter=0.0) for n in range(8)]
    assert ceilings == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0, 5.0]
    # However long the outage, the exponent cannot overflow the cap.
    assert backoff_delay(10_000, base_s=0.5, cap_s=5.0, jitter=0.0) == 5.0


def test_jitter_stays_within_the_top_fraction_of_the_ceiling() -> None:
    rng = random.Random(7)
    draws = [backoff_delay(3, base_s=1.0, cap_s=30.0, jitter=0.25, rng=rng) for _ in range(500)]
    assert all(6.0 <= d <= 8.0 for d in draws)
    assert len(set(draws)) > 400, "the pause is spread, not fixed"
    capped = [backoff_delay(20, base_s=1.0, cap_s=30.0, rng=rng) for _ in range(500)]
    assert all(15.0 <= d <= 30.0 for d in capped)


def test_next_counts_failures_and_reset_starts_over() -> None:
    backoff = Backoff(0.2, 1.0, jitter=0.0)
    assert [backoff.next() for _ in range(5)] == [0.2, 0.4, 0.8, 1.0, 1.0]
    assert backoff.failures == 5
    backoff.reset()
    assert backoff.failures == 0
    assert backoff.next() == 0.2


def test_a_seeded_backoff_repeats_its_draws() -> None:
    first = Backoff(1.0, 10.0, rng=random.Random(3))
    second = Backoff(1.0, 10.0, rng=random.Random(3))
    assert [first.next() for _ in range(6)] == [second.next() for _ in range(6)]


@pytest.mark.parametrize(
    ("base_s", "cap_s", "jitter"), [(0.0, 1.0, 0.5), (1.0, -1.0, 0.5), (1.0, 2.0, 1.5)]
)
def test_nonsense_is_refused_at_construction(base_s: float, cap_s: float, jitter: float) -> None:
    with pytest.raises(ValueError):
        Backoff(base_s, cap_s, jitter=jitter)
