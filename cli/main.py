"""``wfjobs``: the command line of workflow-jobs.

The job and workflow verbs talk to a worker's HTTP API (``--url``, else
``WFJOBS_URL``, else ``http://127.0.0.1:6066``) with the token ``cli.http``
finds, waiting ``--http-timeout`` (else ``WFJOBS_HTTP_TIMEOUT_S``, else 30) seconds
for each answer. ``migrate``, ``tokens``, ``produce`` and ``events`` use the settings
directly (``DATABASE_URL``, ``KAFKA_BOOTSTRAP_SERVERS``,
``WFJOBS_SCHEMA_REGISTRY_URL``...), and ``dev`` starts the embedded stack; those
do not take ``--url`` or ``--http-timeout``. ``tokens`` works on the database, not through a worker:
whoever can reach the database can always make the first token, and revoke
one while every worker is down.

Output is tables and colours on a terminal, plain text when piped, and JSON with
``--json``. Errors print their code and message (with ``--json``, as a JSON
object) and exit 1 (2 for usage errors); a command stopped by Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from rich.markup import escape

from cli.arguments import (
    job_id_argument,
    json_object,
    positive_count,
    positive_seconds,
    required,
)
from cli.errors import CliError
from cli.http import DEFAULT_URL, HTTP_TIMEOUT_ENV, HTTP_TIMEOUT_S, ApiClient, path_segment
from cli.kafka import cmd_events, cmd_produce, cmd_produce_completion
from cli.render import (
    Output,
    render_dead_letters,
    render_explanation,
    render_failed_outbox,
    render_job,
    render_jobs,
    render_workflow,
    render_workflows,
    status_markup,
)
from cli.watch import cmd_watch
from schemas import defaults
from schemas.errors import WorkflowJobsError

T = TypeVar("T")

DEV_EXTRA_INSTALL = "pip install 'workflow-jobs[dev]'"


def _api(args: argparse.Namespace) -> ApiClient:
    return ApiClient(args.url, timeout_s=args.http_timeout)


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
        definition["name"] = required(args.name, "--name")
    name = definition.get("name")
    if not isinstance(name, str) or not name:
        raise CliError("INVALID_ARGUMENT", "the workflow has no name: add one or pass --name")
    headers = {"If-Match": f'"{args.if_version}"'} if args.if_version else None
    answer = _api(args).call(
        "PUT", f"/v1/workflows/{path_segment(name)}", {"workflow": definition}, headers=headers
    )

    def render(answer: dict[str, Any]) -> None:
        stored = answer.get("workflow", {})
        out.print(
            f"stored workflow [bold]{escape(str(stored.get('name', name)))}[/] "
            f"version {escape(str(stored.get('version', '')))}"
        )

    return _show(out, answer, render)


def cmd_workflows_get(args: argparse.Namespace, out: Output) -> int:
    name = required(args.name, "NAME")
    answer = _api(args).call("GET", f"/v1/workflows/{path_segment(name)}")
    return _show(out, answer, lambda answer: render_workflow(out, answer.get("workflow", {})))


def cmd_workflows_list(args: argparse.Namespace, out: Output) -> int:
    query = {"limit": args.limit or None, "page_token": args.page_token}
    answer = _api(args).call("GET", "/v1/workflows", query=query)

    def render(answer: dict[str, Any]) -> None:
        render_workflows(out, answer.get("workflows", []), str(answer.get("next_page_token", "")))

    return _show(out, answer, render)


def cmd_submit(args: argparse.Namespace, out: Output) -> int:
    body: dict[str, Any] = {
        "job_id": job_id_argument(args.job_id),
        "input": json_object(args.input, "--input"),
    }
    if args.workflow_file:
        body["workflow"] = json_object(f"@{args.workflow_file}", "workflow file")
    else:
        body["workflow_name"] = args.workflow_name
    if args.max_attempts:
        body["max_attempts"] = args.max_attempts
    if args.deadline_ms:
        body["deadline_ms"] = args.deadline_ms
    answer = _api(args).call("POST", "/v1/workflow-runs", body)

    def render(answer: dict[str, Any]) -> None:
        job = answer.get("job", {})
        # proto3 JSON leaves out a false ``created``: absent means the job already existed.
        created = "submitted" if answer.get("created", False) else "already existed"
        out.print(
            f"job [bold]{escape(str(job.get('job_id', body['job_id'])))}[/] {created}: "
            f"{status_markup(str(job.get('status', '')))}"
        )

    return _show(out, answer, render)


def cmd_get(args: argparse.Namespace, out: Output) -> int:
    job_id = required(args.job_id, "JOB_ID")
    answer = _api(args).call("GET", f"/v1/workflow-runs/{path_segment(job_id)}")
    return _show(out, answer, lambda answer: render_job(out, answer.get("job", {})))


def cmd_explain(args: argparse.Namespace, out: Output) -> int:
    job_id = required(args.job_id, "JOB_ID")
    answer = _api(args).call("GET", f"/v1/workflow-runs/{path_segment(job_id)}:explain")
    return _show(out, answer, lambda answer: render_explanation(out, answer))


def cmd_list(args: argparse.Namespace, out: Output) -> int:
    query = {
        "status": args.status,
        "workflow_name": args.name,
        "limit": args.limit or None,
        "page_token": args.page_token,
    }
    answer = _api(args).call("GET", "/v1/workflow-runs", query=query)

    def render(answer: dict[str, Any]) -> None:
        render_jobs(out, answer.get("jobs", []), str(answer.get("next_page_token", "")))

    return _show(out, answer, render)


def cmd_complete(args: argparse.Namespace, out: Output) -> int:
    job_id, step = required(args.job_id, "JOB_ID"), required(args.step, "STEP")
    response = json_object(args.response, "--response")
    path = f"/v1/workflow-runs/{path_segment(job_id)}/steps/{path_segment(step)}:complete"
    answer = _api(args).call("POST", path, {"response": response})
    if out.as_json:
        out.json(answer)
    else:
        outcome = str(answer.get("outcome", ""))
        job = answer.get("job", {})
        style = "green" if outcome == "COMPLETED" else "yellow"
        out.print(
            f"[{style}]{escape(outcome)}[/]: {escape(str(answer.get('message', '')))} "
            f"(job is {status_markup(str(job.get('status', '')))})"
        )
    # The verb answered, but the step was not accepted: a script must notice.
    return 0 if answer.get("outcome") in ("COMPLETED", "ALREADY_DONE") else 1


def cmd_resume(args: argparse.Namespace, out: Output) -> int:
    """One ended job as a new run, or (with filter flags) every ended job they pick."""
    bulk = bool(args.status or args.workflow or args.owner or args.created_before)
    if args.job_id and bulk:
        raise CliError(
            "INVALID_ARGUMENT", "name a job id or filter flags for a bulk resume, not both"
        )
    if not args.job_id and not bulk:
        raise CliError(
            "INVALID_ARGUMENT",
            "name a job id, or --status/--workflow/--owner/--created-before for a bulk resume",
        )
    options: dict[str, Any] = {}
    if args.current_definition:
        options["use_current_definition"] = True
    if args.key:
        options["request_key"] = args.key
    client = _api(args)
    if args.job_id:
        job_id = required(args.job_id, "JOB_ID")
        if args.from_step:
            options["from_step"] = args.from_step
        if args.max_attempts:
            options["max_attempts"] = args.max_attempts
        answer = client.call("POST", f"/v1/workflow-runs/{path_segment(job_id)}:resume", options)

        def render(answer: dict[str, Any]) -> None:
            job = answer.get("job", {})
            made = "resumed" if answer.get("created", False) else "was already resumed"
            kept = len(job.get("checkpoints", []))
            out.print(
                f"job {escape(job_id)} {made} as job [bold]{escape(str(job.get('job_id', '')))}"
                f"[/]: {status_markup(str(job.get('status', '')))}, {kept} checkpoint(s) kept"
            )

        return _show(out, answer, render)
    if args.from_step or args.max_attempts:
        raise CliError(
            "INVALID_ARGUMENT", "--from-step and --max-attempts apply to one job, not a bulk resume"
        )
    body = {
        **options,
        "statuses": args.status or [],
        "workflow_name": args.workflow or "",
        "owner": args.owner or "",
        "limit": args.limit,
    }
    if args.created_before:
        body["created_before"] = args.created_before
    answer = client.call("POST", "/v1/workflow-runs:resume", body)
    if out.as_json:
        out.json(answer)
    else:
        resumed, refused = answer.get("resumed", []), answer.get("refused", [])
        out.print(f"resumed {len(resumed)} job(s)")
        for job in resumed:
            out.print(
                f"  {escape(str(job.get('resumed_from', '')))} -> "
                f"{escape(str(job.get('job_id', '')))}"
            )
        for refusal in refused:
            out.print(
                f"[yellow]not resumed[/] {escape(str(refusal.get('job_id', '')))}: "
                f"{escape(str(refusal.get('code', '')))} {escape(str(refusal.get('message', '')))}"
            )
    # Some job was left as it was: a script must notice.
    return 1 if answer.get("refused") else 0


def cmd_cancel(args: argparse.Namespace, out: Output) -> int:
    """One job, or (with filter flags) every live job they pick."""
    bulk = bool(args.status or args.workflow or args.owner or args.created_before)
    if args.job_id and bulk:
        raise CliError(
            "INVALID_ARGUMENT", "name a job id or filter flags for a bulk cancel, not both"
        )
    if not args.job_id and not bulk:
        raise CliError(
            "INVALID_ARGUMENT",
            "name a job id, or --status/--workflow/--owner/--created-before for a bulk cancel",
        )
    reason = {"reason": args.reason} if args.reason else {}
    client = _api(args)
    if args.job_id:
        job_id = required(args.job_id, "JOB_ID")
        answer = client.call("POST", f"/v1/workflow-runs/{path_segment(job_id)}:cancel", reason)

        def render(answer: dict[str, Any]) -> None:
            outcome = str(answer.get("outcome", ""))
            job = answer.get("job", {})
            style = "green" if outcome in ("CANCELLED", "CANCEL_REQUESTED") else "yellow"
            out.print(
                f"[{style}]{escape(outcome)}[/]: {escape(str(answer.get('message', '')))} "
                f"(job is {status_markup(str(job.get('status', '')))})"
            )

        _show(out, answer, render)
        # A job that had already finished was not cancelled: a script must notice.
        return 1 if answer.get("outcome") == "ALREADY_FINISHED" else 0
    body: dict[str, Any] = {
        **reason,
        "workflow_name": args.workflow or "",
        "owner": args.owner or "",
    }
    if args.status:
        body["status"] = args.status
    if args.created_before:
        body["created_before"] = args.created_before
    answer = client.call("POST", "/v1/workflow-runs:cancel", body)
    if out.as_json:
        out.json(answer)
        return 0
    cancelled, requested = answer.get("cancelled", []), answer.get("cancel_requested", [])
    out.print(f"cancelled {len(cancelled)} job(s); asked {len(requested)} running job(s) to stop")
    for job_id in cancelled:
        out.print(f"  {escape(str(job_id))} {status_markup('CANCELLED')}")
    for job_id in requested:
        out.print(f"  {escape(str(job_id))} [green]CANCEL_REQUESTED[/]")
    return 0


def cmd_outbox_list(args: argparse.Namespace, out: Output) -> int:
    query = {
        "status": "FAILED",
        "job_id": args.job,
        "limit": args.limit or None,
        "page_token": args.page_token,
    }
    answer = _api(args).call("GET", "/v1/outbox", query=query)
    return _show(out, answer, lambda answer: render_failed_outbox(out, answer))


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
    answer = _api(args).call("POST", "/v1/outbox:redrive", body)

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
    query = {"max": args.max, "page_token": args.page_token}
    answer = _api(args).call("GET", "/v1/requests-dlq", query=query)
    return _show(out, answer, lambda answer: render_dead_letters(out, answer))


_DIGITS = re.compile(r"[0-9]{1,19}")


def _position(text: str) -> dict[str, int]:
    partition, sep, offset = text.partition(":")
    # ASCII digits only: str.isdigit() also takes "²", which int() refuses.
    if not sep or not _DIGITS.fullmatch(partition) or not _DIGITS.fullmatch(offset):
        raise CliError("INVALID_ARGUMENT", f"--offset takes PARTITION:OFFSET, got {text[:100]!r}")
    return {"partition": int(partition), "offset": int(offset)}


def cmd_dlq_redrive(args: argparse.Namespace, out: Output) -> int:
    if bool(args.offset) == bool(args.all):
        raise CliError("INVALID_ARGUMENT", "name --offset P:O (repeatable) or --all (one of)")
    body: dict[str, Any] = (
        {"positions": [_position(text) for text in args.offset]} if args.offset else {"all": True}
    )
    answer = _api(args).call("POST", "/v1/requests-dlq:redrive", body)

    def render(answer: dict[str, Any]) -> None:
        redriven = answer.get("redriven", [])
        topic = escape(str(answer.get("topic", "")))
        out.print(f"redrove {len(redriven)} dead letter(s) to {topic}")
        for message in redriven:
            who = message.get("job_id") or message.get("key") or "(undecodable)"
            out.print(f"  {message.get('partition')}:{message.get('offset')} {escape(str(who))}")

    return _show(out, answer, render)


def cmd_migrate(args: argparse.Namespace, out: Output) -> int:
    # Imported here: the verbs that only speak HTTP need neither the store nor the settings.
    from store.migrate import migrate

    applied = _on_database(migrate(_database_url(args)))
    if out.as_json:
        out.json({"applied": applied})
    elif applied:
        for name in applied:
            out.print(f"applied [bold]{escape(name)}[/]")
    else:
        out.print("database is up to date")
    return 0


def _database_url(args: argparse.Namespace) -> str:
    from store.databases import check_dsn
    from streams.settings import Settings

    dsn: str = args.dsn or Settings.from_env().database_url
    if not dsn:
        raise CliError("INVALID_ARGUMENT", "no database: set DATABASE_URL or pass --dsn")
    check_dsn(dsn)
    return dsn


def _on_database(work: Coroutine[Any, Any, T]) -> T:
    """Run ``work``, which opens its own connection: a database that cannot be
    reached, or is not migrated, is a one-line error, not the driver's traceback."""
    from store.errors import database_failure

    try:
        return asyncio.run(work)
    except Exception as exc:
        error = database_failure(exc)
        if error is None:
            raise
        raise error from None


