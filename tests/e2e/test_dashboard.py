"""The dashboard in a real browser (Debian's Chromium, headless) against a real worker.

A person opens the dashboard, gives it a token, submits a job of the sample
workflow, watches it park on its review step without reloading the page,
answers the review through the form built from the step's response type, and
sees the job complete. Screenshots of the fleet page and the job page are left
in the test artefacts directory.
"""

from __future__ import annotations

import asyncio
import base64
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from google.protobuf import descriptor_pb2, struct_pb2
from playwright.async_api import Browser, ConsoleMessage, Page, Route, async_playwright

from tests.browser import artifacts_dir, chromium_executable
from tests.e2e.harness import Stack
from workflows.samples.build import load_workflow

# Installing Chromium on a machine without it (apt-get) runs in this module's set-up.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

SAMPLE = "embed-and-review"
TIMEOUT_MS = 30_000


@pytest.fixture(scope="module")
def chromium() -> str:
    return chromium_executable()


@pytest.fixture
async def browser(chromium: str) -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=chromium, headless=True)
        try:
            yield launched
        finally:
            await launched.close()


async def _worker_url(stack: Stack) -> str:
    worker = await stack.start_worker(
        "dashboard-w1",
        WFJOBS_HANDLERS="workflows.samples.handlers",
        WFJOBS_WATCH_POLL_S="0.2",
    )
    await stack.put_workflow(worker, load_workflow())
    return worker.url


async def _submit(
    stack: Stack, url: str, payload: dict[str, Any], *, workflow: str = SAMPLE
) -> str:
    """A job of a stored workflow, submitted through the API; its id."""
    async with httpx.AsyncClient(base_url=url, timeout=10, headers=stack.headers) as http:
        answer = await http.post(
            "/v1/workflow-runs", json={"workflow_name": workflow, "input": payload}
        )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["job"]["job_id"])


async def _sign_in(page: Page, token: str) -> None:
    # Without a token the first call answers 401 and the dashboard asks for one.
    await page.wait_for_selector("#token-dialog[open]", timeout=TIMEOUT_MS)
    await page.fill("#token-input", token)
    await page.click("#token-save")


async def _signed_in(browser: Browser, url: str, token: str) -> Page:
    """A new page on the dashboard, signed in with ``token``, its overview shown."""
    page = await browser.new_page()
    await page.goto(url + "/dashboard/")
    await _sign_in(page, token)
    await page.wait_for_selector("#status-tiles", timeout=TIMEOUT_MS)
    return page


async def test_submit_watch_it_park_answer_the_review_and_see_it_complete(
    stack: Stack, browser: Browser
) -> None:
    url = await _worker_url(stack)
    artifacts = artifacts_dir()
    page = await browser.new_page(viewport={"width": 1366, "height": 900})
    problems: list[str] = []

    def note(message: ConsoleMessage) -> None:
        if message.type == "error":
            problems.append(message.text)

    try:
        await page.goto(url + "/dashboard/")
        await _sign_in(page, stack.token)
        # From here on, nothing the page does may fail (the 401 above asked for the token).
        page.on("console", note)
        page.on("pageerror", lambda error: problems.append(str(error)))
        await page.wait_for_selector("#status-tiles [data-status=QUEUED]", timeout=TIMEOUT_MS)

        # Submit a job of the sample workflow from the jobs page.
        await page.click("nav a[data-nav=jobs]")
        await page.click("#submit-panel summary")
        await page.wait_for_selector(f"#submit-workflow option[value='{SAMPLE}']", state="attached")
        await page.select_option("#submit-workflow", SAMPLE)
        await page.fill("#submit-input", '{"text": "review this in a browser"}')
        # Marks this page load: a reload would lose it.
        await page.evaluate("window.sameLoad = true")
        await page.click("#submit-job")

        # The job page follows it live: it parks on the review step.
        await page.wait_for_selector("#job-title [data-status=WAITING]", timeout=TIMEOUT_MS)
        await page.wait_for_selector("#timeline [data-event=TYPE_WAITING]", timeout=TIMEOUT_MS)
        job_id = (await page.inner_text("#job-title .mono")).strip()
        assert (await stack.job(job_id)).status == "WAITING"

        # Answer the review through the form built from ReviewDecision.
        await page.wait_for_selector("#complete-form", timeout=TIMEOUT_MS)
        await page.check("#complete-form [data-field=approved]")
        await page.fill("#complete-form [data-field=note]", "looks right")
        await page.click("#complete-submit")

        await page.wait_for_selector("#job-title [data-status=COMPLETED]", timeout=TIMEOUT_MS)
        await page.wait_for_selector("#timeline [data-event=TYPE_COMPLETED]", timeout=TIMEOUT_MS)
        await page.wait_for_selector("#job-result", timeout=TIMEOUT_MS)
        assert await page.evaluate("window.sameLoad") is True, "the page was reloaded"
        job = await stack.job(job_id)
        assert job.status == "COMPLETED"
        assert job.result is not None and job.result["approved"] is True
        events = [
            await item.get_attribute("data-event")
            for item in await page.query_selector_all("#timeline [data-event]")
        ]
        assert events[0] == "TYPE_ACCEPTED" and events[-1] == "TYPE_COMPLETED"
        assert events.count("TYPE_WAITING") == 1
        # Let the last refresh land before the picture.
        await asyncio.sleep(0.3)
        await page.screenshot(path=str(artifacts / "dashboard-job.png"), full_page=True)

        # The fleet at a glance counts it (its answer is cached for a few seconds).
        await page.click("nav a[data-nav=fleet]")
        completed = page.locator(
            "#status-tiles [data-status=COMPLETED] .n", has_text=re.compile("^1$")
        )
        await completed.wait_for(timeout=TIMEOUT_MS)
        await page.wait_for_selector("#outbox-health", timeout=TIMEOUT_MS)
        await page.wait_for_selector("#workers", timeout=TIMEOUT_MS)
        await page.screenshot(path=str(artifacts / "dashboard-fleet.png"), full_page=True)
    except Exception as exc:
        # What the page showed and what the worker said, for whoever reads the failure.
        await page.screenshot(path=str(artifacts / "dashboard-failure.png"), full_page=True)
        raise AssertionError(
            f"{exc}\npage problems: {problems}\nworker log:\n{stack.worker_logs(80)}"
        ) from exc
    assert problems == []


