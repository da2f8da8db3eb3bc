"""How the command line draws answers: tables and colours on a terminal, plain
text when piped, JSON with ``--json``."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from schemas.contract import WorkflowRunEvent, integral_numbers, to_json

STATUS_STYLES: Mapping[str, str] = {
    "QUEUED": "cyan",
    "RUNNING": "blue",
    "WAITING": "yellow",
    "COMPLETED": "green",
    "FAILED": "red",
    "DEAD": "bold red",
    "CANCELLED": "magenta",
}
EVENT_STYLES: Mapping[str, str] = {
    "ACCEPTED": "cyan",
    "STEP_CHECKPOINT": "blue",
    "WAITING": "yellow",
    "COMPLETED": "green",
    "FAILED": "red",
    "DEAD": "bold red",
    "RETRY_SCHEDULED": "magenta",
    "CANCELLED": "magenta",
}

_PIPED_WIDTH = 200


class Output:
    def __init__(self, *, as_json: bool) -> None:
        self.as_json = as_json
        # Piped output has no terminal width to fit; rich would assume 80
        # columns and cut table cells, so a pipe gets rows at their full width.
        piped_width = None if sys.stdout.isatty() else _PIPED_WIDTH
        # emoji=False: rich would draw a job's ":thumbs_up:" as 👍, and escape()
        # leaves shortcodes alone; what is printed must be the data as it is.
        self.console = Console(highlight=False, soft_wrap=True, width=piped_width, emoji=False)
        self.errors = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)

    def json(self, value: Any) -> None:
        # Straight to stdout: rich would wrap or style long lines.
        self._write(json.dumps(value, indent=2, sort_keys=False) + "\n")

    def json_line(self, value: Any) -> None:
        self._write(json.dumps(value, separators=(",", ":")) + "\n")

    def _write(self, text: str) -> None:
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except BrokenPipeError:
            # The reader has gone (`| head -1`): stop as rich does for text. Left
            # to rise, it is an OSError that watch takes for a cut stream, and
            # reconnects to write to the closed pipe again, for as long as the job runs.
            self.console.on_broken_pipe()

    def print(self, text: str = "") -> None:
        self.console.print(text)

    def error(self, code: str, message: str) -> None:
        if self.as_json:
            # The API's own error body, so a script reads one shape from either.
            line = json.dumps({"code": code, "message": message}, ensure_ascii=False)
            with contextlib.suppress(BrokenPipeError):
                sys.stderr.write(line + "\n")
                sys.stderr.flush()
            return
        self.errors.print(f"[bold red]{escape(code)}[/]: {escape(message)}")


def status_markup(status: str) -> str:
    style = STATUS_STYLES.get(status, "")
    return f"[{style}]{escape(status)}[/]" if style else escape(status)


def compact(value: Any) -> str:
    # Event Structs carry every JSON number as a double: 17058, not 17058.0.
    return json.dumps(integral_numbers(value), separators=(",", ":"), sort_keys=True)


def render_job(out: Output, job: Mapping[str, Any]) -> None:
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold")
    summary.add_column()
    summary.add_row("job", escape(str(job.get("job_id", ""))))
    summary.add_row("workflow", escape(str(job.get("workflow_name", ""))))
    summary.add_row("status", status_markup(str(job.get("status", ""))))
    summary.add_row("attempt", f"{job.get('attempt', 0)} of {job.get('max_attempts', 0)}")
    if job.get("status") == "WAITING" and job.get("outstanding_step"):
        summary.add_row("waiting on", escape(str(job["outstanding_step"])))
    optional = (
        ("verdict", "verdict"),
        ("error", "error"),
        ("owner", "owner"),
        ("lease owner", "lease_owner"),
        ("lease until", "lease_until"),
        ("run after", "run_after"),
        ("created", "created_at"),
        ("updated", "updated_at"),
    )
    for label, key in optional:
        if job.get(key):
            summary.add_row(label, escape(str(job[key])))
    if "input" in job:
        summary.add_row("input", escape(compact(job["input"])))
    if "result" in job:
        summary.add_row("result", escape(compact(job["result"])))
    out.console.print(summary)
    checkpoints = job.get("checkpoints") or []
    if checkpoints:
        table = Table(title="checkpoints", title_justify="left")
        table.add_column("#", justify="right")
        table.add_column("step")
        table.add_column("response")
        for index, entry in enumerate(checkpoints):
            response = "(skipped)" if entry.get("skipped") else compact(entry.get("response", {}))
            table.add_row(str(index), escape(str(entry.get("name", ""))), escape(response))
        out.console.print(table)
    render_history(out, job.get("history") or [])


def render_history(out: Output, history: Sequence[Mapping[str, Any]]) -> None:
    """A job's attempts, oldest first: who held each, how it ended, and why."""
    if not history:
        return
    table = Table(title="history", title_justify="left")
    for column in ("attempt", "worker", "claimed", "ended", "outcome", "steps", "error"):
        table.add_column(column, justify="right" if column == "attempt" else "left")
    for entry in history:
        error = str(entry.get("error", ""))
        if error and entry.get("error_class"):
            error = f"{error} ({entry['error_class']})"
        if entry.get("next_run_at"):
            error += f"; next run {entry['next_run_at']}"
        table.add_row(
            str(entry.get("attempt", 0)),
            escape(str(entry.get("worker", ""))),
            escape(str(entry.get("claimed_at", ""))),
            escape(str(entry.get("ended_at", ""))),
            escape(str(entry.get("outcome", ""))),
            escape(", ".join(entry.get("steps") or [])),
            escape(error),
        )
    out.console.print(table)


