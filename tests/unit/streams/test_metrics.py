"""The metrics' pieces without services: the cached fleet read, the loop-lag probe, off."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from schemas.errors import NotFound
from store.fleet import FleetCounts
from streams.fleet_metrics import FleetGauges
from streams.loop_lag import LoopLagProbe
from streams.metrics import CATALOGUE, MAX_LABEL_SETS, OTHER_LABEL, Metrics
from streams.runtime import Runtime
from streams.settings import Settings, SettingsError


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _block_the_loop(seconds: float) -> None:
    # What the probe exists to see: a callback that holds the loop.
    time.sleep(seconds)


def _samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text.decode())
        for sample in family.samples
    }


async def test_the_fleet_is_read_at_most_once_per_interval_however_often_scraped() -> None:
    reads = 0

    async def read() -> FleetCounts:
        nonlocal reads
        reads += 1
        await asyncio.sleep(0.01)
        return FleetCounts(jobs_by_status={"QUEUED": reads}, outbox_pending=7)

    clock = FakeClock()
    gauges = FleetGauges(read, cache_s=10.0, clock=clock)
    metrics = Metrics()
    metrics.add_collector(gauges, gauges.refresh)

    # Concurrent scrapes share one read.
    first = await asyncio.gather(*(metrics.exposition() for _ in range(5)))
    assert reads == 1
    assert all(_samples(text)[("wfjobs_jobs", (("status", "QUEUED"),))] == 1 for text in first)
    clock.now += 9.9
    await metrics.exposition()
    assert reads == 1
    clock.now += 0.2
    later = _samples(await metrics.exposition())
    assert reads == 2
    assert later[("wfjobs_jobs", (("status", "QUEUED"),))] == 2
    assert later[("wfjobs_outbox_pending_events", ())] == 7


async def test_a_failed_read_leaves_the_figures_out_and_is_counted() -> None:
    async def read() -> FleetCounts:
        raise OSError("database away")

    clock = FakeClock()
    gauges = FleetGauges(read, cache_s=5.0, clock=clock)
    metrics = Metrics()
    metrics.add_collector(gauges, gauges.refresh)
    samples = _samples(await metrics.exposition())
    assert samples[("wfjobs_fleet_read_failures_total", ())] == 1
    assert not any(name == "wfjobs_jobs" for name, _ in samples)
    # Not asked again before the interval has passed.
    await metrics.exposition()
    assert gauges.reads == 1


async def test_the_probe_reports_how_long_the_loop_was_held() -> None:
    reported: list[float] = []
    probe = LoopLagProbe(reported.append, interval_s=0.05)
    idle = await probe.probe_once()
    assert 0 <= idle < 0.04

    async def hold_the_loop() -> None:
        await asyncio.sleep(0.01)
        _block_the_loop(0.25)

    held, _ = await asyncio.gather(probe.probe_once(), hold_the_loop())
    assert held >= 0.18
    assert reported == [idle, held]


async def test_the_probe_runs_as_a_service_and_sets_the_gauge() -> None:
    metrics = Metrics()
    reported: list[float] = []

    def report(lag: float) -> None:
        reported.append(lag)
        metrics.loop_lag.set(lag)

    probe = LoopLagProbe(report, interval_s=0.02)
    await probe.start()
    try:
        await asyncio.sleep(0.01)
        _block_the_loop(0.1)
        await asyncio.sleep(0.05)
    finally:
        await probe.stop()
    assert len(reported) >= 2
    assert max(reported) >= 0.05
    gauge = _samples(await metrics.exposition())[("wfjobs_event_loop_lag_seconds", ())]
    assert gauge == reported[-1]


async def test_off_means_no_instrument_and_no_page() -> None:
    off = Runtime(Settings.from_env({"WFJOBS_METRICS": "off"}))
    assert off.metrics is None
    with pytest.raises(NotFound, match="WFJOBS_METRICS=off"):
        await off.metrics_exposition()
    on = Runtime(Settings.from_env({}))
    assert on.metrics is not None
    # Two runtimes in one process keep their own registries.
    assert Runtime(Settings.from_env({})).metrics is not on.metrics


def test_the_settings_refuse_what_they_do_not_know() -> None:
    with pytest.raises(SettingsError, match="WFJOBS_METRICS"):
        Settings.from_env({"WFJOBS_METRICS": "maybe"})
    with pytest.raises(SettingsError, match="WFJOBS_METRICS_DB_CACHE_S"):
        Settings.from_env({"WFJOBS_METRICS_DB_CACHE_S": "0"})


def test_the_catalogue_follows_the_naming_conventions() -> None:
    names = [spec.name for spec in CATALOGUE]
    assert len(names) == len(set(names))
    for spec in CATALOGUE:
        assert spec.name.startswith("wfjobs_"), spec.name
        assert spec.name.endswith("_total") == (spec.kind == "counter"), spec.name
        assert "job_id" not in spec.labels
        if spec.kind == "histogram":
            assert spec.name.endswith("_seconds"), spec.name


async def test_names_a_submitter_picks_cannot_grow_the_page_without_end() -> None:
    # Inline workflows carry any workflow and step names their submitter likes.
    metrics = Metrics()
    timings = metrics.claims
    for i in range(MAX_LABEL_SETS + 500):
        timings.observe(timings.claim_latency, (f"inline-{i}",), 0.01)
        timings.observe(timings.step_duration, (f"inline-{i}", f"s{i}", "ok"), 0.01)
        timings.observe(timings.step_duration, ("inline-0", f"step_{i}", "error"), 0.02)
    samples = _samples(await metrics.exposition())

    def counts(name: str) -> dict[tuple[tuple[str, str], ...], float]:
        return {labels: value for (sample, labels), value in samples.items() if sample == name}

    latency = counts("wfjobs_claim_latency_seconds_count")
    assert len(latency) == MAX_LABEL_SETS + 1
    assert latency[(("workflow", "inline-0"),)] == 1
    assert latency[(("workflow", OTHER_LABEL),)] == 500
    steps = counts("wfjobs_step_duration_seconds_count")
    assert len(steps) <= MAX_LABEL_SETS + 2
    assert sum(steps.values()) == 2 * (MAX_LABEL_SETS + 500)
    # The outcome is the service's own word, kept past the bound.
    other = {dict(labels)["outcome"] for labels in steps if dict(labels)["step"] == OTHER_LABEL}
    assert other == {"ok", "error"}


@pytest.mark.parametrize(
    ("name", "cases"),
    [
        # The claim's own condition: a job out of attempts or past its deadline waits for none.
        ("wfjobs_queued_oldest_age_seconds", ("run_after passed", "attempts left", "deadline")),
        # Rows behind a dead letter wait for a redrive, not for a relay.
        ("wfjobs_outbox_pending_oldest_age_seconds", ("a relay may publish", "dead letter")),
        (
            "wfjobs_jobs_handed_back_total",
            ("store outage", "shutdown", "settle bound", "claim loop"),
        ),
    ],
)
def test_help_texts_name_every_case_the_figure_counts_or_leaves_out(
    name: str, cases: tuple[str, ...]
) -> None:
    (spec,) = [spec for spec in CATALOGUE if spec.name == name]
    assert [case for case in cases if case not in spec.help] == []


async def test_the_relay_histogram_is_exported_only_once_a_relay_asks_for_it() -> None:
    metrics = Metrics()
    assert "wfjobs_relay_publish_seconds" not in _family_names(await metrics.exposition())
    metrics.relay_timings().publish.observe(0.01)
    assert "wfjobs_relay_publish_seconds" in _family_names(await metrics.exposition())


def _family_names(text: bytes) -> set[str]:
    return {family.name for family in text_string_to_metric_families(text.decode())}