async def test_a_job_link_with_a_malformed_escape_says_so_without_a_page_error(
    stack: Stack, browser: Browser
) -> None:
    url = await _worker_url(stack)
    page = await browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    await page.goto(url + "/dashboard/")
    await _sign_in(page, stack.token)
    await page.wait_for_selector("#status-tiles", timeout=TIMEOUT_MS)
    await page.goto(url + "/dashboard/#/jobs/%zz")
    message = page.locator("#job-title", has_text="No such job")
    await message.wait_for(timeout=TIMEOUT_MS)
    assert "%zz" in await page.inner_text("#view")
    assert errors == []


async def test_the_job_id_of_a_link_goes_to_the_api_encoded(stack: Stack, browser: Browser) -> None:
    url = await _worker_url(stack)
    page = await _signed_in(browser, url, stack.token)
    asked: list[str] = []
    page.on("request", lambda request: asked.append(request.url))
    # Decoded, "?" would end the path: the API would be asked about job "a".
    await page.goto(url + "/dashboard/#/jobs/a%3Fb")
    notice = page.locator("#notice", has_text="INVALID_ARGUMENT")
    await notice.wait_for(timeout=TIMEOUT_MS)
    jobs = [u.removeprefix(url) for u in asked if "/v1/workflow-runs" in u]
    assert "/v1/workflow-runs/a%3Fb" in jobs and "/v1/workflow-runs/a%3Fb:explain" in jobs, jobs
    assert not any(u.startswith("/v1/workflow-runs/a?") for u in jobs), jobs


async def test_the_header_clock_moves_every_second(stack: Stack, browser: Browser) -> None:
    url = await _worker_url(stack)
    page = await browser.new_page()
    await page.goto(url + "/dashboard/")
    await page.wait_for_selector("#clock:not(:empty)", timeout=TIMEOUT_MS)
    first = await page.inner_text("#clock")
    # Within a few seconds, not the fifteen a slow refresh would take.
    moved = page.locator("#clock").filter(has_not_text=first)
    await moved.wait_for(timeout=3_000)


