"""``wfjobs``: the command line of workflow-jobs.

The job and workflow verbs talk to a worker's HTTP API (``--url``, else
``WFJOBS_URL``, else ``http://127.0.0.1:6066``). ``migrate``, ``produce`` and
``events`` use the settings directly (``DATABASE_URL``, ``KAFKA_BOOTSTRAP_SERVERS``,
``WFJOBS_SCHEMA_REGISTRY_URL``...), and ``dev`` starts the embedded stack; those
four do not take ``--url``.

Output is tables and colours on a terminal, plain text when piped, and JSON with
``--json``. Errors print their code and message and exit 1 (2 for usage errors).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from schemas.contract import WorkflowRunEvent, WorkflowRunRequest, check_incoming, to_json
from schemas.errors import WorkflowJobsError
from streams.convert import integral_numbers

if TYPE_CHECKING:
    from streams.settings import Settings

DEFAULT_URL = "http://127.0.0.1:6066"
HTTP_TIMEOUT_S = 30.0

STATUS_STYLES: Mapping[str, str] = {
    "QUEUED": "cyan",
    "RUNNING": "blue",
    "WAITING": "yellow",
    "COMPLETED": "green",
    "FAILED": "red",
    "DEAD": "bold red",
}
EVENT_STYLES: Mapping[str, str] = {
    "ACCEPTED": "cyan",
    "STEP_CHECKPOINT": "blue",
    "WAITING": "yellow",
    "COMPLETED": "green",
    "FAILED": "red",
    "DEAD": "bold red",
}


class CliError(WorkflowJobsError):
    """An error to print as ``code: message``; ``code`` comes from the server or us."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


# --------------------------------------------------------------------------- output


_PIPED_WIDTH = 200


class Output:
    def __init__(self, *, as_json: bool) -> None:
        self.as_json = as_json
        # Piped output has no terminal width to fit; rich would assume 80
        # columns and cut table cells, so a pipe gets rows at their full width.
        piped_width = None if sys.stdout.isatty() else _PIPED_WIDTH
        self.console = Console(highlight=False, soft_wrap=True, width=piped_width)
        self.errors = Console(stderr=True, highlight=False, soft_wrap=True)

    def json(self, value: Any) -> None:
        # Straight to stdout: rich would wrap or style long lines.
        sys.stdout.write(json.dumps(value, indent=2, sort_keys=False) + "\n")
        sys.stdout.flush()

    def json_line(self, value: Any) -> None:
        sys.stdout.write(json.dumps(value, separators=(",", ":")) + "\n")
        sys.stdout.flush()

    def print(self, text: str = "") -> None:
        self.console.print(text)

    def error(self, code: str, message: str) -> None:
        self.errors.print(f"[bold red]{escape(code)}[/]: {escape(message)}")


def _status(status: str) -> str:
    style = STATUS_STYLES.get(status, "")
    return f"[{style}]{escape(status)}[/]" if style else escape(status)


def _compact(value: Any) -> str:
    # Event Structs carry every JSON number as a double: 17058, not 17058.0.
    return json.dumps(integral_numbers(value), separators=(",", ":"), sort_keys=True)


def render_job(out: Output, job: Mapping[str, Any]) -> None:
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold")
    summary.add_column()
    summary.add_row("job", escape(str(job.get("job_id", ""))))
    summary.add_row("workflow", escape(str(job.get("workflow_name", ""))))
    summary.add_row("status", _status(str(job.get("status", ""))))
    summary.add_row("attempt", f"{job.get('attempt', 0)} of {job.get('max_attempts', 0)}")
    if job.get("status") == "WAITING" and job.get("outstanding_step"):
        summary.add_row("waiting on", escape(str(job["outstanding_step"])))
    optional = (
        ("verdict", "verdict"),
        ("error", "error"),
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
        summary.add_row("input", escape(_compact(job["input"])))
    if "result" in job:
        summary.add_row("result", escape(_compact(job["result"])))
    out.console.print(summary)
    checkpoints = job.get("checkpoints") or []
    if checkpoints:
        table = Table(title="checkpoints", title_justify="left")
        table.add_column("#", justify="right")
        table.add_column("step")
        table.add_column("response")
        for index, entry in enumerate(checkpoints):
            response = "(skipped)" if entry.get("skipped") else _compact(entry.get("response", {}))
            table.add_row(str(index), escape(str(entry.get("name", ""))), escape(response))
        out.console.print(table)


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
            _status(str(job.get("status", ""))),
            f"{job.get('attempt', 0)}/{job.get('max_attempts', 0)}",
            escape(str(detail)[:60]),
            escape(str(job.get("updated_at", ""))),
        )
    out.console.print(table)
    if next_page_token:
        out.print(f"next page: --page-token {escape(next_page_token)}")