def render_explanation(out: Output, answer: Mapping[str, Any]) -> None:
    """``explain``: the sentences first, each with its evidence, then the commands."""
    job_id, as_of = escape(str(answer.get("job_id", ""))), escape(str(answer.get("as_of", "")))
    out.print(f"job {job_id} is {status_markup(str(answer.get('status', '')))} (as of {as_of})")
    for title, key in (("Why", "why"), ("Next", "next")):
        findings = answer.get(key) or []
        if findings:
            out.print(f"\n[bold]{title}[/]")
            for finding in findings:
                _print_finding(out, finding)
    if answer.get("delivery"):
        out.print("\n[bold]Events[/]")
        _print_finding(out, answer["delivery"])
    actions = answer.get("actions") or []
    if actions:
        out.print("\n[bold]You can run[/]")
        for action in actions:
            out.print(f"  {escape(str(action.get('description', '')))}")
            out.print(f"    {escape(str(action.get('command', '')))}")
            out.print(f"    {escape(str(action.get('http', '')))}")
    render_history(out, answer.get("history") or [])


def _print_finding(out: Output, finding: Mapping[str, Any]) -> None:
    out.print(f"  {escape(str(finding.get('sentence', '')))}")
    evidence = finding.get("evidence") or {}
    if evidence:
        facts = ", ".join(f"{name}={value}" for name, value in sorted(evidence.items()))
        out.print(f"    [dim]evidence: {escape(facts)}[/]")


def render_jobs(out: Output, jobs: Sequence[Mapping[str, Any]], next_page_token: str) -> None:
    table = Table()
    # A job id is what one copies into the next command: never wrapped or cut.
    table.add_column("job_id", no_wrap=True, min_width=36)
    table.add_column("workflow")
    table.add_column("status", no_wrap=True)
    for column in ("attempt", "step / verdict", "updated"):
        table.add_column(column)
    for job in jobs:
        # A job keeps the name of the step it last parked on after it moves on.
        step = job.get("outstanding_step") if job.get("status") == "WAITING" else ""
        detail = step or job.get("verdict") or job.get("error") or ""
        table.add_row(
            escape(str(job.get("job_id", ""))),
            escape(str(job.get("workflow_name", ""))),
            status_markup(str(job.get("status", ""))),
            f"{job.get('attempt', 0)}/{job.get('max_attempts', 0)}",
            escape(str(detail)[:60]),
            escape(str(job.get("updated_at", ""))),
        )
    out.console.print(table)
    if next_page_token:
        out.print(f"next page: --page-token {escape(next_page_token)}")


def render_workflows(
    out: Output, workflows: Sequence[Mapping[str, Any]], next_page_token: str
) -> None:
    table = Table()
    for column in ("name", "steps", "input type", "updated"):
        table.add_column(column)
    for stored in workflows:
        definition = stored.get("definition") or {}
        steps = ", ".join(str(step.get("name", "?")) for step in definition.get("steps", []))
        table.add_row(
            escape(str(stored.get("name", ""))),
            escape(steps),
            escape(str(definition.get("inputType", ""))),
            escape(str(stored.get("updated_at", ""))),
        )
    out.console.print(table)
    if next_page_token:
        out.print(f"next page: --page-token {escape(next_page_token)}")


