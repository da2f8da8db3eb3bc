"""What ``/metrics`` exports: every metric's name, type, labels and meaning, and the registry.

Each ``Runtime`` owns one ``Metrics`` (``WFJOBS_METRICS=on``, the default) with
its own ``CollectorRegistry``: nothing is registered in prometheus-client's
global registry, so several runtimes in one process never share a series.

Three kinds of source feed it:

* histograms the hot path observes (claim latency, segment and step
  durations, relay publishes), reached through ``ClaimTimings`` and
  ``RelayTimings``; a process with metrics off has none of them and its loops
  skip the observation altogether;
* counters the loops already keep in memory (``ClaimStats``, ``RelayStats``,
  the sweeper's, admission's, the ownership watchdog's request lag), read only
  when a scrape asks (``stats_collector``), so they cost nothing between scrapes;
* figures of the whole fleet read from the database (``streams.fleet_metrics``).

``CATALOGUE`` is the one list of names: the families are built from it, the
README documents it, and the shipped dashboard and alert rules are checked
against it (``tests/unit/delivery/test_metric_names.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from streams.claims import ClaimStats
    from streams.relay import RelayStats
    from streams.sweeper import Sweeper

# The text format every Prometheus version reads.
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str
    kind: str  # counter, gauge or histogram
    help: str
    labels: tuple[str, ...] = ()


# Steps and segments run from milliseconds (in-process handlers) to the
# deadline's default of 30 s and beyond (remote models).
_DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# A claim waits from nothing (an idle fleet) to minutes (a backlog).
_WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)

CATALOGUE: tuple[MetricSpec, ...] = (
    # The fleet, from the database (the same figures on every process).
    MetricSpec("wfjobs_jobs", "gauge", "Jobs per status, read from the database.", ("status",)),
    MetricSpec(
        "wfjobs_queued_oldest_age_seconds",
        "gauge",
        "Seconds the longest-waiting claimable QUEUED job (run_after passed, attempts left, "
        "its whole-job deadline not passed) has been claimable; 0 when none waits. "
        "Read from the database.",
    ),
    MetricSpec(
        "wfjobs_outbox_pending_events", "gauge", "PENDING outbox rows, read from the database."
    ),
    MetricSpec(
        "wfjobs_outbox_pending_oldest_age_seconds",
        "gauge",
        "Seconds since the oldest PENDING outbox row a relay may publish was written; 0 when "
        "none is. Rows held back behind a dead letter of their job are left out. "
        "Read from the database.",
    ),
    MetricSpec(
        "wfjobs_outbox_failed_events",
        "gauge",
        "FAILED outbox rows (dead letters the relay gave up on), read from the database.",
    ),
    MetricSpec(
        "wfjobs_fleet_read_failures_total",
        "counter",
        "Scrapes whose database read of the fleet figures failed; those figures were left out.",
    ),
    # This process's claim loops.
    MetricSpec(
        "wfjobs_claim_latency_seconds",
        "histogram",
        "Seconds from a job becoming claimable (its run_after) to a claim taking it, both on "
        "the database clock.",
        ("workflow",),
    ),
    MetricSpec(
        "wfjobs_segment_duration_seconds",
        "histogram",
        "Seconds one claimed segment ran, from its start to its last step's end, settle excluded.",
        ("workflow",),
    ),
    MetricSpec(
        "wfjobs_step_duration_seconds",
        "histogram",
        "Seconds one step invocation took; outcome ok when it answered, error when it raised, "
        "timed out or was cancelled.",
        ("workflow", "step", "outcome"),
    ),
    MetricSpec(
        "wfjobs_jobs_claimed_total",
        "counter",
        "Jobs this process's claims took, one per claim (an attempt given back is claimed again).",
    ),
    MetricSpec(
        "wfjobs_jobs_settled_total",
        "counter",
        "Segments this process settled, by outcome: completed, parked, failed, retried "
        "(requeued with backoff), dead (attempts used up) or cancelled.",
        ("outcome",),
    ),
    MetricSpec(
        "wfjobs_lease_losses_total",
        "counter",
        "Jobs this process dropped because another worker or the sweeper held the lease by then.",
    ),
    MetricSpec(
        "wfjobs_jobs_handed_back_total",
        "counter",
        "Jobs this process requeued with their attempt given back (store outage, shutdown, "
        "a settle or a claimed job's start held past the settle bound, a defect in the "
        "claim loop).",
    ),
    # This process's sweeper.
    MetricSpec("wfjobs_sweeps_total", "counter", "Sweeps this process completed."),
    MetricSpec(
        "wfjobs_swept_jobs_total",
        "counter",
        "Jobs this process's sweeper settled, by action: requeued (lease expired or segment "
        "stalled), dead (the same with no attempt left), cancelled, job_deadline and "
        "step_timeout (FAILED past a deadline), step_fallback (a timed-out step took its "
        "fallback).",
        ("action",),
    ),
    # This process's relay.
    MetricSpec(
        "wfjobs_relay_publish_seconds",
        "histogram",
        "Seconds one relay batch took from handing its first event to the producer to the "
        "broker's last acknowledgement.",
    ),
    MetricSpec(
        "wfjobs_relay_events_published_total",
        "counter",
        "Events this process's relay published and marked PUBLISHED.",
    ),
    MetricSpec(
        "wfjobs_relay_events_failed_total",
        "counter",
        "Outbox rows this process's relay marked FAILED for good (dead letters).",
    ),
    MetricSpec(
        "wfjobs_relay_transient_faults_total",
        "counter",
        "Outbox rows handed back after a transient fault (broker or registry away); "
        "no attempt spent.",
    ),
    # The request topic and admission.
    MetricSpec(
        "wfjobs_request_lag_records",
        "gauge",
        "Requests on each partition of the request topic not yet committed by the consumer "
        "group (high watermark minus committed offset), as this worker last read it.",
        ("partition",),
    ),
    MetricSpec(
        "wfjobs_admission_rejections_total",
        "counter",
        "Times this process refused to create a job because the QUEUED backlog was at "
        "WFJOBS_MAX_QUEUED_JOBS (a request the agent tries again counts at each try).",
    ),
    # The process.
    MetricSpec(
        "wfjobs_event_loop_lag_seconds",
        "gauge",
        "How late the event loop last woke from a timed sleep: time it could not spend "
        "on anything else.",
    ),
)

SPECS: Mapping[str, MetricSpec] = {spec.name: spec for spec in CATALOGUE}

SETTLE_OUTCOMES = ("completed", "parked", "failed", "retried", "dead", "cancelled")
SWEEP_ACTIONS = (
    "requeued",
    "dead",
    "cancelled",
    "job_deadline",
    "step_timeout",
    "step_fallback",
)


# The series a family's samples add to its name in the text format.
_SAMPLE_SUFFIXES = ("_bucket", "_count", "_sum", "_created")


def exported_family(sample: str) -> str:
    """The catalogue name a sample name of the exposition belongs to."""
    if sample in SPECS:
        return sample
    for suffix in _SAMPLE_SUFFIXES:
        base = sample.removesuffix(suffix)
        if base != sample:
            # A counter's _created sample hangs off its name without _total.
            return base if base in SPECS else f"{base}_total"
    return sample


def _histogram(registry: CollectorRegistry, name: str, buckets: tuple[float, ...]) -> Histogram:
    spec = SPECS[name]
    return Histogram(name, spec.help, labelnames=spec.labels, buckets=buckets, registry=registry)


def counter(name: str, value: float) -> CounterMetricFamily:
    spec = SPECS[name]
    return CounterMetricFamily(name, spec.help, value=value)


def labelled(name: str, values: Mapping[str, float]) -> Metric:
    """A family of ``name`` with one sample per value of its one label."""
    spec = SPECS[name]
    (label,) = spec.labels
    family: CounterMetricFamily | GaugeMetricFamily
    if spec.kind == "counter":
        family = CounterMetricFamily(name, spec.help, labels=[label])
    else:
        family = GaugeMetricFamily(name, spec.help, labels=[label])
    for key, value in values.items():
        family.add_metric([key], value)
    return family


def gauge(name: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, SPECS[name].help, value=value)


# Workflow and step names come from definitions, and an inline workflow's from
# whoever submits it: past this many label sets a histogram puts the names of
# new ones under ``OTHER_LABEL``, so a submitter cannot grow the page (and the
# process's memory, and Prometheus's series) without end.
MAX_LABEL_SETS = 1000
OTHER_LABEL = "(other)"
# The labels whose values are names from definitions; ``outcome`` is the service's.
_NAMED_LABELS = frozenset({"workflow", "step"})


@dataclass(frozen=True, slots=True)
class ClaimTimings:
    """What the claim loops observe per claim, segment and step."""

    claim_latency: Histogram
    segment_duration: Histogram
    step_duration: Histogram
    # Each labelled child, looked up once: ``labels()`` validates and locks on
    # every call, and a job observes five of them.
    _children: dict[tuple[int, tuple[str, ...]], Histogram] = field(
        default_factory=dict, repr=False
    )
    # Per histogram: its label names, and how many label sets it has a child for.
    _label_names: dict[int, tuple[str, ...]] = field(default_factory=dict, repr=False)
    _label_sets: dict[int, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for name, histogram in (
            ("wfjobs_claim_latency_seconds", self.claim_latency),
            ("wfjobs_segment_duration_seconds", self.segment_duration),
            ("wfjobs_step_duration_seconds", self.step_duration),
        ):
            self._label_names[id(histogram)] = SPECS[name].labels

    def observe(self, histogram: Histogram, labels: tuple[str, ...], seconds: float) -> None:
        """``histogram.labels(*labels).observe(seconds)``, the child found once."""
        key = (id(histogram), labels)
        child = self._children.get(key)
        if child is None:
            child = self._child(histogram, labels)
        child.observe(seconds)

    def _child(self, histogram: Histogram, labels: tuple[str, ...]) -> Histogram:
        made = self._label_sets.get(id(histogram), 0)
        if made >= MAX_LABEL_SETS:
            names = self._label_names[id(histogram)]
            labels = tuple(
                OTHER_LABEL if name in _NAMED_LABELS else value
                for name, value in zip(names, labels, strict=True)
            )
            shared = self._children.get((id(histogram), labels))
            if shared is not None:
                return shared
        else:
            self._label_sets[id(histogram)] = made + 1
        child = self._children[(id(histogram), labels)] = histogram.labels(*labels)
        return child


@dataclass(frozen=True, slots=True)
class RelayTimings:
    publish: Histogram


class _Readings(Collector):
    """A collector whose families some callable builds when a scrape asks."""

    def __init__(self, read: Callable[[], Iterable[Metric]]) -> None:
        self._read = read

    def collect(self) -> Iterable[Metric]:
        return self._read()


class Metrics:
    """One process's registry: its instruments, its readings, its exposition."""

    def __init__(self) -> None:
        # No auto_describe: a reading's sources (the loops) may not exist yet
        # when it is registered, and names are unique by construction (CATALOGUE).
        self.registry = CollectorRegistry(auto_describe=False)
        registry = self.registry
        self.claims = ClaimTimings(
            claim_latency=_histogram(registry, "wfjobs_claim_latency_seconds", _WAIT_BUCKETS),
            segment_duration=_histogram(
                registry, "wfjobs_segment_duration_seconds", _DURATION_BUCKETS
            ),
            step_duration=_histogram(registry, "wfjobs_step_duration_seconds", _DURATION_BUCKETS),
        )
        lag = SPECS["wfjobs_event_loop_lag_seconds"]
        self.loop_lag = Gauge(lag.name, lag.help, registry=registry)
        self._refreshers: list[Callable[[], Awaitable[None]]] = []

    def relay_timings(self) -> RelayTimings:
        """The relay's histogram, registered only where a relay runs: unlabelled, it
        would otherwise export a row of zeros from every process without one."""
        return RelayTimings(
            publish=_histogram(self.registry, "wfjobs_relay_publish_seconds", _DURATION_BUCKETS)
        )

    def add_reading(self, read: Callable[[], Iterable[Metric]]) -> None:
        """Export the families ``read`` builds, calling it at every scrape."""
        self.registry.register(_Readings(read))

    def add_collector(self, collector: Collector, refresh: Callable[[], Awaitable[None]]) -> None:
        """Export ``collector``, awaiting ``refresh`` before every scrape renders it."""
        self.registry.register(collector)
        self._refreshers.append(refresh)

    async def exposition(self) -> bytes:
        """The text format of everything registered, read fresh (or from its cache)."""
        for refresh in self._refreshers:
            await refresh()
        # Rendering walks every series; off the loop, as the hot path keeps observing.
        return await asyncio.to_thread(generate_latest, self.registry)


