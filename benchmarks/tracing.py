"""Jobs/s with tracing off and on, alternating rounds on one Postgres and one Kafka.

    python -m benchmarks.tracing --jobs 300 --rounds 3

Each round runs the workload of :mod:`benchmarks.end_to_end` (3-step
in-process workflow, submitted over HTTP, done when its COMPLETED event is
read back from the topic) twice: once through a worker process with
``WFJOBS_TRACING=off`` and once with ``WFJOBS_TRACING=on``, the order
swapping every round so neither always runs on a warmer server. Each run has
its own database and topics on the same servers. With tracing on, the worker
makes every span (submit, claim, segment, steps, publish) and puts the trace
context on every event, with ``WFJOBS_TRACING_EXPORTER=none``: spans are made
and ended, and not exported (exporting runs in the SDK's own thread, and what
it costs depends on the collector). Printed: jobs/s and worker CPU ms per job
per run, the medians per mode, and on/off ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks.end_to_end import (
    PG_STAT_SETTINGS,
    WORKFLOW_NAME,
    EventWatcher,
    bench_topics,
    bench_workflow,
    job_input,
    process_cpu_s,
)
from cli.http import ApiClient
from devstack.apache_kafka import ApacheKafkaService
from devstack.postgres import PostgresService
from devstack.processes import free_port
from devstack.stack import WorkerProcess, ensure_topics, worker_environment
from store.migrate import migrate
from store.tokens import create_token
from streams.auth import SCOPES
from workflows.samples import HANDLER_MODULE

MODES = ("off", "on")


@dataclass
class Run:
    mode: str
    round: int
    jobs_per_s: float
    cpu_ms_per_job: float
    finished: int


def measure(
    mode: str,
    round_: int,
    args: argparse.Namespace,
    postgres: PostgresService,
    kafka: ApacheKafkaService,
    workdir: Path,
) -> Run:
    suffix = uuid.uuid4().hex[:8]
    dsn = postgres.create_database("bench_tracing")
    asyncio.run(migrate(dsn))
    topics = bench_topics("bench-requests", suffix)
    ensure_topics(kafka.bootstrap_servers, topics.values(), partitions=args.partitions)
    env = worker_environment(
        database_url=dsn,
        bootstrap_servers=kafka.bootstrap_servers,
        worker_id=f"bench-{mode}-{round_}",
        web_port=free_port(),
        data_dir=workdir / f"data-{suffix}",
        handlers=(HANDLER_MODULE,),
        extra={
            **topics,
            "WFJOBS_GROUP": f"bench-{suffix}",
            "WFJOBS_TRACING": mode,
            "WFJOBS_TRACING_EXPORTER": "none",
        },
    )
    worker = WorkerProcess(env, workdir=workdir, name=f"worker-{suffix}", loglevel="warn")
    worker.start()
    try:
        token = asyncio.run(create_token(dsn, "bench", SCOPES)).token
        api = ApiClient(worker.url, token=token)
        api.call("PUT", f"/v1/workflows/{WORKFLOW_NAME}", {"workflow": bench_workflow()})
        watcher = EventWatcher(kafka.bootstrap_servers, topics["WFJOBS_EVENTS_TOPIC"], args.jobs)
        watcher.start()
        before_cpu = process_cpu_s(worker.pid)

        def submit(index: int) -> None:
            body = {
                "job_id": str(uuid.uuid4()),
                "workflow_name": WORKFLOW_NAME,
                "input": job_input(index),
            }
            api.call("POST", "/v1/workflow-runs", body)

        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
            list(pool.map(submit, range(args.jobs)))
        watcher.done.wait(args.timeout)
        elapsed = max((watcher.last_event_at or time.monotonic()) - started, 1e-9)
        cpu_s = process_cpu_s(worker.pid) - before_cpu
        watcher.stop()
        finished = len(watcher.finished_at)
        return Run(
            mode=mode,
            round=round_,
            jobs_per_s=finished / elapsed,
            cpu_ms_per_job=cpu_s * 1000 / max(finished, 1),
            finished=finished,
        )
    finally:
        worker.stop()


def render(runs: Sequence[Run], args: argparse.Namespace, console: Console) -> None:
    console.print(
        f"[bold]tracing[/]: {args.jobs} jobs x 3 steps per run, {args.rounds} round(s), "
        "one worker process, exporter none"
    )
    table = Table()
    for column in ("round", "tracing", "jobs/s", "worker CPU ms/job", "finished"):
        table.add_column(column, justify="right")
    for run in runs:
        table.add_row(
            str(run.round),
            run.mode,
            f"{run.jobs_per_s:.1f}",
            f"{run.cpu_ms_per_job:.2f}",
            str(run.finished),
        )
    console.print(table)
    medians = Table()
    for column in ("tracing", "median jobs/s", "median CPU ms/job", "jobs/s on/off", "CPU on/off"):
        medians.add_column(column, justify="right")
    rate = {m: statistics.median(r.jobs_per_s for r in runs if r.mode == m) for m in MODES}
    cpu = {m: statistics.median(r.cpu_ms_per_job for r in runs if r.mode == m) for m in MODES}
    for mode in MODES:
        medians.add_row(
            mode,
            f"{rate[mode]:.1f}",
            f"{cpu[mode]:.2f}",
            f"{rate[mode] / rate['off']:.2f}",
            f"{cpu[mode] / cpu['off']:.2f}",
        )
    console.print(medians)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tracing", description=__doc__)
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent submit calls")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait per run")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.rounds < 1 or args.concurrency < 1:
        parser.error("--jobs, --rounds and --concurrency must be positive")
    console = Console()
    workdir = Path(tempfile.mkdtemp(prefix="wfjobs-bench-tracing-"))
    external_db = bool(os.environ.get("DATABASE_URL"))
    postgres = PostgresService(settings=None if external_db else PG_STAT_SETTINGS)
    kafka = ApacheKafkaService()
    runs: list[Run] = []
    try:
        with console.status("starting Postgres and Apache Kafka..."):
            postgres.start()
            kafka.start()
        for round_ in range(1, args.rounds + 1):
            # Alternating which mode goes first, so neither always runs warmer.
            order = MODES if round_ % 2 else tuple(reversed(MODES))
            for mode in order:
                with console.status(f"round {round_}: tracing {mode}..."):
                    runs.append(measure(mode, round_, args, postgres, kafka, workdir))
    finally:
        kafka.stop()
        postgres.stop()
    render(runs, args, console)
    return 0 if all(run.finished == args.jobs for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
