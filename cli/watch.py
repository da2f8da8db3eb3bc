"""``wfjobs watch JOB_ID``: one job's events as a live timeline, until it ends.

It reads the API's event stream (``GET /v1/workflow-runs/{id}/events``), so it
needs no Kafka client. A dropped connection (a worker restarting, say) is
picked up again after the last event shown, so every event is printed once and
in order; a replica serving all the watchers it may (429) is asked again, until
the stream has delivered nothing, not even a keep-alive, for a minute. The
exit status says how the job ended: 0 COMPLETED, 3 FAILED, 4 DEAD,
5 CANCELLED; 1 is an error of the command itself.
"""

from __future__ import annotations

import argparse
import http.client
import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn

from cli.arguments import required
from cli.errors import CliError
from cli.http import ApiClient, path_segment
from cli.render import Output, event_summary, status_markup

EXIT_STATUS: Mapping[str, int] = {"COMPLETED": 0, "FAILED": 3, "DEAD": 4, "CANCELLED": 5}

# The server sends a keep-alive at least every 15 s; a read waiting far
# longer than that means the connection is gone without saying so.
_IDLE_TIMEOUT_S = 45.0
# How long the stream may deliver nothing (cut, refused or full) before watch gives up.
_GIVE_UP_AFTER_S = 60.0
_RETRY_CAP_S = 5.0
_NOT_A_WORKER = "is --url a workflow-jobs worker?"
# Answers that say "come back later": the worker's own UNAVAILABLE, and
# RESOURCE_EXHAUSTED when the replica serves all the watchers it may; and what a
# proxy in front of the worker answers for it while it restarts (its own page,
# not the API's JSON).
_RETRY_CODES = frozenset({"UNAVAILABLE", "RESOURCE_EXHAUSTED", "HTTP_502", "HTTP_503", "HTTP_504"})


@dataclass(frozen=True)
class StreamMessage:
    event: str
    id: str
    data: Any


def messages(lines: Iterator[bytes]) -> Iterator[StreamMessage]:
    """Server-Sent Events messages from a stream's lines; comments are dropped."""
    fields: dict[str, str] = {}
    for raw in lines:
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if not line:
            if "data" in fields:
                try:
                    data = json.loads(fields["data"])
                except ValueError:
                    raise CliError(
                        "INTERNAL",
                        f"the event stream sent data that is not JSON: {fields['data'][:100]!r} "
                        f"({_NOT_A_WORKER})",
                    ) from None
                yield StreamMessage(fields.get("event") or "message", fields.get("id", ""), data)
            fields = {}
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        fields[name] = fields[name] + "\n" + value if name == "data" and name in fields else value


class Timeline:
    """Draws the messages: a line per event, and a bar for the running step's progress."""

    def __init__(self, out: Output) -> None:
        self._out = out
        self._bar: Progress | None = None
        self._task: Any = None

    def event(self, event: Mapping[str, Any]) -> None:
        self.close()
        self._out.print(event_summary(event, with_job=False))

    def progress(self, report: Mapping[str, Any]) -> None:
        fraction = float(report.get("fraction", 0.0))
        step = escape(str(report.get("step_name", "")))
        message = escape(str(report.get("message", "")))
        if not self._out.console.is_terminal:
            self._out.print(f"  {step} {fraction:.0%} {message}".rstrip())
            return
        if self._bar is None:
            self._bar = Progress(
                TextColumn("  {task.description}"),
                BarColumn(),
                TextColumn("{task.percentage:>3.0f}% {task.fields[message]}"),
                console=self._out.console,
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task(step, total=1.0, message=message)
        self._bar.update(self._task, description=step, completed=fraction, message=message)

    def end(self, status: str) -> None:
        self.close()
        self._out.print(f"job ended {status_markup(status)}" if status else "job was removed")

    def close(self) -> None:
        # While the bar runs, the terminal's cursor is hidden and the process's
        # stdout and stderr are redirected through it.
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def cmd_watch(args: argparse.Namespace, out: Output) -> int:
    job_id = required(args.job_id, "JOB_ID")
    timeline = Timeline(out)
    try:
        return _follow(ApiClient(args.url), job_id, out, timeline)
    finally:
        # Ctrl-C or an error mid-step must not leave the bar drawing over the
        # shell, with the cursor hidden.
        timeline.close()


class _Outage:
    """How long the stream has delivered nothing, and how long to wait before the
    next try. A connect alone is not progress: a worker that takes the stream and
    drops it at once would otherwise be retried for ever. Anything read from the
    stream is, keep-alives included, so a proxy that cuts long streams does not
    end the watch of a job parked for days."""

    def __init__(self) -> None:
        self._since: float | None = None
        self._pause = 0.5

    def heard(self, lines: Iterator[bytes]) -> Iterator[bytes]:
        for line in lines:
            self._since, self._pause = None, 0.5
            yield line

    def too_long(self) -> bool:
        now = time.monotonic()
        if self._since is None:
            self._since = now
        return now - self._since > _GIVE_UP_AFTER_S

    def wait(self) -> None:
        time.sleep(self._pause)
        self._pause = min(self._pause * 2, _RETRY_CAP_S)


def _follow(client: ApiClient, job_id: str, out: Output, timeline: Timeline) -> int:
    path = f"/v1/workflow-runs/{path_segment(job_id)}/events"
    last_id = ""
    outage = _Outage()
    cut = CliError(
        "UNAVAILABLE", f"the event stream of {job_id} stayed cut for {_GIVE_UP_AFTER_S:g} s"
    )
    while True:
        headers = {"Last-Event-ID": last_id} if last_id else {}
        try:
            with client.stream(path, headers=headers, idle_timeout_s=_IDLE_TIMEOUT_S) as lines:
                for message in messages(outage.heard(lines)):
                    if not isinstance(message.data, dict):
                        # Every message a worker sends is an object; a
                        # traceback is no answer to some other server's.
                        raise CliError(
                            "INTERNAL",
                            f"the event stream of {client.base_url} sent "
                            f"{type(message.data).__name__} data, not an object ({_NOT_A_WORKER})",
                        )
                    if out.as_json:
                        out.json_line(
                            {"event": message.event, "id": message.id, "data": message.data}
                        )
                    if message.event == "end":
                        status = str(message.data.get("status", ""))
                        if not out.as_json:
                            timeline.end(status)
                        return EXIT_STATUS.get(status, 1)
                    if message.id:
                        last_id = message.id
                    if out.as_json:
                        continue
                    if message.event == "progress":
                        timeline.progress(message.data)
                    else:
                        timeline.event(message.data)
        except CliError as exc:
            if exc.code not in _RETRY_CODES or outage.too_long():
                raise
        except (OSError, TimeoutError, http.client.HTTPException):
            # Cut mid-stream (a reset, or a chunked body that stops short when
            # its server dies): pick up after the last event shown.
            if outage.too_long():
                raise cut from None
        else:
            # Closed without its end message (a worker stopping, say): cut too.
            if outage.too_long():
                raise cut
        outage.wait()


__all__ = ["EXIT_STATUS", "StreamMessage", "Timeline", "cmd_watch", "messages"]
