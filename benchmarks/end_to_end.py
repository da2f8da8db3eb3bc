"""End to end: N jobs of a 3-step in-process workflow through real services.

    python -m benchmarks.end_to_end --jobs 500 [--workers 1] [--concurrency 32]

Postgres (``DATABASE_URL``, else embedded) and Apache Kafka
(``KAFKA_BOOTSTRAP_SERVERS``, else the project's own broker) come from
:mod:`devstack.postgres` and :mod:`devstack.apache_kafka`; the worker is the
real ``faust -A streams.app worker`` process with every role. The workflow is
the sample tokenize -> embed -> review with the review answered in-process, so
every job has five commit points
(ACCEPTED, three STEP_CHECKPOINTs, COMPLETED), each an outbox row published to
Kafka.

Jobs are submitted over HTTP; a job counts as done when its COMPLETED event is
read back from the events topic, so the latency covers the relay as well.
Printed per job: Postgres commits (``pg_stat_database.xact_commit`` delta),
statements, i.e. round trips (``pg_stat_statements`` calls, when the server has
it loaded; the embedded server started here does), and worker CPU milliseconds.
All of these include the fixed background work of the run (polls, LISTEN, the
sweeper), spread over the jobs. Nothing is asserted: this only measures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from rich.console import Console
from rich.table import Table

from cli.http import ApiClient
from devstack.apache_kafka import ApacheKafkaService
from devstack.postgres import PostgresService
from devstack.processes import free_port
from devstack.stack import WorkerProcess, ensure_topics, worker_environment
from schemas.contract import WorkflowRunEvent
from schemas.serde import EventDecoder
from store.migrate import migrate
from store.tokens import create_token
from streams.auth import SCOPES
from workflows.samples import HANDLER_MODULE, automatic_workflow

WORKFLOW_NAME = "bench-embed-review"
EVENTS_PER_JOB = 5
COMPLETED = WorkflowRunEvent.Type.Value("TYPE_COMPLETED")
TERMINAL = {
    WorkflowRunEvent.Type.Value("TYPE_COMPLETED"),
    WorkflowRunEvent.Type.Value("TYPE_FAILED"),
    WorkflowRunEvent.Type.Value("TYPE_DEAD"),
}
# Loaded at server start so statements can be counted; only for the embedded server.
PG_STAT_SETTINGS = {
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track": "all",
}
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class DbCounters:
    commits: int
    statements: int | None


@dataclass
class Result:
    jobs: int
    workers: int
    completed: int
    failed: int
    events: int
    elapsed_s: float
    jobs_per_s: float
    events_per_s: float
    latency_ms: dict[str, float] = field(default_factory=dict)
    commits_per_job: float = 0.0
    statements_per_job: float | None = None
    worker_cpu_ms_per_job: float = 0.0
    postgres: str = ""
    kafka: str = ""


# --------------------------------------------------------------------------- measuring


def bench_topics(prefix: str, suffix: str) -> dict[str, str]:
    """A run's own requests, events and dead-letter topics, as worker settings."""
    return {
        "WFJOBS_REQUESTS_TOPIC": f"{prefix}-{suffix}",
        "WFJOBS_EVENTS_TOPIC": f"{prefix}-events-{suffix}",
        "WFJOBS_REQUESTS_DLQ_TOPIC": f"{prefix}-{suffix}.dlq",
    }


def db_counters(dsn: str) -> DbCounters:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        commits = int(row[0]) if row else 0
        statements: int | None = None
        try:
            found = conn.execute(
                "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements"
                " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            ).fetchone()
            statements = int(found[0]) if found else None
        except psycopg.Error:
            statements = None  # the extension is not loaded on this server
    return DbCounters(commits, statements)


def enable_statement_counts(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("SELECT pg_stat_statements_reset()")
        except psycopg.Error:
            pass


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # Fields 14 and 15 of stat(5); the split above starts at field 3.
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(fraction * len(sorted_values)) - 1))
    return sorted_values[index]