def render_workflows(out: Output, workflows: Sequence[Mapping[str, Any]]) -> None:
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


def event_summary(event: Mapping[str, Any]) -> str:
    """One line per event: when, what, which job, and the detail that matters."""
    kind = str(event.get("type", "")).removeprefix("TYPE_")
    style = EVENT_STYLES.get(kind, "")
    parts = [
        escape(str(event.get("occurred_at", ""))),
        f"[{style}]{escape(kind):<15}[/]" if style else f"{escape(kind):<15}",
        escape(str(event.get("job_id", ""))),
        f"#{event.get('event_id', 0)}",
    ]
    if event.get("step_name"):
        parts.append(f"step={escape(str(event['step_name']))}")
    if event.get("skipped"):
        parts.append("(skipped)")
    if "response" in event:
        parts.append(escape(_compact(event["response"])))
    if event.get("verdict"):
        parts.append(f"verdict={escape(str(event['verdict']))}")
    if event.get("error") and event.get("error") != event.get("verdict"):
        parts.append(f"[red]error={escape(str(event['error']))}[/]")
    if "result" in event:
        parts.append(f"result={escape(_compact(event['result']))}")
    return " ".join(parts)


# --------------------------------------------------------------------------- HTTP


class Api:
    """The verbs over HTTP: JSON in, JSON out, errors as :class:`CliError`."""

    def __init__(self, base_url: str, *, timeout_s: float = HTTP_TIMEOUT_S) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    def call(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        query: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        url = self.base_url + path
        params = {key: value for key, value in (query or {}).items() if value not in (None, "")}
        if params:
            url += "?" + urllib.parse.urlencode(params)
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            raise _http_error(exc) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CliError(
                "UNAVAILABLE", f"cannot reach {self.base_url}: {reason} (is a worker running?)"
            ) from None
        if not payload:
            return {}
        decoded = json.loads(payload)
        if not isinstance(decoded, dict):
            raise CliError("INTERNAL", f"{method} {path} answered {type(decoded).__name__}")
        return decoded


def _http_error(exc: urllib.error.HTTPError) -> CliError:
    raw = exc.read()
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if isinstance(body, dict) and "code" in body:
        return CliError(str(body["code"]), str(body.get("message", "")))
    text = raw.decode(errors="replace").strip()
    return CliError(f"HTTP_{exc.code}", text or str(exc.reason))


def _quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")


# --------------------------------------------------------------------------- arguments


def json_object(raw: str, what: str) -> dict[str, Any]:
    """A JSON object from the command line: inline text, ``@path``, or ``-`` for stdin."""
    if raw == "-":
        text = sys.stdin.read()
    elif raw.startswith("@"):
        try:
            text = Path(raw[1:]).read_text()
        except OSError as exc:
            raise CliError("INVALID_ARGUMENT", f"{what}: cannot read {raw[1:]}: {exc}") from None
    else:
        text = raw
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise CliError("INVALID_ARGUMENT", f"{what} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise CliError("INVALID_ARGUMENT", f"{what} must be a JSON object")
    return value


def _required(value: str, argument: str) -> str:
    """A positional argument or option that must not be empty: an empty one would
    name no resource, and the server would only answer that the path is unknown."""
    if not value.strip():
        raise CliError("INVALID_ARGUMENT", f"{argument} must not be empty")
    return value


def _job_id(value: str | None) -> str:
    if not value:
        return str(uuid.uuid4())
    return _uuid(value, "job id")


def _uuid(value: str, argument: str) -> str:
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise CliError("INVALID_ARGUMENT", f"{argument} must be a UUID, got {value!r}") from None


# --------------------------------------------------------------------------- verbs


def _show(out: Output, answer: dict[str, Any], render: Callable[[dict[str, Any]], None]) -> int:
    """The server's answer as JSON with ``--json``, else as ``render`` draws it."""
    if out.as_json:
        out.json(answer)
    else:
        render(answer)
    return 0


def cmd_workflows_put(args: argparse.Namespace, out: Output) -> int:
    definition = json_object(f"@{args.file}", "workflow file")
    if args.name is not None:
        # The server stores a definition under its own name: --name renames it.
        definition["name"] = _required(args.name, "--name")
    name = definition.get("name")
    if not isinstance(name, str) or not name:
        raise CliError("INVALID_ARGUMENT", "the workflow has no name: add one or pass --name")
    answer = Api(args.url).call("PUT", f"/v1/workflows/{_quote(name)}", {"workflow": definition})

    def render(answer: dict[str, Any]) -> None:
        stored = answer.get("workflow", {})
        out.print(f"stored workflow [bold]{escape(str(stored.get('name', name)))}[/]")

    return _show(out, answer, render)


def cmd_workflows_get(args: argparse.Namespace, out: Output) -> int:
    name = _required(args.name, "NAME")
    answer = Api(args.url).call("GET", f"/v1/workflows/{_quote(name)}")
    return _show(out, answer, lambda answer: render_workflow(out, answer.get("workflow", {})))


def cmd_workflows_list(args: argparse.Namespace, out: Output) -> int:
    answer = Api(args.url).call("GET", "/v1/workflows")
    return _show(out, answer, lambda answer: render_workflows(out, answer.get("workflows", [])))


def cmd_submit(args: argparse.Namespace, out: Output) -> int:
    body: dict[str, Any] = {
        "job_id": _job_id(args.job_id),
        "input": json_object(args.input, "--input"),
    }
    if args.workflow_file:
        body["workflow"] = json_object(f"@{args.workflow_file}", "workflow file")
    else:
        body["workflow_name"] = args.workflow_name
    if args.max_attempts:
        body["max_attempts"] = args.max_attempts
    answer = Api(args.url).call("POST", "/v1/workflow-runs", body)

    def render(answer: dict[str, Any]) -> None:
        job = answer.get("job", {})
        # proto3 JSON leaves out a false ``created``: absent means the job already existed.
        created = "submitted" if answer.get("created", False) else "already existed"
        out.print(
            f"job [bold]{escape(str(job.get('job_id', body['job_id'])))}[/] {created}: "
            f"{_status(str(job.get('status', '')))}"
        )

    return _show(out, answer, render)


def cmd_get(args: argparse.Namespace, out: Output) -> int:
    job_id = _required(args.job_id, "JOB_ID")
    answer = Api(args.url).call("GET", f"/v1/workflow-runs/{_quote(job_id)}")
    return _show(out, answer, lambda answer: render_job(out, answer.get("job", {})))


def cmd_list(args: argparse.Namespace, out: Output) -> int:
    query = {
        "status": args.status,
        "workflow_name": args.name,
        "limit": args.limit or None,
        "page_token": args.page_token,
    }
    answer = Api(args.url).call("GET", "/v1/workflow-runs", query=query)

    def render(answer: dict[str, Any]) -> None:
        render_jobs(out, answer.get("jobs", []), str(answer.get("next_page_token", "")))

    return _show(out, answer, render)


def cmd_complete(args: argparse.Namespace, out: Output) -> int:
    job_id, step = _required(args.job_id, "JOB_ID"), _required(args.step, "STEP")
    response = json_object(args.response, "--response")
    path = f"/v1/workflow-runs/{_quote(job_id)}/steps/{_quote(step)}:complete"
    answer = Api(args.url).call("POST", path, {"response": response})
    if out.as_json:
        out.json(answer)
    else:
        outcome = str(answer.get("outcome", ""))
        job = answer.get("job", {})
        style = "green" if outcome == "COMPLETED" else "yellow"
        out.print(
            f"[{style}]{escape(outcome)}[/]: {escape(str(answer.get('message', '')))} "
            f"(job is {_status(str(job.get('status', '')))})"
        )
    # The verb answered, but the step was not accepted: a script must notice.
    return 0 if answer.get("outcome") in ("COMPLETED", "ALREADY_DONE") else 1


def cmd_outbox_list(args: argparse.Namespace, out: Output) -> int:
    query = {
        "status": "FAILED",
        "job_id": args.job,
        "limit": args.limit or None,
        "page_token": args.page_token,
    }
    answer = Api(args.url).call("GET", "/v1/outbox", query=query)

    def render(answer: dict[str, Any]) -> None:
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

    return _show(out, answer, render)


def cmd_outbox_redrive(args: argparse.Namespace, out: Output) -> int:
    chosen = [bool(args.ids), bool(args.job), bool(args.all)]
    if sum(chosen) != 1:
        raise CliError("INVALID_ARGUMENT", "name outbox row ids, or --job ID, or --all (one of)")
    body: dict[str, Any]
    if args.ids:
        body = {"ids": args.ids}
    elif args.job:
        body = {"job_id": args.job}
    else:
        body = {"all": True}
    answer = Api(args.url).call("POST", "/v1/outbox:redrive", body)

    def render(answer: dict[str, Any]) -> None:
        redriven = answer.get("redriven", [])
        out.print(f"redrove {len(redriven)} outbox row(s) to PENDING")
        for row in redriven:
            out.print(f"  #{row.get('id')} job {escape(str(row.get('job_id', '')))}")
        skipped = answer.get("not_failed", [])
        if skipped:
            listed = ", ".join(str(i) for i in skipped)
            out.print(f"[yellow]not FAILED (left alone)[/]: {escape(listed)}")

    return _show(out, answer, render)


def cmd_dlq_list(args: argparse.Namespace, out: Output) -> int:
    answer = Api(args.url).call("GET", "/v1/requests-dlq", query={"max": args.max})

    def render(answer: dict[str, Any]) -> None:
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

    return _show(out, answer, render)


def _position(text: str) -> dict[str, int]:
    partition, sep, offset = text.partition(":")
    if not sep or not partition.isdigit() or not offset.isdigit():
        raise CliError("INVALID_ARGUMENT", f"--offset takes PARTITION:OFFSET, got {text!r}")
    return {"partition": int(partition), "offset": int(offset)}


def cmd_dlq_redrive(args: argparse.Namespace, out: Output) -> int:
    if bool(args.offset) == bool(args.all):
        raise CliError("INVALID_ARGUMENT", "name --offset P:O (repeatable) or --all (one of)")
    body: dict[str, Any] = (
        {"positions": [_position(text) for text in args.offset]} if args.offset else {"all": True}
    )
    answer = Api(args.url).call("POST", "/v1/requests-dlq:redrive", body)

    def render(answer: dict[str, Any]) -> None:
        redriven = answer.get("redriven", [])
        topic = escape(str(answer.get("topic", "")))
        out.print(f"redrove {len(redriven)} dead letter(s) to {topic}")
        for message in redriven:
            who = message.get("job_id") or message.get("key") or "(undecodable)"
            out.print(f"  {message.get('partition')}:{message.get('offset')} {escape(str(who))}")

    return _show(out, answer, render)


# --------------------------------------------------------------------------- settings-driven


def _settings() -> Settings:
    # Imported here: the verbs that only speak HTTP never read the settings.
    from streams.settings import Settings

    return Settings.from_env()


# librdkafka would print every failed connection attempt to stderr; the commands
# report what went wrong once, as ``code: message``.
_QUIET_CLIENT: Mapping[str, Any] = {"log_level": 0}
# librdkafka's default, and what a broker accepts by default: a request above it
# is refused before anything is sent.
PRODUCE_MAX_BYTES = 1_000_000


def cmd_migrate(args: argparse.Namespace, out: Output) -> int:
    from store.migrate import migrate

    dsn = args.dsn or _settings().database_url
    if not dsn:
        raise CliError("INVALID_ARGUMENT", "no database: set DATABASE_URL or pass --dsn")
    applied = asyncio.run(migrate(dsn))
    if out.as_json:
        out.json({"applied": applied})
    elif applied:
        for name in applied:
            out.print(f"applied [bold]{escape(name)}[/]")
    else:
        out.print("database is up to date")
    return 0


def cmd_produce(args: argparse.Namespace, out: Output) -> int:
    from confluent_kafka import KafkaError, KafkaException, Message, Producer

    from schemas.serde import encode_request

    settings = _settings()
    request = WorkflowRunRequest(job_id=_job_id(args.job_id), workflow_name=args.workflow_name)
    request.input.update(json_object(args.input, "--input"))
    check_incoming(request)
    try:
        value = encode_request(
            request, registry=settings.open_registry(), topic=settings.requests_topic
        )
    except WorkflowJobsError:
        raise
    except Exception as exc:  # the registry client's transport and API errors alike
        if not settings.schema_registry_url:
            raise
        raise CliError(
            "UNAVAILABLE",
            f"cannot frame the request with the schema registry at "
            f"{settings.schema_registry_url}: {exc}",
        ) from None
    producer = Producer(
        {
            "bootstrap.servers": settings.kafka_bootstrap_servers,
            "enable.idempotence": True,
            "acks": "all",
            "message.timeout.ms": int(args.timeout * 1000),
            "message.max.bytes": PRODUCE_MAX_BYTES,
            **_QUIET_CLIENT,
        }
    )
    reports: list[KafkaError | None] = []

    def delivered(error: KafkaError | None, message: Message) -> None:
        reports.append(error)

    try:
        producer.produce(
            settings.requests_topic,
            key=request.job_id.encode(),
            value=value,
            on_delivery=delivered,
        )
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if isinstance(error, KafkaError) and error.code() == KafkaError.MSG_SIZE_TOO_LARGE:
            raise CliError(
                "PAYLOAD_TOO_LARGE",
                f"the request is {len(value)} bytes; a Kafka message may be at most "
                f"{PRODUCE_MAX_BYTES} bytes",
            ) from None
        reason = error.str() if isinstance(error, KafkaError) else str(exc)
        raise CliError(
            "UNAVAILABLE", f"cannot produce to {settings.requests_topic}: {reason}"
        ) from None
    producer.flush(args.timeout + 5)
    if not reports or reports[0] is not None:
        reason = reports[0].str() if reports and reports[0] is not None else "no delivery report"
        raise CliError(
            "UNAVAILABLE", f"request not delivered to {settings.requests_topic}: {reason}"
        )
    if out.as_json:
        out.json({"job_id": request.job_id, "topic": settings.requests_topic})
    else:
        out.print(
            f"produced job [bold]{request.job_id}[/] to {escape(settings.requests_topic)}; "
            f"follow it with `wfjobs get {request.job_id}`"
        )
    return 0


def cmd_events(args: argparse.Namespace, out: Output) -> int:
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, TopicPartition

    from schemas.serde import EventDecoder, UndecodableMessage

    job = None if args.job is None else _uuid(args.job, "--job")
    settings = _settings()
    decoder = EventDecoder(
        settings.open_registry(), topic=settings.events_topic, event_format=settings.event_format
    )
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap_servers,
            # Partitions are assigned by hand below and nothing is committed, so
            # this id never joins a group: reading moves nobody's offsets.
            "group.id": f"wfjobs-cli-{uuid.uuid4().hex[:12]}",
            "enable.auto.commit": False,
            # Reaching a partition's end is reported: where "only new events" begin.
            "enable.partition.eof": True,
            **_QUIET_CLIENT,
        }
    )
    start = OFFSET_BEGINNING if args.from_beginning else OFFSET_END
    # Partitions read up to the end they had when we joined. Seeking to OFFSET_END
    # is not enough: Tansu answers it with an offset inside the partition's last
    # batch, so the rest of that batch would be printed as if it were new.
    caught_up: set[int | None] = set()
    seen: set[int] = set()
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    try:
        partitions = _partitions(
            consumer,
            settings.events_topic,
            bootstrap=settings.kafka_bootstrap_servers,
            timeout_s=min(15.0, args.timeout) if args.timeout else 15.0,
        )
        consumer.assign([TopicPartition(settings.events_topic, p, start) for p in partitions])
        if not out.as_json:
            out.errors.print(f"[dim]reading {escape(settings.events_topic)}; Ctrl-C to stop[/]")
        while args.max is None or len(seen) < args.max:
            if deadline is not None and time.monotonic() >= deadline:
                break
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    caught_up.add(message.partition())
                else:
                    out.error("KAFKA", str(error))
                continue
            if not args.from_beginning and message.partition() not in caught_up:
                continue
            try:
                event = decoder.decode(message.value(), topic=message.topic())
            except UndecodableMessage as exc:
                out.error("UNDECODABLE", f"offset {message.offset()}: {exc.message}")
                continue
            # At-least-once delivery: a republished event carries the same id.
            if event.event_id in seen or (job is not None and event.job_id != job):
                continue
            seen.add(event.event_id)
            _print_event(out, event)
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()
    return 0