def _token_json(record: Any) -> dict[str, Any]:
    from schemas.contract import timestamp_json

    return {
        "id": record.id,
        "principal": record.principal,
        "scopes": list(record.scopes),
        "created_at": timestamp_json(record.created_at),
        "revoked_at": timestamp_json(record.revoked_at) if record.revoked_at else None,
    }


def cmd_tokens_create(args: argparse.Namespace, out: Output) -> int:
    from store.tokens import create_token
    from streams.auth import parse_scopes

    scopes = parse_scopes(args.scope or [])
    issued = _on_database(create_token(_database_url(args), args.principal, scopes))
    if out.as_json:
        out.json({"token": issued.token, **_token_json(issued.record)})
        return 0
    record = issued.record
    out.print(
        f"token [bold]{escape(record.id)}[/] for [bold]{escape(record.principal)}[/] "
        f"with {escape(', '.join(record.scopes))}; it is shown only this once:"
    )
    # Alone on its line and unstyled, so it can be copied or piped as it is.
    out.console.print(issued.token, markup=False, soft_wrap=True)
    return 0


def cmd_tokens_list(args: argparse.Namespace, out: Output) -> int:
    from rich.table import Table

    from store.tokens import list_tokens

    records = _on_database(list_tokens(_database_url(args)))
    if out.as_json:
        out.json({"tokens": [_token_json(record) for record in records]})
        return 0
    table = Table()
    for column in ("id", "principal", "scopes", "created", "revoked"):
        table.add_column(column)
    for record in records:
        table.add_row(
            escape(record.id),
            escape(record.principal),
            escape(",".join(record.scopes)),
            escape(record.created_at.isoformat(timespec="seconds")),
            escape(record.revoked_at.isoformat(timespec="seconds")) if record.revoked_at else "",
        )
    out.console.print(table)
    return 0