class EventWatcher(threading.Thread):
    """Reads the events topic and notes when each job's terminal event arrives."""

    def __init__(self, bootstrap: str, topic: str, expected_jobs: int) -> None:
        super().__init__(name="event-watcher", daemon=True)
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
            }
        )
        # Assigned by hand from the first offset: no group join to wait for.
        partitions = self._consumer.list_topics(topic, timeout=15).topics[topic].partitions
        self._consumer.assign(
            [TopicPartition(topic, partition, OFFSET_BEGINNING) for partition in partitions]
        )
        self._decoder = EventDecoder()
        self._expected = expected_jobs
        self._halt = threading.Event()
        self.done = threading.Event()
        self.finished_at: dict[str, float] = {}
        self.completed: set[str] = set()
        self.event_ids: set[int] = set()
        self.last_event_at = 0.0

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                message = self._consumer.poll(0.2)
                if message is None or message.error() is not None:
                    continue
                event = self._decoder.decode(message.value())
                now = time.monotonic()
                if event.event_id in self.event_ids:
                    continue
                self.event_ids.add(event.event_id)
                self.last_event_at = now
                if event.type in TERMINAL and event.job_id not in self.finished_at:
                    self.finished_at[event.job_id] = now
                    if event.type == COMPLETED:
                        self.completed.add(event.job_id)
                if (
                    len(self.finished_at) >= self._expected
                    and len(self.event_ids) >= self._expected * EVENTS_PER_JOB
                ):
                    self.done.set()
        finally:
            self._consumer.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)


# --------------------------------------------------------------------------- the run


def run(args: argparse.Namespace, console: Console) -> Result:
    workdir = Path(tempfile.mkdtemp(prefix="wfjobs-bench-"))
    external_db = bool(os.environ.get("DATABASE_URL"))
    postgres = PostgresService(settings=None if external_db else PG_STAT_SETTINGS)
    kafka = ApacheKafkaService()
    workers: list[WorkerProcess] = []
    try:
        with console.status("starting Postgres and Apache Kafka..."):
            postgres.start()
            kafka.start()
        dsn = postgres.create_database("bench")
        asyncio.run(migrate(dsn))
        enable_statement_counts(dsn)
        suffix = uuid.uuid4().hex[:8]
        topics = bench_topics("bench-requests", suffix)
        ensure_topics(kafka.bootstrap_servers, topics.values(), partitions=args.partitions)
        with console.status(f"starting {args.workers} worker process(es)..."):
            for index in range(args.workers):
                env = worker_environment(
                    database_url=dsn,
                    bootstrap_servers=kafka.bootstrap_servers,
                    worker_id=f"bench-worker-{index + 1}",
                    web_port=free_port(),
                    data_dir=workdir / f"data-{index + 1}",
                    handlers=(HANDLER_MODULE,),
                    extra={
                        **topics,
                        "WFJOBS_GROUP": f"bench-{suffix}",
                        "WFJOBS_CLAIM_LOOPS": str(args.claim_loops),
                    },
                )
                worker = WorkerProcess(
                    env, workdir=workdir, name=f"worker-{index + 1}", loglevel="warn"
                )
                worker.start()
                workers.append(worker)
        token = asyncio.run(create_token(dsn, "bench", SCOPES)).token
        apis = [ApiClient(worker.url, token=token) for worker in workers]
        apis[0].call("PUT", f"/v1/workflows/{WORKFLOW_NAME}", {"workflow": bench_workflow()})

        watcher = EventWatcher(kafka.bootstrap_servers, topics["WFJOBS_EVENTS_TOPIC"], args.jobs)
        watcher.start()
        before_db = db_counters(dsn)
        before_cpu = sum(process_cpu_s(worker.pid) for worker in workers)
        submitted_at: dict[str, float] = {}
        job_ids = [str(uuid.uuid4()) for _ in range(args.jobs)]

        def submit(index: int) -> None:
            job_id = job_ids[index]
            submitted_at[job_id] = time.monotonic()
            body = {"job_id": job_id, "workflow_name": WORKFLOW_NAME, "input": job_input(index)}
            apis[index % len(apis)].call("POST", "/v1/workflow-runs", body)

        console.print(f"submitting {args.jobs} jobs...")
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
            list(pool.map(submit, range(args.jobs)))
        if not watcher.done.wait(args.timeout):
            console.print(
                f"[red]timed out[/]: {len(watcher.finished_at)}/{args.jobs} jobs finished, "
                f"{len(watcher.event_ids)} events"
            )
        finished = watcher.last_event_at or time.monotonic()
        elapsed = max(finished - started, 1e-9)
        after_cpu = sum(process_cpu_s(worker.pid) for worker in workers)
        after_db = db_counters(dsn)
        watcher.stop()

        latencies = sorted(
            (watcher.finished_at[job] - submitted_at[job]) * 1000
            for job in job_ids
            if job in watcher.finished_at and job in submitted_at
        )
        done = max(len(watcher.finished_at), 1)
        statements = (
            (after_db.statements - before_db.statements) / done
            if after_db.statements is not None and before_db.statements is not None
            else None
        )
        return Result(
            jobs=args.jobs,
            workers=args.workers,
            completed=len(watcher.completed),
            failed=len(watcher.finished_at) - len(watcher.completed),
            events=len(watcher.event_ids),
            elapsed_s=elapsed,
            jobs_per_s=len(watcher.finished_at) / elapsed,
            events_per_s=len(watcher.event_ids) / elapsed,
            latency_ms={
                "p50": percentile(latencies, 0.50),
                "p95": percentile(latencies, 0.95),
                "p99": percentile(latencies, 0.99),
                "mean": statistics.fmean(latencies) if latencies else float("nan"),
            },
            commits_per_job=(after_db.commits - before_db.commits) / done,
            statements_per_job=statements,
            worker_cpu_ms_per_job=(after_cpu - before_cpu) * 1000 / done,
            postgres="DATABASE_URL" if external_db else "embedded",
            kafka="KAFKA_BOOTSTRAP_SERVERS" if kafka.external else "Apache Kafka (own)",
        )
    finally:
        for worker in workers:
            worker.stop()
        kafka.stop()
        postgres.stop()