def _partitions(consumer: Any, topic: str, *, bootstrap: str, timeout_s: float) -> list[int]:
    """Every partition of ``topic``: read them all without joining a consumer group."""
    from confluent_kafka import KafkaException

    try:
        metadata = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else exc
        reason = error.str() if hasattr(error, "str") else str(error)
        raise CliError(
            "UNAVAILABLE", f"cannot read {topic} from {bootstrap}: {reason} (is Kafka running?)"
        ) from None
    if metadata is None or metadata.error is not None or not metadata.partitions:
        reason = metadata.error if metadata is not None else "no metadata"
        raise CliError("NOT_FOUND", f"topic {topic} is not readable: {reason}")
    return sorted(metadata.partitions)


def _print_event(out: Output, event: WorkflowRunEvent) -> None:
    # Struct fields carry every number as a double: 8, not 8.0.
    as_dict = integral_numbers(to_json(event))
    if out.as_json:
        out.json_line(as_dict)
    else:
        out.print(event_summary(as_dict))


def cmd_dev(args: argparse.Namespace, out: Output) -> int:
    from streams.devstack import run_dev_stack

    return run_dev_stack(
        web_port=args.port, workdir=args.workdir, fresh=args.fresh, console=out.console
    )


# --------------------------------------------------------------------------- parser


