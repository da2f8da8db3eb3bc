"""get-job's history, read as of the same moment as the job it belongs to."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from tests.integration.http.conftest import LiveApi
from tests.integration.http.test_watch import running_review_job

pytestmark = pytest.mark.asyncio

# What a retry commits, done by hand inside a transaction the test controls.
END_ATTEMPT_SQL = """
WITH ended AS (
    UPDATE workflow_run SET status = 'QUEUED', lease_until = NULL, updated_at = now()
     WHERE job_id = %(job_id)s
    RETURNING job_id, attempt, lease_owner, claimed_at
)
INSERT INTO workflow_run_attempt (job_id, attempt, worker, claimed_at, outcome, error, error_class)
SELECT job_id, attempt, lease_owner, claimed_at, 'RETRY_SCHEDULED', 'UNAVAILABLE', 'retryable'
  FROM ended
"""
WAITING_ON_THE_HISTORY_SQL = """
SELECT count(*) FROM pg_locks
 WHERE NOT granted AND relation = 'workflow_run_attempt'::regclass
"""


async def _read_while_an_attempt_ends(live_api: LiveApi, verb: str) -> dict[str, Any]:
    """``verb``'s answer about a RUNNING job whose attempt ends while the answer is read:
    the history is held still until the attempt has ended, so a read that took
    the job first must wait there, and then read what was so then."""
    job_id, _ = await running_review_job(live_api)
    dsn = live_api.runtime.settings.database_url
    async with await psycopg.AsyncConnection.connect(dsn) as ender:
        await ender.execute("LOCK TABLE workflow_run_attempt IN ACCESS EXCLUSIVE MODE")
        url = live_api.url + f"/v1/workflow-runs/{job_id}{verb}"
        got = asyncio.ensure_future(live_api.session.get(url, headers=live_api.auth))
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as probe:
            for _ in range(200):
                row = await (await probe.execute(WAITING_ON_THE_HISTORY_SQL)).fetchone()
                if row is not None and row[0]:
                    break
                await asyncio.sleep(0.02)
            else:
                got.cancel()
                raise AssertionError(f"{verb or 'get-job'} never read the history")
        await ender.execute(END_ATTEMPT_SQL, {"job_id": job_id})
        await ender.commit()
    response = await got
    assert response.status == 200, await response.text()
    answer: dict[str, Any] = await response.json()
    return answer


async def test_get_job_never_shows_a_running_attempt_as_ended(live_api: LiveApi) -> None:
    job = (await _read_while_an_attempt_ends(live_api, ""))["job"]
    history = job.get("history", [])
    if job["status"] == "RUNNING":
        assert history == [], f"attempt {job['attempt']} is RUNNING and ended: {history}"
    else:
        assert [a["outcome"] for a in history] == ["RETRY_SCHEDULED"]


async def test_explain_never_shows_a_running_attempt_as_ended(live_api: LiveApi) -> None:
    answer = await _read_while_an_attempt_ends(live_api, ":explain")
    history = answer.get("history", [])
    if answer["status"] == "RUNNING":
        assert history == [], f"the attempt is RUNNING and ended: {history}"
    else:
        assert [a["outcome"] for a in history] == ["RETRY_SCHEDULED"]