async def test_a_watched_job_that_is_deleted_reads_removed_not_ended(
    stack: Stack, browser: Browser
) -> None:
    url = await _worker_url(stack)
    page = await browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    job_id = await _submit(stack, url, {"text": "to be removed"})
    await stack.wait_for_job(job_id, ["WAITING"])
    await page.goto(url + "/dashboard/")
    await _sign_in(page, stack.token)
    await page.wait_for_selector("#status-tiles", timeout=TIMEOUT_MS)
    await page.goto(f"{url}/dashboard/#/jobs/{job_id}")
    await page.wait_for_selector("#timeline [data-event=TYPE_WAITING]", timeout=TIMEOUT_MS)
    # What job retention does to a settled job, done to this one while it is watched.
    async with stack.pool.connection() as conn:
        await conn.execute("DELETE FROM workflow_run_events_outbox WHERE job_id = %s", (job_id,))
        await conn.execute("DELETE FROM workflow_run WHERE job_id = %s", (job_id,))
    gone = page.locator("#timeline [data-event=gone]", has_text="removed")
    await gone.wait_for(timeout=TIMEOUT_MS)
    assert "ended" not in await gone.inner_text()
    assert "?" not in await page.inner_text("#timeline")
    assert "removed" in await page.inner_text("#job-actions")
    assert errors == []


def _free_review_workflow() -> dict[str, Any]:
    """The sample's review, answered with a free-form google.protobuf.Struct."""
    sample = load_workflow()
    files = descriptor_pb2.FileDescriptorSet()
    files.ParseFromString(base64.b64decode(sample["schema"]["descriptorSetBase64"]))
    struct_file = descriptor_pb2.FileDescriptorProto()
    struct_pb2.DESCRIPTOR.CopyToProto(struct_file)
    desk = files.file[0]
    desk.dependency.append(struct_file.name)
    desk.service.add(name="FreeDesk").method.add(
        name="Review",
        input_type=".wfjobs.samples.v1.ReviewRequest",
        output_type=".google.protobuf.Struct",
    )
    files.file.insert(0, struct_file)
    return {
        "name": "free-review",
        "schema": {"descriptorSetBase64": base64.b64encode(files.SerializeToString()).decode()},
        "inputType": "wfjobs.samples.v1.Text",
        "steps": [
            {
                "name": "review",
                "target": "local",
                "method": "wfjobs.samples.v1.FreeDesk/Review",
                "rules": ["text = input.text"],
                "completion": "external",
            }
        ],
    }


async def test_a_struct_response_is_answered_with_the_object_itself(
    stack: Stack, browser: Browser
) -> None:
    url = await _worker_url(stack)
    worker = stack.workers[-1]
    await stack.put_workflow(worker, _free_review_workflow())
    job_id = await _submit(stack, url, {"text": "free-form"}, workflow="free-review")
    await stack.wait_for_job(job_id, ["WAITING"])
    page = await _signed_in(browser, url, stack.token)
    await page.goto(f"{url}/dashboard/#/jobs/{job_id}")
    await page.wait_for_selector("#complete-form textarea", timeout=TIMEOUT_MS)
    assert "fields" not in await page.inner_text("#complete-form")
    await page.fill("#complete-form textarea", '{"score": 3, "tags": ["a"]}')
    await page.click("#complete-submit")
    await page.wait_for_selector("#job-title [data-status=COMPLETED]", timeout=TIMEOUT_MS)
    job = await stack.job(job_id)
    review = next(c for c in job.checkpoints if c["name"] == "review")
    assert review["response"] == {"score": 3, "tags": ["a"]}


async def test_a_running_job_asked_to_cancel_reads_cancel_requested_not_ended(
    stack: Stack, browser: Browser
) -> None:
    url = await _worker_url(stack)
    job_id = await _submit(stack, url, {"text": "cancel me"})
    await stack.wait_for_job(job_id, ["WAITING"])
    # RUNNING on a worker that vanished, with a cancel asked: the sweeper will
    # settle it once the lease passes, an hour from now.
    async with stack.pool.connection() as conn:
        await conn.execute(
            "UPDATE workflow_run SET status = 'RUNNING', outstanding_step = NULL,"
            " lease_owner = 'vanished', lease_until = now() + interval '1 hour',"
            " cancel_requested_at = now() WHERE job_id = %s",
            (job_id,),
        )
    page = await _signed_in(browser, url, stack.token)
    await page.goto(f"{url}/dashboard/#/jobs/{job_id}")
    await page.wait_for_selector("#job-title [data-status=RUNNING]", timeout=TIMEOUT_MS)
    await page.wait_for_selector("#job-actions h2", timeout=TIMEOUT_MS)
    actions = await page.inner_text("#job-actions")
    assert "ended" not in actions
    assert "Cancel requested" in actions


