"""Requests from the topic into job rows: the request agent's intake rate.

    python -m benchmarks.requests_topic --requests 5000 --batch-max 1 500

For each ``--batch-max`` (``WFJOBS_REQUEST_BATCH_MAX``; 1 submits one request
per statement and commit, as the agent did before it batched), a real
``faust -A streams.app worker`` process with no claim loops (so nothing but the
agent touches the jobs) takes a backlog of plain-Protobuf requests from its own
requests topic. A warm-up request first proves the agent has its partitions;
then the clock runs from the first of the requests produced (as fast as the
producer goes) until every request's row exists. Printed per setting:
requests/s, and per request the worker's CPU, Postgres commits, statements
(``pg_stat_statements``, when loaded; the embedded server loads it) and WAL.

Postgres (``DATABASE_URL``, else embedded) and Apache Kafka
(``KAFKA_BOOTSTRAP_SERVERS``, else the project's own) as in
``benchmarks.end_to_end``. Nothing is asserted: this only measures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import psycopg
from confluent_kafka import Producer
from rich.console import Console
from rich.table import Table

from benchmarks.end_to_end import (
    PG_STAT_SETTINGS,
    bench_topics,
    db_counters,
    enable_statement_counts,
    process_cpu_s,
)
from cli.http import ApiClient
from devstack.apache_kafka import ApacheKafkaService
from devstack.postgres import PostgresService
from devstack.processes import free_port
from devstack.stack import WorkerProcess, ensure_topics, worker_environment
from schemas.contract import WorkflowRunRequest
from store.migrate import migrate
from store.tokens import create_token
from streams.auth import SCOPES
from workflows.samples import HANDLER_MODULE, automatic_workflow

WORKFLOW_NAME = "bench-intake"


@dataclass
class Result:
    batch_max: int
    requests: int
    elapsed_s: float
    requests_per_s: float
    worker_cpu_ms_per_request: float
    commits_per_request: float
    statements_per_request: float | None
    wal_bytes_per_request: float


def wal_lsn(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    return int(row[0]) if row else 0


def job_count(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM workflow_run").fetchone()
    return int(row[0]) if row else 0


def wait_for_jobs(dsn: str, count: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if job_count(dsn) >= count:
            return True
        time.sleep(0.02)
    return False


def produce(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for index in range(count):
        request = WorkflowRunRequest(job_id=str(uuid.uuid4()), workflow_name=WORKFLOW_NAME)
        request.input.update({"text": f"intake request {index}"})
        producer.produce(topic, request.SerializeToString(), key=request.job_id.encode())
        if index % 10_000 == 0:
            producer.poll(0)
    producer.flush(60)


def run_one(
    args: argparse.Namespace, batch_max: int, postgres: PostgresService, kafka: ApacheKafkaService
) -> Result:
    workdir = Path(tempfile.mkdtemp(prefix="wfjobs-bench-intake-"))
    dsn = postgres.create_database(f"intake_{batch_max}")
    asyncio.run(migrate(dsn))
    enable_statement_counts(dsn)
    suffix = uuid.uuid4().hex[:8]
    topics = bench_topics("bench-intake", suffix)
    ensure_topics(kafka.bootstrap_servers, topics.values(), partitions=args.partitions)
    env = worker_environment(
        database_url=dsn,
        bootstrap_servers=kafka.bootstrap_servers,
        worker_id=f"bench-intake-{batch_max}",
        web_port=free_port(),
        data_dir=workdir / "data",
        handlers=(HANDLER_MODULE,),
        roles="api,worker",
        extra={
            **topics,
            "WFJOBS_GROUP": f"bench-intake-{suffix}",
            "WFJOBS_CLAIM_LOOPS": "0",
            "WFJOBS_REQUEST_BATCH_MAX": str(batch_max),
        },
    )
    worker = WorkerProcess(env, workdir=workdir, name=f"intake-{batch_max}", loglevel="warn")
    worker.start()
    try:
        token = asyncio.run(create_token(dsn, "bench", SCOPES)).token
        ApiClient(worker.url, token=token).call(
            "PUT", f"/v1/workflows/{WORKFLOW_NAME}", {"workflow": automatic_workflow(WORKFLOW_NAME)}
        )
        # The agent has its partitions once a first request becomes a row.
        produce(kafka.bootstrap_servers, topics["WFJOBS_REQUESTS_TOPIC"], 1)
        if not wait_for_jobs(dsn, 1, args.timeout):
            raise SystemExit(f"the agent took no request: see {worker.log_path}")
        before_db, before_cpu, before_wal = (
            db_counters(dsn),
            process_cpu_s(worker.pid),
            wal_lsn(dsn),
        )
        started = time.monotonic()
        produce(kafka.bootstrap_servers, topics["WFJOBS_REQUESTS_TOPIC"], args.requests)
        if not wait_for_jobs(dsn, args.requests + 1, args.timeout):
            print(f"timed out: {job_count(dsn) - 1}/{args.requests} rows", file=sys.stderr)
        elapsed = time.monotonic() - started
        after_cpu, after_db, after_wal = process_cpu_s(worker.pid), db_counters(dsn), wal_lsn(dsn)
    finally:
        worker.stop()
    done = max(job_count(dsn) - 1, 1)
    statements = (
        (after_db.statements - before_db.statements) / done
        if after_db.statements is not None and before_db.statements is not None
        else None
    )
    return Result(
        batch_max=batch_max,
        requests=done,
        elapsed_s=elapsed,
        requests_per_s=done / elapsed,
        worker_cpu_ms_per_request=(after_cpu - before_cpu) * 1000 / done,
        commits_per_request=(after_db.commits - before_db.commits) / done,
        statements_per_request=statements,
        wal_bytes_per_request=(after_wal - before_wal) / done,
    )


def render(results: Sequence[Result], console: Console) -> None:
    table = Table(title="requests topic -> job rows (the request agent alone)")
    for column in (
        "batch max",
        "requests",
        "elapsed",
        "requests/s",
        "worker CPU ms/req",
        "commits/req",
        "statements/req",
        "WAL B/req",
    ):
        table.add_column(column, justify="right")
    for result in results:
        table.add_row(
            str(result.batch_max),
            str(result.requests),
            f"{result.elapsed_s:.2f} s",
            f"{result.requests_per_s:.0f}",
            f"{result.worker_cpu_ms_per_request:.3f}",
            f"{result.commits_per_request:.3f}",
            "n/a"
            if result.statements_per_request is None
            else f"{result.statements_per_request:.3f}",
            f"{result.wal_bytes_per_request:.0f}",
        )
    console.print(table)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.requests_topic", description=__doc__
    )
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--batch-max", type=int, nargs="+", default=[1, 500])
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for rows")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    # Wide enough for every column when the output is not a terminal.
    console = Console(width=max(Console().width, 120))
    external_db = bool(os.environ.get("DATABASE_URL"))
    postgres = PostgresService(settings=None if external_db else PG_STAT_SETTINGS)
    kafka = ApacheKafkaService()
    try:
        postgres.start()
        kafka.start()
        results = [run_one(args, batch_max, postgres, kafka) for batch_max in args.batch_max]
    finally:
        kafka.stop()
        postgres.stop()
    if args.json:
        print(json.dumps([asdict(result) for result in results], indent=2))
    else:
        render(results, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