def bench_workflow() -> dict[str, Any]:
    return automatic_workflow(WORKFLOW_NAME)


def job_input(index: int) -> dict[str, Any]:
    return {"text": f"benchmark job {index}: durable workflow jobs on Postgres and Kafka"}


def render(result: Result, console: Console) -> None:
    console.print(
        f"[bold]end to end[/]: {result.jobs} jobs x 3 steps, {result.workers} worker(s), "
        f"Postgres {result.postgres}, {result.kafka}"
    )
    table = Table()
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("completed / failed", f"{result.completed} / {result.failed}")
    table.add_row("events published", str(result.events))
    table.add_row("elapsed", f"{result.elapsed_s:.2f} s")
    table.add_row("jobs/s", f"{result.jobs_per_s:.1f}")
    table.add_row("events/s", f"{result.events_per_s:.1f}")
    for name in ("p50", "p95", "p99"):
        table.add_row(f"submit -> COMPLETED {name}", f"{result.latency_ms[name]:.1f} ms")
    table.add_row("per job: commits", f"{result.commits_per_job:.1f}")
    statements = result.statements_per_job
    table.add_row(
        "per job: statements (round trips)",
        "n/a (no pg_stat_statements)" if statements is None else f"{statements:.1f}",
    )
    table.add_row("per job: worker CPU", f"{result.worker_cpu_ms_per_job:.2f} ms")
    console.print(table)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.end_to_end", description=__doc__)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--workers", type=int, default=1, help="worker processes")
    parser.add_argument("--claim-loops", type=int, default=4, help="claim loops per worker")
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent submit calls")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for jobs")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.workers < 1 or args.concurrency < 1:
        parser.error("--jobs, --workers and --concurrency must be positive")
    console = Console(stderr=args.json)
    result = run(args, console)
    if args.json:
        print(json.dumps(asdict(result), indent=2))
    else:
        render(result, console)
    return 0 if result.completed == result.jobs else 1


if __name__ == "__main__":
    sys.exit(main())
