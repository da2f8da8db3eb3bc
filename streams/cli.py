"""``wfjobs``: the command line of workflow-jobs.

The job and workflow verbs talk to a worker's HTTP API (``--url``, else
``WFJOBS_URL``, else ``http://127.0.0.1:6066``). ``migrate``, ``produce`` and
``events`` use the settings directly (``DATABASE_URL``, ``KAFKA_BOOTSTRAP_SERVERS``,
``WFJOBS_SCHEMA_REGISTRY_URL``...), and ``dev`` starts the embedded stack.

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
    optional = (
        ("waiting on", "outstanding_step"),
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
        detail = job.get("outstanding_step") or job.get("verdict") or job.get("error") or ""
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


def _job_id(value: str | None) -> str:
    if not value:
        return str(uuid.uuid4())
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise CliError("INVALID_ARGUMENT", f"job id must be a UUID, got {value!r}") from None


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
    name = args.name or definition.get("name")
    if not isinstance(name, str) or not name:
        raise CliError("INVALID_ARGUMENT", "the workflow has no name: add one or pass --name")
    answer = Api(args.url).call("PUT", f"/v1/workflows/{_quote(name)}", {"workflow": definition})

    def render(answer: dict[str, Any]) -> None:
        stored = answer.get("workflow", {})
        out.print(f"stored workflow [bold]{escape(str(stored.get('name', name)))}[/]")

    return _show(out, answer, render)


def cmd_workflows_get(args: argparse.Namespace, out: Output) -> int:
    answer = Api(args.url).call("GET", f"/v1/workflows/{_quote(args.name)}")

    def render(answer: dict[str, Any]) -> None:
        stored = answer.get("workflow", {})
        render_workflows(out, [stored])
        out.console.print_json(data=stored.get("definition", {}))

    return _show(out, answer, render)


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
    answer = Api(args.url).call("GET", f"/v1/workflow-runs/{_quote(args.job_id)}")
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
    response = json_object(args.response, "--response")
    path = f"/v1/workflow-runs/{_quote(args.job_id)}/steps/{_quote(args.step)}:complete"
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


# --------------------------------------------------------------------------- settings-driven


def _settings() -> Settings:
    # Imported here: the verbs that only speak HTTP never read the settings.
    from streams.settings import Settings

    return Settings.from_env()


# librdkafka would print every failed connection attempt to stderr; the commands
# report what went wrong once, as ``code: message``.
_QUIET_CLIENT: Mapping[str, Any] = {"log_level": 0}


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
    from confluent_kafka import KafkaError, Message, Producer

    from schemas.serde import encode_request

    settings = _settings()
    request = WorkflowRunRequest(job_id=_job_id(args.job_id), workflow_name=args.workflow_name)
    request.input.update(json_object(args.input, "--input"))
    check_incoming(request)
    value = encode_request(
        request, registry=settings.open_registry(), topic=settings.requests_topic
    )
    producer = Producer(
        {
            "bootstrap.servers": settings.kafka_bootstrap_servers,
            "enable.idempotence": True,
            "acks": "all",
            "message.timeout.ms": int(args.timeout * 1000),
            **_QUIET_CLIENT,
        }
    )
    reports: list[KafkaError | None] = []

    def delivered(error: KafkaError | None, message: Message) -> None:
        reports.append(error)

    producer.produce(
        settings.requests_topic, key=request.job_id.encode(), value=value, on_delivery=delivered
    )
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
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, TopicPartition

    from schemas.serde import EventDecoder, UndecodableMessage

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
            **_QUIET_CLIENT,
        }
    )
    start = OFFSET_BEGINNING if args.from_beginning else OFFSET_END
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
            if message.error() is not None:
                out.error("KAFKA", str(message.error()))
                continue
            try:
                event = decoder.decode(message.value(), topic=message.topic())
            except UndecodableMessage as exc:
                out.error("UNDECODABLE", f"offset {message.offset()}: {exc.message}")
                continue
            # At-least-once delivery: a republished event carries the same id.
            if event.event_id in seen:
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
    as_dict = to_json(event)
    if out.as_json:
        out.json_line(as_dict)
    else:
        out.print(event_summary(as_dict))


def cmd_dev(args: argparse.Namespace, out: Output) -> int:
    from streams.devstack import run_dev_stack

    return run_dev_stack(web_port=args.port, workdir=args.workdir, console=out.console)


# --------------------------------------------------------------------------- parser


def _common(parser: argparse.ArgumentParser, *, top: bool) -> None:
    # Accepted before or after the subcommand; SUPPRESS keeps a subcommand's
    # unset option from overwriting what was given before it.
    default_url = os.environ.get("WFJOBS_URL", DEFAULT_URL) if top else argparse.SUPPRESS
    parser.add_argument(
        "--url",
        default=default_url,
        help=f"the worker's HTTP API (env WFJOBS_URL, default {DEFAULT_URL})",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help="print JSON instead of tables",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="wfjobs",
        description="Durable workflow jobs: submit, inspect and answer jobs; run the dev stack.",
    )
    _common(parser, top=True)
    common = argparse.ArgumentParser(add_help=False)
    _common(common, top=False)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, handler: Callable[..., int], help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, parents=[common], help=help_text, description=help_text)
        sub.set_defaults(handler=handler)
        return sub

    migrate = add("migrate", cmd_migrate, "apply pending database migrations (DATABASE_URL)")
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

    produce = add("produce", cmd_produce, "produce a WorkflowRunRequest to the requests topic")
    produce.add_argument("--workflow-name", required=True)
    produce.add_argument("--input", required=True, help="a JSON object (or @file, or -)")
    produce.add_argument("--job-id", help="a UUID (default: a new one)")
    produce.add_argument("--timeout", type=float, default=30.0, help="delivery timeout, seconds")

    events = add("events", cmd_events, "print events from the events topic, deduped by event_id")
    events.add_argument("--from-beginning", action="store_true", help="start at the oldest event")
    events.add_argument("--max", type=int, help="stop after this many distinct events")
    events.add_argument("--timeout", type=float, help="stop after this many seconds")

    dev = add("dev", cmd_dev, "run Postgres, Tansu and a worker with the sample workflow")
    dev.add_argument("--port", type=int, default=6066, help="the worker's HTTP port")
    dev.add_argument("--workdir", type=Path, help="where logs go (default: a temporary dir)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