def cmd_tokens_revoke(args: argparse.Namespace, out: Output) -> int:
    from store.tokens import revoke_token

    record = _on_database(revoke_token(_database_url(args), args.id.strip()))
    if out.as_json:
        out.json(_token_json(record))
    else:
        out.print(
            f"revoked token [bold]{escape(record.id)}[/] of {escape(record.principal)}; "
            "workers refuse it within a second"
        )
    return 0


def cmd_dev(args: argparse.Namespace, out: Output) -> int:
    run_dev_stack = _dev_stack()
    return run_dev_stack(
        web_port=args.port, workdir=args.workdir, fresh=args.fresh, console=out.console
    )


def _dev_stack() -> Callable[..., int]:
    """The embedded stack's entry point; it needs the ``dev`` extra, which a plain
    install of workflow-jobs leaves out."""
    try:
        from devstack.stack import missing_dev_requirements, run_dev_stack
    except ModuleNotFoundError as exc:
        missing = [exc.name or "devstack"]
    else:
        missing = missing_dev_requirements()
        if not missing:
            return run_dev_stack
    raise CliError(
        "FAILED_PRECONDITION",
        f"`wfjobs dev` needs the dev extra ({', '.join(missing)} missing): {DEV_EXTRA_INSTALL}",
    )


# --------------------------------------------------------------------------- parser