async def test_a_parked_job_shows_its_reviewer_the_step_deadline(
    stack: Stack, browser: Browser
) -> None:
    url = await _worker_url(stack)
    timed = load_workflow()
    timed["name"] = "timed-review"
    for step in timed["steps"]:
        if step["name"] == "review":
            step["timeoutMs"] = 3_600_000
    await stack.put_workflow(stack.workers[-1], timed)
    job_id = await _submit(stack, url, {"text": "review in time"}, workflow="timed-review")
    await stack.wait_for_job(job_id, ["WAITING"])
    page = await _signed_in(browser, url, stack.token)
    await page.goto(f"{url}/dashboard/#/jobs/{job_id}")
    await page.wait_for_selector("#job-title [data-status=WAITING]", timeout=TIMEOUT_MS)
    deadline = page.locator("#job-summary", has_text="Answer by")
    await deadline.wait_for(timeout=TIMEOUT_MS)
    assert "in 59 min" in await page.inner_text("#step-deadline")


async def test_a_link_to_a_job_that_does_not_exist_says_no_such_job(
    stack: Stack, browser: Browser
) -> None:
    url = await _worker_url(stack)
    page = await _signed_in(browser, url, stack.token)
    await page.goto(f"{url}/dashboard/#/jobs/{uuid.uuid4()}")
    await page.locator("#job-title", has_text="No such job").wait_for(timeout=TIMEOUT_MS)
    assert "NOT_FOUND" in await page.inner_text("#view")
    # No watch was started for it, so none reports that it stopped.
    await asyncio.sleep(1)
    assert "live updates" not in await page.inner_text("body")


async def test_a_step_form_that_failed_to_load_is_shown_once_it_loads(
    stack: Stack, browser: Browser
) -> None:
    url = await _worker_url(stack)
    job_id = await _submit(stack, url, {"text": "review after a hiccup"})
    await stack.wait_for_job(job_id, ["WAITING"])
    page = await _signed_in(browser, url, stack.token)
    # The worker answers the first two asks for the form with a 503, then recovers.
    failures = {"left": 2}

    async def flaky(route: Route) -> None:
        if failures["left"] > 0:
            failures["left"] -= 1
            await route.fulfill(
                status=503,
                content_type="application/json",
                body='{"code": "UNAVAILABLE", "message": "the store is unreachable"}',
            )
        else:
            await route.continue_()

    await page.route("**/steps/*:form", flaky)
    await page.goto(f"{url}/dashboard/#/jobs/{job_id}")
    await page.locator("#job-actions", has_text="the store is unreachable").wait_for(
        timeout=TIMEOUT_MS
    )
    # The job stays parked and nothing else happens to it: no event brings a refresh.
    await page.wait_for_selector("#complete-form", timeout=15_000)
    assert failures["left"] == 0
    assert "unreachable" not in await page.inner_text("#job-actions")


async def _cancel_and_resume(stack: Stack, url: str, job_id: str) -> str:
    """The parked job ``job_id`` cancelled, then resumed through the API; the run's id."""
    async with httpx.AsyncClient(base_url=url, timeout=10, headers=stack.headers) as http:
        cancelled = await http.post(f"/v1/workflow-runs/{job_id}:cancel", json={})
        assert cancelled.status_code == 200, cancelled.text
        resumed = await http.post(f"/v1/workflow-runs/{job_id}:resume", json={})
    assert resumed.status_code == 201, resumed.text
    return str(resumed.json()["job"]["job_id"])


async def test_the_resume_events_link_the_other_job(stack: Stack, browser: Browser) -> None:
    url = await _worker_url(stack)
    job_id = await _submit(stack, url, {"text": "resume me"})
    await stack.wait_for_job(job_id, ["WAITING"])
    run_id = await _cancel_and_resume(stack, url, job_id)
    page = await _signed_in(browser, url, stack.token)
    await page.goto(f"{url}/dashboard/#/jobs/{job_id}")
    resumed = page.locator("#timeline [data-event=TYPE_RESUMED]")
    await resumed.wait_for(timeout=TIMEOUT_MS)
    await resumed.locator(f"a[href='#/jobs/{run_id}']").click()
    # The run's page, whose ACCEPTED links back to the job it resumes.
    await page.locator("#job-title .mono", has_text=run_id).wait_for(timeout=TIMEOUT_MS)
    accepted = page.locator("#timeline [data-event=TYPE_ACCEPTED]")
    await accepted.wait_for(timeout=TIMEOUT_MS)
    assert await accepted.locator(f"a[href='#/jobs/{job_id}']").count() == 1