def claim_families(stats: ClaimStats) -> Iterator[Metric]:
    yield counter("wfjobs_jobs_claimed_total", stats.claimed)
    yield labelled(
        "wfjobs_jobs_settled_total",
        {outcome: getattr(stats, outcome) for outcome in SETTLE_OUTCOMES},
    )
    yield counter("wfjobs_lease_losses_total", stats.lease_lost)
    yield counter("wfjobs_jobs_handed_back_total", stats.handed_back)


def sweeper_families(sweeper: Sweeper) -> Iterator[Metric]:
    deadlines = sweeper.deadlines
    yield counter("wfjobs_sweeps_total", sweeper.sweeps)
    yield labelled(
        "wfjobs_swept_jobs_total",
        {
            "requeued": sweeper.requeued,
            "dead": sweeper.dead,
            "cancelled": sweeper.cancelled,
            "job_deadline": deadlines.job_deadlines,
            "step_timeout": deadlines.step_timeouts,
            "step_fallback": deadlines.fallbacks,
        },
    )


def relay_families(stats: RelayStats) -> Iterator[Metric]:
    yield counter("wfjobs_relay_events_published_total", stats.published)
    yield counter("wfjobs_relay_events_failed_total", stats.failed)
    yield counter("wfjobs_relay_transient_faults_total", stats.transient)


def request_lag_families(lag: Mapping[int, int] | None) -> Iterator[Metric]:
    if lag is not None:
        yield labelled(
            "wfjobs_request_lag_records", {str(part): records for part, records in lag.items()}
        )


__all__ = [
    "CATALOGUE",
    "CONTENT_TYPE",
    "MAX_LABEL_SETS",
    "OTHER_LABEL",
    "SETTLE_OUTCOMES",
    "SPECS",
    "SWEEP_ACTIONS",
    "ClaimTimings",
    "MetricSpec",
    "Metrics",
    "RelayTimings",
    "claim_families",
    "counter",
    "exported_family",
    "gauge",
    "labelled",
    "relay_families",
    "request_lag_families",
    "sweeper_families",
]