class _HttpOption(argparse.Action):
    """``--url`` or ``--http-timeout``, remembering that it was given: a command
    that does not use the HTTP API refuses it rather than ignoring it."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        namespace.http_option = option_string


def _common(parser: argparse.ArgumentParser, *, top: bool, url: bool) -> None:
    # Accepted before or after the subcommand; SUPPRESS keeps a subcommand's
    # unset option from overwriting what was given before it.
    if url:
        default_url = os.environ.get("WFJOBS_URL", DEFAULT_URL) if top else argparse.SUPPRESS
        parser.add_argument(
            "--url",
            action=_HttpOption,
            default=default_url,
            help=f"the worker's HTTP API (env WFJOBS_URL, default {DEFAULT_URL})",
        )
        parser.add_argument(
            "--http-timeout",
            action=_HttpOption,
            type=positive_seconds,
            default=None if top else argparse.SUPPRESS,
            metavar="S",
            help=f"how long a call waits for its answer, seconds (env {HTTP_TIMEOUT_ENV}, "
            f"default {HTTP_TIMEOUT_S:g}; not watch's stream)",
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

    tokens = commands.add_parser(
        "tokens", help="API tokens: create, list and revoke them (DATABASE_URL)"
    )
    token_verbs = tokens.add_subparsers(dest="verb", required=True, metavar="VERB")
    token_create = token_verbs.add_parser(
        "create", parents=[local], help="make a token and print it, once"
    )
    token_create.add_argument("--principal", required=True, help="who the token speaks for")
    token_create.add_argument(
        "--scope",
        action="append",
        metavar="SCOPE",
        help="submit, read, complete, cancel, admin, define-inline or fleet (repeatable, "
        "or comma-separated)",
    )
    token_create.set_defaults(handler=cmd_tokens_create, uses_url=False)
    token_list = token_verbs.add_parser(
        "list", parents=[local], help="list tokens (never their secrets)"
    )
    token_list.set_defaults(handler=cmd_tokens_list, uses_url=False)
    token_revoke = token_verbs.add_parser(
        "revoke", parents=[local], help="revoke a token by its id"
    )
    token_revoke.add_argument("id", help="the token's id (the 12 hex digits after wfj_)")
    token_revoke.set_defaults(handler=cmd_tokens_revoke, uses_url=False)
    for verb in (token_create, token_list, token_revoke):
        verb.add_argument("--dsn", help="the database (default: DATABASE_URL)")

    workflows = commands.add_parser("workflows", help="store and read workflow definitions")
    verbs = workflows.add_subparsers(dest="verb", required=True, metavar="VERB")
    put = verbs.add_parser("put", parents=[common], help="store a definition from a JSON file")
    put.add_argument("file", help="the workflow envelope, as JSON")
    put.add_argument("--name", help="store under this name (default: the file's name field)")
    put.add_argument(
        "--if-version",
        type=int,
        default=0,
        metavar="N",
        help="replace only version N of the stored definition (If-Match); refused otherwise",
    )
    put.set_defaults(handler=cmd_workflows_put)
    get_workflow = verbs.add_parser("get", parents=[common], help="show a stored definition")
    get_workflow.add_argument("name")
    get_workflow.set_defaults(handler=cmd_workflows_get)
    listed = verbs.add_parser("list", parents=[common], help="list stored definitions")
    listed.add_argument("--limit", type=int, default=0, help="page size (0: 50, at most 500)")
    listed.add_argument("--page-token", help="the next_page_token of a previous page")
    listed.set_defaults(handler=cmd_workflows_list)

    submit = add("submit", cmd_submit, "submit a job")
    source = submit.add_mutually_exclusive_group(required=True)
    source.add_argument("--workflow-name", help="a stored workflow")
    source.add_argument("--workflow-file", help="an inline workflow envelope (JSON file)")
    submit.add_argument(
        "--input", required=True, help="the input as a JSON object (or @file, or - for stdin)"
    )
    submit.add_argument("--job-id", help="a UUID, the idempotency key (default: a new one)")
    submit.add_argument("--max-attempts", type=int, default=0, help="0 uses the server default")
    submit.add_argument(
        "--deadline-ms",
        type=int,
        default=0,
        help="a whole-job deadline from now, queue wait included (0: the definition's, if any)",
    )

    get = add("get", cmd_get, "show one job with its checkpoints and attempt history")
    get.add_argument("job_id")

    explain = add(
        "explain", cmd_explain, "why a job is in its state, what happens next, what you can run"
    )
    explain.add_argument("job_id")

    watch = add(
        "watch",
        cmd_watch,
        "follow one job's events live until it ends; the exit status is how it ended "
        "(0 COMPLETED, 3 FAILED, 4 DEAD, 5 CANCELLED)",
    )
    watch.add_argument("job_id")

    listing = add("list", cmd_list, "list jobs, newest first")
    listing.add_argument(
        "--status", help="QUEUED, RUNNING, WAITING, COMPLETED, FAILED, DEAD or CANCELLED"
    )
    listing.add_argument("--name", help="only jobs of this workflow")
    listing.add_argument("--limit", type=int, default=0, help="page size (0: 50, at most 500)")
    listing.add_argument("--page-token", help="the next_page_token of a previous page")

    complete = add("complete", cmd_complete, "answer a job's parked external step")
    complete.add_argument("job_id")
    complete.add_argument("step")
    complete.add_argument(
        "--response", required=True, help="the step's response as a JSON object (or @file, -)"
    )

    resume = add(
        "resume",
        cmd_resume,
        "resume a FAILED, DEAD or CANCELLED job as a new run linked to it (or, with filter "
        "flags, every such job they pick that no run resumes yet)",
    )
    resume.add_argument("job_id", nargs="?", help="the ended job (leave out for a bulk resume)")
    resume.add_argument(
        "--from-step",
        metavar="STEP",
        help="keep only the checkpoints before STEP, so the run runs it again",
    )
    resume.add_argument(
        "--current-definition",
        action="store_true",
        help="run the workflow's current stored definition instead of the job's snapshot",
    )
    resume.add_argument(
        "--key", help="the request key: the same key resumes a job once (default: empty)"
    )
    resume.add_argument(
        "--max-attempts", type=int, default=0, help="0 keeps the job's own max attempts"
    )
    resume.add_argument(
        "--status",
        action="append",
        choices=("FAILED", "DEAD", "CANCELLED"),
        help="bulk: only jobs in this status (repeatable; default all three)",
    )
    resume.add_argument("--workflow", help="bulk: only jobs of this workflow")
    resume.add_argument("--owner", help="bulk: only jobs of this principal")
    resume.add_argument(
        "--created-before", metavar="TIME", help="bulk: only jobs created before this RFC 3339 time"
    )
    resume.add_argument(
        "--limit", type=int, default=0, help="bulk: at most this many jobs (0: 100, at most 1000)"
    )

    cancel = add(
        "cancel",
        cmd_cancel,
        "cancel a job: QUEUED or WAITING at once, RUNNING by its worker within a heartbeat "
        "(or, with filter flags, every live job they pick)",
    )
    cancel.add_argument("job_id", nargs="?", help="the job (leave out for a bulk cancel)")
    cancel.add_argument("--reason", help="why, kept on the job and its CANCELLED event")
    cancel.add_argument(
        "--status",
        choices=("QUEUED", "RUNNING", "WAITING"),
        help="bulk: only jobs in this status (default every live one)",
    )
    cancel.add_argument("--workflow", help="bulk: only jobs of this workflow")
    cancel.add_argument("--owner", help="bulk: only jobs of this principal")
    cancel.add_argument(
        "--created-before", metavar="TIME", help="bulk: only jobs created before this RFC 3339 time"
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
    dlq_list.add_argument("--page-token", help="the next_page_token of a previous page")
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
    produce.add_argument(
        "--deadline-ms",
        type=int,
        default=0,
        help="a whole-job deadline from submission (0: the definition's, if any)",
    )
    produce.add_argument(
        "--timeout", type=positive_seconds, default=30.0, help="delivery timeout, seconds"
    )

    produce_completion = add(
        "produce-completion",
        cmd_produce_completion,
        "complete a parked external step through the completions topic (a StepCompletion)",
        http=False,
    )
    produce_completion.add_argument("job_id")
    produce_completion.add_argument("step")
    produce_completion.add_argument(
        "--response", required=True, help="the step's response as a JSON object (or @file, -)"
    )
    produce_completion.add_argument(
        "--principal",
        help="who completes it (honoured only where WFJOBS_TRUST_REQUEST_PRINCIPAL is on)",
    )
    produce_completion.add_argument(
        "--request-id", help="echoed on the StepCompletionResult (default: a new UUID)"
    )
    produce_completion.add_argument(
        "--timeout", type=positive_seconds, default=30.0, help="delivery timeout, seconds"
    )

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
    events.add_argument(
        "--max", type=positive_count, help="stop after this many distinct events (1 or more)"
    )
    events.add_argument("--timeout", type=positive_seconds, help="stop after this many seconds")

    dev = add(
        "dev", cmd_dev, "run Postgres, Tansu and a worker with the sample workflow", http=False
    )
    dev.add_argument("--port", type=int, default=defaults.WEB_PORT, help="the worker's HTTP port")
    dev.add_argument(
        "--workdir",
        type=Path,
        default=Path(defaults.DEV_FOLDER),
        help="where Postgres's data and the worker log are kept (default: ./.wfjobs-dev)",
    )
    dev.add_argument(
        "--fresh", action="store_true", help="delete the data kept by earlier runs first"
    )
    return parser


def _http_timeout(parser: argparse.ArgumentParser, given: float | None) -> float:
    """``--http-timeout``, else ``WFJOBS_HTTP_TIMEOUT_S``, else the default."""
    if given is not None:
        return given
    text = os.environ.get(HTTP_TIMEOUT_ENV, "").strip()
    if not text:
        return HTTP_TIMEOUT_S
    try:
        return positive_seconds(text)
    except argparse.ArgumentTypeError as exc:
        parser.error(f"{HTTP_TIMEOUT_ENV}: {exc}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    arguments = sys.argv[1:] if argv is None else list(argv)
    for argument in arguments:
        # Bytes that are not UTF-8 reach Python as lone surrogates, which no URL or
        # Kafka message can carry, and no stored job should.
        try:
            argument.encode()
        except UnicodeEncodeError:
            parser.error(f"argument {os.fsencode(argument)[:100]!r} is not UTF-8 text")
    args = parser.parse_args(arguments)
    uses_http = getattr(args, "uses_url", True)
    if getattr(args, "http_option", None) and not uses_http:
        parser.error(f"{args.http_option}: `wfjobs {args.command}` does not use the HTTP API")
    if uses_http:
        args.http_timeout = _http_timeout(parser, args.http_timeout)
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
