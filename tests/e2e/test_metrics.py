"""``/metrics`` of a real worker process after 100 jobs, against what really happened.

One worker with every role runs 100 jobs from the request topic: most succeed
at once, some fail their embed step once and succeed on the retry, some fail
it every time and end DEAD. Then the worker's ``/metrics`` (scraped with no
token) must say what the database says (jobs per status, the outbox once the
relay drained it, the retries and deaths the attempt history records) and what
the step handlers themselves recorded (one step-duration observation per call).
"""

from __future__ import annotations

from collections import Counter

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.e2e.conftest import PARTITIONS
from tests.e2e.harness import Stack, wait_until
from tests.workflows_fixtures import EMBED, REVIEW, TOKENIZE, envelope

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

JOBS = 100
RETRIED_ONCE = 15
DEAD = 10
STEP_OF = {TOKENIZE: "tokenize", EMBED: "embed", REVIEW: "review"}
TERMINAL = ("COMPLETED", "FAILED", "DEAD")


async def _scrape(url: str) -> list[Sample]:
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        response = await http.get("/metrics")
    assert response.status_code == 200, response.text
    return [
        sample
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    ]


def _values(samples: list[Sample], name: str, *keys: str) -> dict[tuple[str, ...], float]:
    """``name``'s samples keyed by the values of the labels ``keys``, summed over the rest."""
    found: Counter[tuple[str, ...]] = Counter()
    for sample in samples:
        if sample.name == name:
            found[tuple(sample.labels[key] for key in keys)] += sample.value
    return dict(found)


async def _rows(stack: Stack, sql: str) -> list[tuple[object, ...]]:
    async with stack.pool.connection() as conn:
        cursor = await conn.execute(sql)
        return list(await cursor.fetchall())


async def test_metrics_match_the_database_and_the_handlers_after_100_jobs(stack: Stack) -> None:
    worker = await stack.start_worker(
        "w1",
        WFJOBS_CLAIM_LOOPS="4",
        WFJOBS_METRICS_DB_CACHE_S="0.2",
        WFJOBS_OWNERSHIP_CHECK_S="1",
    )
    workflow = envelope(name="e2e-metrics", review="invoke")
    await stack.put_workflow(worker, workflow)

    for index in range(JOBS):
        job_input: dict[str, str] = {"text": f"job number {index}"}
        if index < DEAD:
            job_input["embed_fail"] = "UNAVAILABLE"
        elif index < DEAD + RETRIED_ONCE:
            job_input["embed_fail"] = "UNAVAILABLE@1"
        stack.produce_request(workflow["name"], job_input)
    stack.flush()

    async def all_ended() -> bool | None:
        rows = await _rows(
            stack,
            "SELECT count(*) FROM workflow_run WHERE status IN ('COMPLETED', 'FAILED', 'DEAD')",
        )
        return True if rows[0][0] == JOBS else None

    async def relay_drained() -> bool | None:
        rows = await _rows(
            stack, "SELECT count(*) FROM workflow_run_events_outbox WHERE status <> 'PUBLISHED'"
        )
        return True if rows[0][0] == 0 else None

    try:
        await wait_until(all_ended, timeout_s=120)
        await wait_until(relay_drained, timeout_s=60)
    except TimeoutError:
        raise AssertionError("the jobs did not all end\n" + stack.worker_logs()) from None

    by_status = dict(
        await _rows(stack, "SELECT status, count(*) FROM workflow_run GROUP BY status")
    )
    assert by_status == {"COMPLETED": JOBS - DEAD, "DEAD": DEAD}, by_status

    async def lag_read() -> list[Sample] | None:
        samples = await _scrape(worker.url)
        lag = _values(samples, "wfjobs_request_lag_records", "partition")
        return samples if lag and not any(lag.values()) else None

    # The request lag is the ownership watchdog's reading of the group (every
    # second here); it reaches 0 once the agent's offsets are committed.
    samples = await wait_until(lag_read, timeout_s=30, interval_s=0.5)

    # The fleet's figures are the database's.
    jobs_gauge = _values(samples, "wfjobs_jobs", "status")
    for status in ("QUEUED", "RUNNING", "WAITING", "COMPLETED", "FAILED", "DEAD", "CANCELLED"):
        assert jobs_gauge[(status,)] == by_status.get(status, 0), (status, jobs_gauge)
    assert _values(samples, "wfjobs_queued_oldest_age_seconds") == {(): 0.0}
    assert _values(samples, "wfjobs_outbox_pending_events") == {(): 0.0}
    assert _values(samples, "wfjobs_outbox_failed_events") == {(): 0.0}
    published = (await _rows(stack, "SELECT count(*) FROM workflow_run_events_outbox"))[0][0]
    assert _values(samples, "wfjobs_relay_events_published_total") == {(): published}
    assert set(_values(samples, "wfjobs_request_lag_records", "partition")) == {
        (str(partition),) for partition in range(PARTITIONS)
    }

    # One step-duration observation per handler call, per (workflow, step).
    calls = Counter(STEP_OF[call.method] for call in stack.calls())
    assert calls["tokenize"] == JOBS
    assert calls["embed"] == JOBS + RETRIED_ONCE + 2 * DEAD
    step_counts = _values(samples, "wfjobs_step_duration_seconds_count", "workflow", "step")
    assert step_counts == {
        (workflow["name"], step): float(count) for step, count in calls.items()
    }, (step_counts, calls)
    errors = _values(
        samples, "wfjobs_step_duration_seconds_count", "workflow", "step", "outcome"
    ).get((workflow["name"], "embed", "error"))
    assert errors == RETRIED_ONCE + 3 * DEAD

    # Claims, retries and deaths: what the attempt history recorded.
    outcomes = dict(
        await _rows(stack, "SELECT outcome, count(*) FROM workflow_run_attempt GROUP BY outcome")
    )
    attempts = sum(outcomes.values())
    settled = _values(samples, "wfjobs_jobs_settled_total", "outcome")
    assert settled[("retried",)] == outcomes["RETRY_SCHEDULED"] == RETRIED_ONCE + 2 * DEAD
    assert settled[("dead",)] == outcomes["DEAD"] == DEAD
    assert settled[("completed",)] == outcomes["COMPLETED"] == JOBS - DEAD
    assert _values(samples, "wfjobs_jobs_claimed_total") == {(): attempts}
    claim_latency = _values(samples, "wfjobs_claim_latency_seconds_count", "workflow")
    assert claim_latency == {(workflow["name"],): attempts}
    segments = _values(samples, "wfjobs_segment_duration_seconds_count", "workflow")
    assert segments == {(workflow["name"],): attempts}
    assert _values(samples, "wfjobs_lease_losses_total") == {(): 0.0}

    # Aggregates only: no job id anywhere on the page.
    job_ids = [str(row[0]) for row in await _rows(stack, "SELECT job_id FROM workflow_run")]
    assert not any(sample.labels.get("job_id") for sample in samples)
    text = " ".join(f"{s.name}{s.labels}" for s in samples)
    assert not any(job_id in text for job_id in job_ids)
