"""``explain``: why a job is where it is, in plain sentences, with the facts behind each.

``explain_job`` is a pure function of ``ExplainFacts`` (the row, its attempt
history, its events' outbox state, the database clock and the queue around
it), which ``Jobs.explain`` reads. Every time in a sentence is the row's own,
on the database clock, written by ``when``; "now" is the database's clock at
the read (``as_of``), so "in 12s" and "expired 3s ago" mean what they say.

The answer has four parts: why (the state and its cause), next (what happens
without anyone acting), actions (the exact commands, CLI and HTTP, an operator
can run on the job now) and delivery (where its events stand in the outbox).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from schemas.contract import api_pb2
from store.records import Attempt, Job, OutboxState
from store.states import Status
from streams.convert import attempt_message, status_value


@dataclass(frozen=True, slots=True)
class ExplainFacts:
    job: Job
    history: tuple[Attempt, ...]
    outbox: OutboxState
    # The database's clock when the facts were read.
    now: datetime
    # QUEUED and claimable: how many claimable jobs a claim takes first
    # (counted no further than ``ahead_limit``); None otherwise.
    queued_ahead: int | None
    ahead_limit: int
    # Admission control: the cap (0: off) and the backlog counted up to it.
    admission_cap: int
    queue_depth: int
    sweep_interval_s: float


def when(value: datetime) -> str:
    """A time as every sentence writes it: UTC, to the millisecond."""
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _span(seconds: float) -> str:
    seconds = abs(seconds)
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _relative(value: datetime, now: datetime) -> str:
    delta = (value - now).total_seconds()
    return f"in {_span(delta)}" if delta >= 0 else f"{_span(delta)} ago"


class _Answer:
    def __init__(self, facts: ExplainFacts) -> None:
        self.facts = facts
        self.job = facts.job
        self.message = api_pb2.ExplainJobResponse(
            job_id=str(facts.job.job_id),
            status=status_value(facts.job.status),  # type: ignore[arg-type]
        )

    def why(self, sentence: str, **evidence: object) -> None:
        _finding(self.message.why.add(), sentence, evidence)

    def next(self, sentence: str, **evidence: object) -> None:
        _finding(self.message.next.add(), sentence, evidence)

    def action(self, description: str, command: str, http: str) -> None:
        self.message.actions.add(description=description, command=command, http=http)

    @property
    def id(self) -> str:
        return str(self.job.job_id)

    def at(self, value: datetime) -> str:
        return f"{when(value)} ({_relative(value, self.facts.now)})"


def _finding(target: api_pb2.Finding, sentence: str, evidence: Mapping[str, object]) -> None:
    target.sentence = sentence
    for name, value in evidence.items():
        if value is None or value == "":
            continue
        target.evidence[name] = when(value) if isinstance(value, datetime) else str(value)


def explain_job(facts: ExplainFacts) -> api_pb2.ExplainJobResponse:
    """The explanation of ``facts.job``, sentence by sentence."""
    answer = _Answer(facts)
    explain_state = _STATES[facts.job.status]
    explain_state(answer)
    _links(answer)
    _delivery(answer)
    message = answer.message
    message.history.extend(attempt_message(attempt) for attempt in facts.history)
    message.as_of.FromDatetime(facts.now)
    return message


# --------------------------------------------------------------------------- states


def _last(answer: _Answer) -> Attempt | None:
    return answer.facts.history[-1] if answer.facts.history else None


def _attempts_word(count: int) -> str:
    return f"{count} attempt" + ("" if count == 1 else "s")


def _past_deadline(answer: _Answer) -> bool:
    """Whether the job's whole-job deadline has passed: the sweeper then fails it
    (``_deadline`` says so), and requeues it or settles it DEAD no more."""
    deadline = answer.job.deadline_at
    return deadline is not None and deadline <= answer.facts.now


def _queued(answer: _Answer) -> None:
    job, facts = answer.job, answer.facts
    last = _last(answer)
    if job.attempt >= job.max_attempts:
        answer.why(
            f"Job {answer.id} is QUEUED but all of its {_attempts_word(job.max_attempts)} are "
            f"used up ({job.attempt}/{job.max_attempts}): no worker may claim it.",
            attempt=job.attempt,
            max_attempts=job.max_attempts,
            last_error=job.error,
        )
        if not _past_deadline(answer):
            answer.next(
                f"The sweeper settles it DEAD on its next pass "
                f"(every {facts.sweep_interval_s:g}s).",
                sweep_interval_s=facts.sweep_interval_s,
            )
    elif job.deadline_at is not None and job.deadline_at <= facts.now:
        answer.why(
            f"Job {answer.id} is QUEUED, but its whole-job deadline passed at "
            f"{answer.at(job.deadline_at)}: no worker may claim it.",
            deadline=job.deadline_at,
            attempt=job.attempt,
            max_attempts=job.max_attempts,
        )
    elif job.run_after > facts.now:
        cause = ""
        if last is not None and last.outcome in ("RETRY_SCHEDULED", "SWEPT"):
            held = f" on worker {last.worker}" if last.worker else ""
            cause = (
                f" after attempt {last.attempt}/{job.max_attempts}{held} ended at "
                f"{when(last.ended_at)} with: {last.error} (classified {last.error_class})"
            )
        answer.why(
            f"Job {answer.id} is QUEUED, waiting for its retry backoff until "
            f"{answer.at(job.run_after)}{cause}.",
            run_after=job.run_after,
            attempt=job.attempt,
            max_attempts=job.max_attempts,
            last_error=last.error if last else job.error,
            error_class=last.error_class if last else None,
            worker=last.worker if last else None,
        )
        answer.next(
            f"At {when(job.run_after)} it becomes claimable and the next free worker runs "
            f"attempt {job.attempt + 1} of {job.max_attempts}.",
            run_after=job.run_after,
        )
    else:
        ahead = facts.queued_ahead or 0
        shown = f"{ahead}" if ahead < facts.ahead_limit else f"at least {ahead}"
        line = (
            "no claimable job is ahead of it in claim order, so no worker has had a free "
            "runner since"
            if ahead == 0
            else f"{shown} claimable job(s) are ahead of it in claim order"
        )
        answer.why(
            f"Job {answer.id} is QUEUED and claimable since {answer.at(job.run_after)}; {line}.",
            run_after=job.run_after,
            queued_ahead=shown,
            attempt=job.attempt,
            max_attempts=job.max_attempts,
        )
        if last is not None and last.outcome == "HANDED_BACK":
            answer.why(
                f"Worker {last.worker} handed attempt {last.attempt} back at "
                f"{when(last.ended_at)} (it was stopping, or could not reach the store); "
                "the attempt was not counted.",
                worker=last.worker,
                ended_at=last.ended_at,
            )
        if facts.admission_cap and facts.queue_depth >= facts.admission_cap:
            answer.why(
                f"The queue is full: {facts.queue_depth} or more jobs are QUEUED, the admission "
                f"cap (WFJOBS_MAX_QUEUED_JOBS={facts.admission_cap}); new submissions are "
                "refused until the backlog drains, and this job waits its turn behind admission.",
                queue_depth=facts.queue_depth,
                admission_cap=facts.admission_cap,
            )
        answer.next(
            f"The next free worker claims it (attempt {job.attempt + 1} of "
            f"{job.max_attempts}); the jobs ahead of it go first.",
            queued_ahead=shown,
        )
    _deadline(answer)
    _cancel_action(answer)


def _running(answer: _Answer) -> None:
    job, facts = answer.job, answer.facts
    worker = job.lease_owner or "(unknown)"
    claimed = f", claimed at {when(job.claimed_at)}" if job.claimed_at else ""
    heard = when(job.updated_at)
    if job.lease_until is not None and job.lease_until >= facts.now:
        answer.why(
            f"Job {answer.id} is RUNNING attempt {job.attempt}/{job.max_attempts}, held by "
            f"worker {worker}{claimed}; its lease ends at {answer.at(job.lease_until)} and it "
            f"was last heard from at {heard} (a heartbeat or checkpoint).",
            worker=worker,
            claimed_at=job.claimed_at,
            lease_until=job.lease_until,
            last_heartbeat=job.updated_at,
            attempt=job.attempt,
        )
        answer.next(
            f"Worker {worker} renews the lease while the segment makes progress and settles "
            f"the job when it ends; if it stops renewing, the lease passes at "
            f"{when(job.lease_until)} and the sweeper takes the job back.",
            lease_until=job.lease_until,
        )
    else:
        lease = when(job.lease_until) if job.lease_until else "(none)"
        answer.why(
            f"Job {answer.id} is RUNNING attempt {job.attempt}/{job.max_attempts}, but the "
            f"lease of worker {worker} expired at {lease}"
            + (f" ({_relative(job.lease_until, facts.now)})" if job.lease_until else "")
            + f"; it was last heard from at {heard}.",
            worker=worker,
            claimed_at=job.claimed_at,
            lease_until=job.lease_until,
            last_heartbeat=job.updated_at,
            attempt=job.attempt,
        )
        if job.cancel_requested_at is None and not _past_deadline(answer):
            then = (
                f"requeues it for attempt {job.attempt + 1} of {job.max_attempts}"
                if job.attempt < job.max_attempts
                else "settles it DEAD: this was its last attempt"
            )
            answer.next(
                f"The sweeper takes it on its next pass (every {facts.sweep_interval_s:g}s) "
                f"and {then}.",
                sweep_interval_s=facts.sweep_interval_s,
            )
    if job.cancel_requested_at is not None:
        reason = f" ({job.cancel_reason})" if job.cancel_reason else ""
        answer.why(
            f"Cancel was requested at {when(job.cancel_requested_at)}{reason}.",
            cancel_requested_at=job.cancel_requested_at,
            cancel_reason=job.cancel_reason,
        )
        if job.lease_until is not None and job.lease_until >= facts.now:
            answer.next(
                f"Worker {worker} sees the request on its next heartbeat, stops the step and "
                "settles the job CANCELLED; if it cannot, the sweeper does once the lease passes.",
                worker=worker,
            )
        else:
            answer.next(
                f"The lease has passed: the sweeper settles the job CANCELLED on its next pass "
                f"(every {facts.sweep_interval_s:g}s).",
                sweep_interval_s=facts.sweep_interval_s,
            )
    _deadline(answer)
    if job.cancel_requested_at is None:
        _cancel_action(answer)


def _waiting(answer: _Answer) -> None:
    job = answer.job
    step = job.outstanding_step or ""
    parked = next((a for a in reversed(answer.facts.history) if a.outcome == "PARKED"), None)
    since = parked.ended_at if parked is not None else job.updated_at
    by = f" by worker {parked.worker}" if parked is not None and parked.worker else ""
    answer.why(
        f"Job {answer.id} is WAITING: parked on external step {step!r} since "
        f"{answer.at(since)}{by}.",
        step=step,
        parked_at=since,
        worker=parked.worker if parked else None,
    )
    if job.review_request is not None:
        answer.why(
            f"The step's reviewer is asked: {_compact(job.review_request)}.",
            review_request=_compact(job.review_request),
        )
    if job.step_deadline_at is not None and job.step_deadline_at <= answer.facts.now:
        answer.next(
            f"Its step deadline passed at {answer.at(job.step_deadline_at)}: the sweeper fails "
            "the job (or takes the step's declared fallback) on its next pass (every "
            f"{answer.facts.sweep_interval_s:g}s), unless someone completes step {step!r} first.",
            step_deadline=job.step_deadline_at,
        )
    elif job.step_deadline_at is not None:
        answer.next(
            f"Nothing happens until someone completes step {step!r}; its step deadline passes "
            f"at {answer.at(job.step_deadline_at)}, and then the job fails (or takes the "
            "step's declared fallback).",
            step_deadline=job.step_deadline_at,
        )
    else:
        answer.next(
            f"Nothing happens until someone completes step {step!r}: it has no step deadline.",
            step=step,
        )
    _deadline(answer)
    answer.action(
        f"Complete step {step!r} with the reviewer's response (JSON of the step's output type).",
        f"wfjobs complete {answer.id} {step} --response JSON",
        # The verb needs its body: the response, JSON as in the command.
        f'POST /v1/workflow-runs/{answer.id}/steps/{step}:complete {{"response": JSON}}',
    )
    _cancel_action(answer)


def _completed(answer: _Answer) -> None:
    job = answer.job
    last = _last(answer)
    on = f" on worker {last.worker}" if last is not None and last.worker else ""
    verdict = f" with verdict {job.verdict!r}" if job.verdict else ""
    answer.why(
        f"Job {answer.id} COMPLETED at {when(job.updated_at)}{verdict}, on attempt "
        f"{job.attempt}/{job.max_attempts}{on}.",
        completed_at=job.updated_at,
        attempt=job.attempt,
        worker=last.worker if last else None,
    )
    answer.next("Nothing: COMPLETED is terminal.")


# The outcomes of an attempt that ended with its job FAILED. After any other
# (parked, requeued) the job failed while no worker held it.
_FAILED_ATTEMPTS = frozenset({"FAILED", "DEADLINE_PASSED"})


def _failed(answer: _Answer) -> None:
    job = answer.job
    last = _last(answer)
    if last is None:
        answer.why(
            f"Job {answer.id} FAILED at {when(job.updated_at)} before any attempt ran: "
            f"{job.error}.",
            failed_at=job.updated_at,
            error=job.error,
        )
    elif last.outcome not in _FAILED_ATTEMPTS and job.verdict:
        # Rejected while WAITING: the last attempt only parked the job.
        answer.why(
            f"Job {answer.id} FAILED at {when(job.updated_at)}: the response to step "
            f"{job.outstanding_step!r} was rejected by its validate rules: {job.error}.",
            failed_at=job.updated_at,
            error=job.error,
            error_class="verdict",
            step=job.outstanding_step,
            verdict=job.verdict,
        )
    elif last.outcome not in _FAILED_ATTEMPTS or last.outcome == "DEADLINE_PASSED":
        # No worker held it (QUEUED or WAITING), or the deadline ended the
        # attempt that did: the sweeper failed it, not a step.
        answer.why(
            f"Job {answer.id} FAILED at {when(job.updated_at)}: a deadline passed: {job.error}.",
            failed_at=job.updated_at,
            error=job.error,
            error_class="deadline",
        )
    else:
        on = f" on worker {last.worker}" if last.worker else ""
        kind = (
            "its step's response was rejected by the validate rules"
            if job.verdict
            else (f"classified {last.error_class}")
        )
        answer.why(
            f"Job {answer.id} FAILED at {when(job.updated_at)} on attempt "
            f"{last.attempt}/{job.max_attempts}{on}: {job.error} ({kind}).",
            failed_at=job.updated_at,
            error=job.error,
            error_class=last.error_class,
            worker=last.worker,
            verdict=job.verdict,
        )
    if last is None and job.deadline_at is not None and job.error and "deadline" in job.error:
        answer.why("Its whole-job deadline was " + when(job.deadline_at) + ".")
    answer.next("Nothing: FAILED is terminal; a resume runs it again as a new linked job.")
    _resume_actions(answer)


def _dead(answer: _Answer) -> None:
    job = answer.job
    last = _last(answer)
    classified = f", classified {last.error_class}" if last and last.error_class else ""
    on = f" on worker {last.worker}" if last and last.worker else ""
    answer.why(
        f"Job {answer.id} is DEAD after {_attempts_word(job.attempt)} of {job.max_attempts}, "
        f"since {when(job.updated_at)}; the last error{on}: {job.error}{classified}.",
        dead_at=job.updated_at,
        attempts=job.attempt,
        max_attempts=job.max_attempts,
        error=job.error,
        error_class=last.error_class if last else None,
        worker=last.worker if last else None,
    )
    retried = [a for a in answer.facts.history if a.outcome in ("RETRY_SCHEDULED", "SWEPT")]
    if retried:
        answer.why(
            "Earlier attempts: "
            + "; ".join(
                f"attempt {a.attempt} on {a.worker or '(no worker)'} ended at "
                f"{when(a.ended_at)}: {a.error} ({a.error_class})"
                for a in retried
            )
            + "."
        )
    answer.next("Nothing: DEAD is terminal; a resume runs it again as a new linked job.")
    _resume_actions(answer)


def _cancelled(answer: _Answer) -> None:
    job = answer.job
    reason = job.cancel_reason or "no reason given"
    asked = f" (requested at {when(job.cancel_requested_at)})" if job.cancel_requested_at else ""
    answer.why(
        f"Job {answer.id} was CANCELLED at {when(job.updated_at)}{asked}: {reason}.",
        cancelled_at=job.updated_at,
        cancel_requested_at=job.cancel_requested_at,
        cancel_reason=job.cancel_reason,
    )
    answer.next("Nothing: CANCELLED is terminal; a resume runs it again as a new linked job.")
    _resume_actions(answer)


_STATES = {
    Status.QUEUED: _queued,
    Status.RUNNING: _running,
    Status.WAITING: _waiting,
    Status.COMPLETED: _completed,
    Status.FAILED: _failed,
    Status.DEAD: _dead,
    Status.CANCELLED: _cancelled,
}


# --------------------------------------------------------------------------- shared parts


def _deadline(answer: _Answer) -> None:
    deadline = answer.job.deadline_at
    if deadline is not None and deadline <= answer.facts.now:
        answer.next(
            f"Its whole-job deadline passed at {answer.at(deadline)}: the sweeper fails it on "
            f"its next pass (every {answer.facts.sweep_interval_s:g}s).",
            deadline=deadline,
        )
    elif deadline is not None:
        answer.next(
            f"Its whole-job deadline passes at {answer.at(deadline)}; if it is not done by "
            "then, the sweeper fails it.",
            deadline=deadline,
        )


def _cancel_action(answer: _Answer) -> None:
    answer.action(
        "Cancel the job.",
        f"wfjobs cancel {answer.id} --reason TEXT",
        f"POST /v1/workflow-runs/{answer.id}:cancel",
    )


def _resume_actions(answer: _Answer) -> None:
    job = answer.job
    if job.resumed_by is not None:
        answer.next(
            f"It was already resumed by job {job.resumed_by}: `wfjobs explain {job.resumed_by}` "
            "tells where that run is.",
            resumed_by=job.resumed_by,
        )
        # A job is resumed once: another resume only answers that run, or 409.
        answer.action(
            "See where the run that resumes it stands.",
            f"wfjobs explain {job.resumed_by}",
            f"GET /v1/workflow-runs/{job.resumed_by}:explain",
        )
        return
    if job.definition is None:
        # Refused at submit: no snapshot to run again, so a resume with its own
        # answers 409; only the stored definition can run it.
        answer.action(
            f"Resume it as a new linked job with workflow {job.workflow_name!r}'s stored "
            "definition as it is now (it was refused at submit and has no snapshot of its own).",
            f"wfjobs resume {answer.id} --current-definition",
            f'POST /v1/workflow-runs/{answer.id}:resume {{"use_current_definition": true}}',
        )
        return
    steps = [str(entry.get("name", "")) for entry in job.checkpoints]
    after = f" after its last checkpoint, step {steps[-1]!r}" if steps else " from its first step"
    answer.action(
        f"Resume it as a new linked job that keeps its checkpoints and runs on{after}.",
        f"wfjobs resume {answer.id}",
        # The verb takes a body even when it names no option.
        f"POST /v1/workflow-runs/{answer.id}:resume {{}}",
    )
    if steps:
        answer.action(
            f"Resume it re-running step {steps[-1]!r} and what follows (checkpoints before "
            "it are kept).",
            f"wfjobs resume {answer.id} --from-step {steps[-1]}",
            f'POST /v1/workflow-runs/{answer.id}:resume {{"from_step": "{steps[-1]}"}}',
        )


def _links(answer: _Answer) -> None:
    job = answer.job
    if job.resumed_from is not None:
        answer.why(
            f"It resumes job {job.resumed_from}, with that job's checkpoints.",
            resumed_from=job.resumed_from,
        )
    if job.resumed_by is not None and job.status not in (
        Status.FAILED,
        Status.DEAD,
        Status.CANCELLED,
    ):
        answer.why(f"It was resumed by job {job.resumed_by}.", resumed_by=job.resumed_by)


def _delivery(answer: _Answer) -> None:
    outbox = answer.facts.outbox
    message = answer.message
    message.outbox.pending = outbox.pending
    message.outbox.failed = outbox.failed
    message.outbox.published = outbox.published
    if outbox.oldest_unsent_at is not None:
        message.outbox.oldest_unsent_at.FromDatetime(outbox.oldest_unsent_at)
    message.outbox.last_error = outbox.last_error or ""
    parts = [f"{outbox.published} of the job's events are published"]
    if outbox.pending:
        oldest = (
            f", the oldest since {when(outbox.oldest_unsent_at)}" if outbox.oldest_unsent_at else ""
        )
        parts.append(f"{outbox.pending} wait in the outbox for the relay{oldest}")
    if outbox.failed:
        parts.append(
            f"{outbox.failed} FAILED to publish and hold back the job's later events until "
            f"redriven (`wfjobs outbox redrive --job {answer.id}`)"
        )
    sentence = "; ".join(parts) + "."
    if outbox.last_error:
        sentence += f" Last delivery error: {outbox.last_error}."
    _finding(
        message.delivery,
        sentence,
        {
            "pending": outbox.pending,
            "failed": outbox.failed,
            "published": outbox.published,
            "oldest_unsent_at": outbox.oldest_unsent_at,
            "last_error": outbox.last_error,
        },
    )
    if outbox.failed:
        answer.action(
            "Redrive the job's FAILED events, so they and the ones behind them are published.",
            f"wfjobs outbox redrive --job {answer.id}",
            f'POST /v1/outbox:redrive {{"job_id": "{answer.id}"}}',
        )


def _compact(value: Mapping[str, object]) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    return text if len(text) <= 500 else text[:497] + "..."


__all__ = ["ExplainFacts", "explain_job", "when"]