async def test_a_job_refused_at_submit_is_resumed_with_the_current_definition(
    stack: Stack, browser: Browser
) -> None:
    url = await _worker_url(stack)
    # A request naming a workflow nobody has stored yet: recorded FAILED, no snapshot.
    job_id = str(stack.produce_request("later-review", {"text": "stored too late"}))
    stack.flush()
    await stack.wait_for_job(job_id, ["FAILED"])
    later = load_workflow()
    later["name"] = "later-review"
    await stack.put_workflow(stack.workers[-1], later)
    page = await _signed_in(browser, url, stack.token)
    await page.goto(f"{url}/dashboard/#/jobs/{job_id}")
    current = page.locator("#action-resume-current")
    await current.wait_for(timeout=TIMEOUT_MS)
    # Its own snapshot, which it lacks, cannot run it: that resume answers 409.
    assert await page.locator("#action-resume").count() == 0
    await current.click()
    resumes = page.locator(f"#job-summary a[href='#/jobs/{job_id}']")
    await resumes.wait_for(timeout=TIMEOUT_MS)
    await page.wait_for_selector("#job-title [data-status=WAITING]", timeout=TIMEOUT_MS)
    run_id = (await page.inner_text("#job-title .mono")).strip()
    assert run_id != job_id
    assert (await stack.job(job_id)).resumed_by == uuid.UUID(run_id)


async def test_an_ended_job_offers_both_resumes(stack: Stack, browser: Browser) -> None:
    url = await _worker_url(stack)
    job_id = await _submit(stack, url, {"text": "cancel, then resume"})
    await stack.wait_for_job(job_id, ["WAITING"])
    async with httpx.AsyncClient(base_url=url, timeout=10, headers=stack.headers) as http:
        cancelled = await http.post(f"/v1/workflow-runs/{job_id}:cancel", json={})
    assert cancelled.status_code == 200, cancelled.text
    page = await _signed_in(browser, url, stack.token)
    await page.goto(f"{url}/dashboard/#/jobs/{job_id}")
    await page.wait_for_selector("#action-resume", timeout=TIMEOUT_MS)
    await page.click("#action-resume-current")
    await page.locator(f"#job-summary a[href='#/jobs/{job_id}']").wait_for(timeout=TIMEOUT_MS)
    run_id = (await page.inner_text("#job-title .mono")).strip()
    assert (await stack.job(run_id)).resumed_from == uuid.UUID(job_id)


async def test_a_job_of_a_workflow_never_stored_is_not_offered_its_current_definition(
    stack: Stack, browser: Browser
) -> None:
    url = await _worker_url(stack)
    inline = load_workflow()
    inline["name"] = "inline-review"
    async with httpx.AsyncClient(base_url=url, timeout=10, headers=stack.headers) as http:
        submitted = await http.post(
            "/v1/workflow-runs", json={"workflow": inline, "input": {"text": "inline"}}
        )
        assert submitted.status_code == 201, submitted.text
        job_id = submitted.json()["job"]["job_id"]
        await stack.wait_for_job(job_id, ["WAITING"])
        cancelled = await http.post(f"/v1/workflow-runs/{job_id}:cancel", json={})
        assert cancelled.status_code == 200, cancelled.text
    page = await _signed_in(browser, url, stack.token)
    await page.goto(f"{url}/dashboard/#/jobs/{job_id}")
    await page.wait_for_selector("#action-resume", timeout=TIMEOUT_MS)
    # No stored definition to take: that resume would only answer 409.
    assert await page.locator("#action-resume-current").count() == 0


async def test_a_rejected_answer_says_why_after_the_job_fails(
    stack: Stack, browser: Browser
) -> None:
    url = await _worker_url(stack)
    job_id = await _submit(stack, url, {"text": "reject me"})
    await stack.wait_for_job(job_id, ["WAITING"])
    page = await _signed_in(browser, url, stack.token)
    await page.goto(f"{url}/dashboard/#/jobs/{job_id}")
    await page.wait_for_selector("#complete-form", timeout=TIMEOUT_MS)
    # Neither approved nor a note: the step's validate rule refuses it.
    await page.click("#complete-submit")
    await page.wait_for_selector("#job-title [data-status=FAILED]", timeout=TIMEOUT_MS)
    await page.wait_for_selector("#action-resume", timeout=TIMEOUT_MS)
    # The answer's outcome outlives the redraw of the actions the failure brings.
    outcome = page.locator("#action-result", has_text="REJECTED")
    await outcome.wait_for(timeout=5_000)