class _UrlOption(argparse.Action):
    """``--url``, remembering that it was given: a command that does not use the
    HTTP API refuses it rather than ignoring it."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        namespace.url_given = True


def _common(parser: argparse.ArgumentParser, *, top: bool, url: bool) -> None:
    # Accepted before or after the subcommand; SUPPRESS keeps a subcommand's
    # unset option from overwriting what was given before it.
    if url:
        default_url = os.environ.get("WFJOBS_URL", DEFAULT_URL) if top else argparse.SUPPRESS
        parser.add_argument(
            "--url",
            action=_UrlOption,
            default=default_url,
            help=f"the worker's HTTP API (env WFJOBS_URL, default {DEFAULT_URL})",
        )
    parser.add_argument(
        "--json",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help="print JSON instead of tables",
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"wfjobs {version('workflow-jobs')}"
    except PackageNotFoundError:
        return "wfjobs (workflow-jobs is not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="wfjobs",
        description="Durable workflow jobs: submit, inspect and answer jobs; run the dev stack.",
    )
    _common(parser, top=True, url=True)
    parser.add_argument("--version", action="version", version=_version())
    common = argparse.ArgumentParser(add_help=False)
    _common(common, top=False, url=True)
    # migrate, produce, events and dev work from the settings, not the HTTP API.
    local = argparse.ArgumentParser(add_help=False)
    _common(local, top=False, url=False)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(
        name: str, handler: Callable[..., int], help_text: str, *, http: bool = True
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name, parents=[common if http else local], help=help_text, description=help_text
        )
        sub.set_defaults(handler=handler, uses_url=http)
        return sub

    migrate = add(
        "migrate", cmd_migrate, "apply pending database migrations (DATABASE_URL)", http=False
    )
    migrate.add_argument("--dsn", help="database to migrate (default: DATABASE_URL)")

    workflows = commands.add_parser("workflows", help="store and read workflow definitions")
    verbs = workflows.add_subparsers(dest="verb", required=True, metavar="VERB")
    put = verbs.add_parser("put", parents=[common], help="store a definition from a JSON file")
    put.add_argument("file", help="the workflow envelope, as JSON")
    put.add_argument("--name", help="store under this name (default: the file's name field)")
    put.set_defaults(handler=cmd_workflows_put)
    get_workflow = verbs.add_parser("get", parents=[common], help="show a stored definition")
    get_workflow.add_argument("name")
    get_workflow.set_defaults(handler=cmd_workflows_get)
    verbs.add_parser("list", parents=[common], help="list stored definitions").set_defaults(
        handler=cmd_workflows_list
    )

    submit = add("submit", cmd_submit, "submit a job")
    source = submit.add_mutually_exclusive_group(required=True)
    source.add_argument("--workflow-name", help="a stored workflow")
    source.add_argument("--workflow-file", help="an inline workflow envelope (JSON file)")
    submit.add_argument(
        "--input", required=True, help="the input as a JSON object (or @file, or - for stdin)"
    )
    submit.add_argument("--job-id", help="a UUID, the idempotency key (default: a new one)")
    submit.add_argument("--max-attempts", type=int, default=0, help="0 uses the server default")

    get = add("get", cmd_get, "show one job with its checkpoints")
    get.add_argument("job_id")

    listing = add("list", cmd_list, "list jobs, newest first")
    listing.add_argument("--status", help="QUEUED, RUNNING, WAITING, COMPLETED, FAILED or DEAD")
    listing.add_argument("--name", help="only jobs of this workflow")
    listing.add_argument("--limit", type=int, default=0, help="page size (0: 50, at most 500)")
    listing.add_argument("--page-token", help="the next_page_token of a previous page")

    complete = add("complete", cmd_complete, "answer a job's parked external step")
    complete.add_argument("job_id")
    complete.add_argument("step")
    complete.add_argument(
        "--response", required=True, help="the step's response as a JSON object (or @file, -)"
    )

    outbox = commands.add_parser("outbox", help="FAILED outbox rows: list and redrive them")
    outbox_verbs = outbox.add_subparsers(dest="verb", required=True, metavar="VERB")
    outbox_list = outbox_verbs.add_parser(
        "list", parents=[common], help="list FAILED outbox rows, oldest first"
    )
    outbox_list.add_argument("--job", help="only this job's rows")
    outbox_list.add_argument("--limit", type=int, default=0, help="page size (0: 50, at most 500)")
    outbox_list.add_argument("--page-token", help="the next_page_token of a previous page")
    outbox_list.set_defaults(handler=cmd_outbox_list)
    outbox_redrive = outbox_verbs.add_parser(
        "redrive", parents=[common], help="send FAILED outbox rows to the relay again"
    )
    outbox_redrive.add_argument("ids", nargs="*", type=int, metavar="ID", help="outbox row ids")
    outbox_redrive.add_argument("--job", help="every FAILED row of this job")
    outbox_redrive.add_argument("--all", action="store_true", help="every FAILED row")
    outbox_redrive.set_defaults(handler=cmd_outbox_redrive)

    dlq = commands.add_parser("dlq", help="dead-lettered requests: list and redrive them")
    dlq_verbs = dlq.add_subparsers(dest="verb", required=True, metavar="VERB")
    dlq_list = dlq_verbs.add_parser(
        "list", parents=[common], help="list the requests dead-letter topic with the reasons"
    )
    dlq_list.add_argument("--max", type=int, help="show at most this many (default 100)")
    dlq_list.set_defaults(handler=cmd_dlq_list)
    dlq_redrive = dlq_verbs.add_parser(
        "redrive", parents=[common], help="produce dead letters to the requests topic again"
    )
    dlq_redrive.add_argument(
        "--offset", action="append", metavar="P:O", help="partition:offset (repeatable)"
    )
    dlq_redrive.add_argument("--all", action="store_true", help="every dead letter")
    dlq_redrive.set_defaults(handler=cmd_dlq_redrive)

    produce = add(
        "produce", cmd_produce, "produce a WorkflowRunRequest to the requests topic", http=False
    )
    produce.add_argument("--workflow-name", required=True)
    produce.add_argument("--input", required=True, help="a JSON object (or @file, or -)")
    produce.add_argument("--job-id", help="a UUID (default: a new one)")
    produce.add_argument("--timeout", type=float, default=30.0, help="delivery timeout, seconds")

    events = add(
        "events",
        cmd_events,
        "print new events from the events topic, deduped by event_id",
        http=False,
    )
    events.add_argument(
        "--from-beginning", action="store_true", help="start at the oldest event, not the newest"
    )
    events.add_argument("--job", metavar="ID", help="only this job's events")
    events.add_argument("--max", type=int, help="stop after this many distinct events")
    events.add_argument("--timeout", type=float, help="stop after this many seconds")

    dev = add(
        "dev", cmd_dev, "run Postgres, Tansu and a worker with the sample workflow", http=False
    )
    dev.add_argument("--port", type=int, default=6066, help="the worker's HTTP port")
    dev.add_argument(
        "--workdir",
        type=Path,
        default=Path(".wfjobs-dev"),
        help="where Postgres's data and the worker log are kept (default: ./.wfjobs-dev)",
    )
    dev.add_argument(
        "--fresh", action="store_true", help="delete the data kept by earlier runs first"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "url_given", False) and not getattr(args, "uses_url", True):
        parser.error(f"--url: `wfjobs {args.command}` does not use the HTTP API")
    out = Output(as_json=args.json)
    try:
        result: int = args.handler(args, out)
        return result
    except CliError as exc:
        out.error(exc.code, exc.message)
    except WorkflowJobsError as exc:
        out.error(exc.code, exc.message)
    except KeyboardInterrupt:
        return 130
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