def render_workflow(out: Output, stored: Mapping[str, Any]) -> None:
    """One stored definition as text: what it takes and makes, then a row per step.

    The full definition (with its descriptor set) is what ``--json`` prints.
    """
    definition = stored.get("definition") or {}
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold")
    summary.add_column()
    summary.add_row("workflow", escape(str(stored.get("name", ""))))
    summary.add_row("input type", escape(str(definition.get("inputType", ""))))
    for index, rule in enumerate(definition.get("output") or []):
        summary.add_row("output" if index == 0 else "", escape(str(rule)))
    if definition.get("deadlineMs"):
        summary.add_row("deadline", f"{integral_numbers(definition['deadlineMs'])} ms")
    for label, key in (("created", "created_at"), ("updated", "updated_at")):
        if stored.get(key):
            summary.add_row(label, escape(str(stored[key])))
    out.console.print(summary)
    table = Table(title="steps", title_justify="left")
    for column in ("#", "step", "target", "method", "completion", "rules", "validate"):
        table.add_column(column, justify="right" if column == "#" else "left")
    for index, step in enumerate(definition.get("steps") or []):
        table.add_row(
            str(index),
            escape(str(step.get("name", ""))),
            escape(str(step.get("target", ""))),
            escape(str(step.get("method", ""))),
            escape(str(step.get("completion") or "call")),
            escape("\n".join(str(rule) for rule in step.get("rules") or [])),
            escape("\n".join(str(rule) for rule in step.get("validate") or [])),
        )
    out.console.print(table)


def event_summary(event: Mapping[str, Any], *, with_job: bool = True) -> str:
    """One line per event: when, what, which job, and the detail that matters."""
    kind = str(event.get("type", "")).removeprefix("TYPE_")
    style = EVENT_STYLES.get(kind, "")
    parts = [
        escape(str(event.get("occurred_at", ""))),
        f"[{style}]{escape(kind):<15}[/]" if style else f"{escape(kind):<15}",
    ]
    if with_job:
        parts.append(escape(str(event.get("job_id", ""))))
    parts.append(f"#{event.get('event_id', 0)}")
    if event.get("step_name"):
        parts.append(f"step={escape(str(event['step_name']))}")
    if event.get("skipped"):
        parts.append("(skipped)")
    if "response" in event:
        parts.append(escape(compact(event["response"])))
    if event.get("verdict"):
        parts.append(f"verdict={escape(str(event['verdict']))}")
    if event.get("error") and event.get("error") != event.get("verdict"):
        parts.append(f"[red]error={escape(str(event['error']))}[/]")
    if "result" in event:
        parts.append(f"result={escape(compact(event['result']))}")
    return " ".join(parts)


def render_failed_outbox(out: Output, answer: Mapping[str, Any]) -> None:
    events = answer.get("events", [])
    if not events:
        out.print("no FAILED outbox rows")
        return
    table = Table()
    table.add_column("id", justify="right", no_wrap=True)
    table.add_column("job_id", no_wrap=True, min_width=36)
    table.add_column("event", no_wrap=True)
    table.add_column("attempts", justify="right")
    table.add_column("created")
    table.add_column("last error")
    for event in events:
        table.add_row(
            str(event.get("id", "")),
            escape(str(event.get("job_id", ""))),
            escape(str(event.get("event_type", ""))),
            str(event.get("attempts", 0)),
            escape(str(event.get("created_at", ""))),
            f"[red]{escape(str(event.get('last_error', '')))}[/]",
        )
    out.console.print(table)
    token = str(answer.get("next_page_token", ""))
    if token:
        out.print(f"next page: --page-token {escape(token)}")


def render_dead_letters(out: Output, answer: Mapping[str, Any]) -> None:
    messages = answer.get("messages", [])
    topic = escape(str(answer.get("topic", "")))
    out.print(f"{topic}: {answer.get('total', 0)} message(s), {len(messages)} shown")
    if not messages:
        return
    table = Table()
    table.add_column("position", no_wrap=True)
    table.add_column("job_id", no_wrap=True)
    table.add_column("workflow")
    table.add_column("timestamp")
    table.add_column("reason")
    for message in messages:
        table.add_row(
            f"{message.get('partition')}:{message.get('offset')}",
            escape(str(message.get("job_id") or message.get("key") or "")),
            escape(str(message.get("workflow_name", ""))),
            escape(str(message.get("timestamp") or "")),
            f"[red]{escape(str(message.get('reason', '')))}[/]",
        )
    out.console.print(table)
    token = str(answer.get("next_page_token", ""))
    if token:
        out.print(f"next page: --page-token {escape(token)}")


def print_event(out: Output, event: WorkflowRunEvent) -> None:
    # Struct fields carry every number as a double: 8, not 8.0.
    as_dict = integral_numbers(to_json(event))
    if out.as_json:
        out.json_line(as_dict)
    else:
        out.print(event_summary(as_dict))
