"""Relay throughput: how fast one relay drains a backlog of outbox rows to Kafka.

    python -m benchmarks.relay [--rows 100000] [--batch N] [--before DIR] [--repeat 1] [--json]

A backlog of ``--rows`` PENDING outbox rows (2 000 jobs, their rows interleaved
as jobs running side by side write them, each a real encoded
``WorkflowRunEvent``) is written straight into a fresh database, vacuumed and
analyzed; then one relay (``streams.relay.OutboxRelay`` over
``store.outbox.Outbox``, plain Protobuf, no registry) drains it to a real
Apache Kafka topic, idempotent producer with ``acks=all``. The clock runs from
the relay's start until the last row is acked and marked PUBLISHED.

``--before DIR`` runs the same measurement against another checkout of the
project too (e.g. the last commit, ``git archive HEAD | tar -x -C DIR``), each
implementation in a child process that imports only its own code, on the same
Postgres and the same broker, in interleaved rounds.

Printed per implementation (median run): rows, seconds, events/s, batches
(passes that published), statements per batch (top-level statements of the
run's database from ``pg_stat_statements``, ``BEGIN``/``COMMIT`` included,
divided by the batches), commits per batch, and CPU per event: the relay
process's (``time.process_time``, librdkafka's threads included) and that of
the Postgres backends serving it (``/proc/<pid>/stat`` of the run database's
connections). ``--batch`` defaults to ``WFJOBS_RELAY_BATCH``'s default.

Postgres is an embedded server of this run, with the test suite's settings
(fsync off) unless ``DATABASE_URL`` names one that loads pg_stat_statements;
Kafka is ``KAFKA_BOOTSTRAP_SERVERS`` or an Apache Kafka started here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
JOBS = 2000
DRAIN_TIMEOUT_S = 900
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
STATEMENT_SETTINGS = {
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track": "top",
}

BACKLOG_SQL = """
INSERT INTO workflow_run_events_outbox (job_id, event_type, payload)
SELECT job.id, 'STEP_CHECKPOINT', %(payload)s
  FROM generate_series(1, %(per_job)s) AS step,
       LATERAL (SELECT ('30000000-0000-0000-0000-' || lpad(to_hex(j), 12, '0'))::uuid AS id
                  FROM generate_series(1, %(jobs)s) AS j) AS job
 ORDER BY step, job.id
"""


# --------------------------------------------------------------------------- child


async def _child(dsn: str, bootstrap: str, topic: str, rows: int, batch: int) -> dict[str, Any]:
    # Imported here: the child imports the implementation under test only.
    import psycopg
    from google.protobuf import struct_pb2

    from schemas.contract import WorkflowRunEvent
    from schemas.serde import event_serializer
    from store.migrate import migrate
    from store.outbox import Outbox
    from store.pool import open_pool
    from streams.relay import OutboxRelay, producer_config

    await migrate(dsn)
    response = struct_pb2.Struct()
    response.update({"tokens": ["the", "quick", "brown", "fox"], "count": 4})
    event = WorkflowRunEvent(
        job_id=str(uuid.uuid4()),
        type=WorkflowRunEvent.Type.TYPE_STEP_CHECKPOINT,
        workflow_name="embed-and-review",
        attempt=1,
        step_name="tokenize",
        response=response,
    )
    payload = event.SerializeToString()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            BACKLOG_SQL.encode(), {"payload": payload, "jobs": JOBS, "per_job": rows // JOBS}
        )
        conn.execute("VACUUM ANALYZE workflow_run_events_outbox")
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute(
            "SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database"
            " WHERE datname = current_database()), 0)"
        )
        commits_before = _commits(conn)

    pool = await open_pool(dsn, min_size=4, max_size=4)
    # As a relaying worker has it: a connection of the relay's own, holding
    # its settings for the session, where the implementation has one.
    try:
        from store.outbox import RELAY_SESSION
    except ImportError:
        relay_pool = None
        outbox = Outbox(pool)
    else:
        relay_pool = await open_pool(dsn, min_size=1, max_size=1, session=RELAY_SESSION)
        outbox = Outbox(pool, relay_pool=relay_pool)
    backends_before = await _backend_cpu(pool)
    relay = OutboxRelay(
        outbox,
        producer_config=producer_config(bootstrap),
        topic=topic,
        serializer=event_serializer(registry=None, topic=topic),
        batch=batch,
    )
    total = (rows // JOBS) * JOBS
    started = time.perf_counter()
    cpu_started = time.process_time()
    await relay.start()
    try:
        # Waiting in memory, so the measurement sends no statement of its own.
        for _ in range(DRAIN_TIMEOUT_S * 100):
            if relay.stats.published >= total:
                break
            await asyncio.sleep(0.01)
        else:
            raise TimeoutError(f"{relay.stats.published} of {total} rows published")
        seconds = time.perf_counter() - started
        cpu_s = time.process_time() - cpu_started
        backends_after = await _backend_cpu(pool)
    finally:
        await relay.stop()
        if relay_pool is not None:
            await relay_pool.close()
        await pool.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements"
            " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
        ).fetchone()
        statements = int(row[0]) if row else 0
        commits = _commits(conn) - commits_before
    batches = -(-total // batch)
    return {
        "rows": total,
        "seconds": seconds,
        "events_per_s": total / seconds,
        "batches": batches,
        "statements_per_batch": statements / batches,
        "commits_per_batch": commits / batches,
        "python_cpu_ms_per_batch": cpu_s * 1000 / batches,
        "relay_cpu_ms_per_event": cpu_s * 1000 / total,
        "postgres_cpu_ms_per_event": sum(
            ticks - backends_before.get(pid, 0) for pid, ticks in backends_after.items()
        )
        * 1000
        / CLOCK_TICKS
        / total,
    }


async def _backend_cpu(pool: Any) -> dict[int, int]:
    """CPU ticks (user + system) so far of each backend connected to the run's database."""
    async with pool.connection() as conn:
        cursor = await conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        )
        pids = [int(row[0]) for row in await cursor.fetchall()]
    return _cpu_ticks(pids)


def _cpu_ticks(pids: list[int]) -> dict[int, int]:
    ticks: dict[int, int] = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # a server on another host, or a backend gone meanwhile
        ticks[pid] = int(fields[11]) + int(fields[12])
    return ticks


def _commits(conn: Any) -> int:
    row = conn.execute(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    return int(row[0]) if row else 0


# --------------------------------------------------------------------------- parent


def _run_child(
    root: Path, dsn: str, bootstrap: str, topic: str, rows: int, batch: int
) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    completed = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            json.dumps({"dsn": dsn, "bootstrap": bootstrap, "topic": topic}),
            "--rows",
            str(rows),
            "--batch",
            str(batch),
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"run against {root} failed:\n{completed.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    from streams.settings import Settings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument(
        "--batch", type=int, default=Settings.__dataclass_fields__["relay_batch"].default
    )
    parser.add_argument("--before", type=Path, help="another checkout to measure beside this one")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        where = json.loads(args.child)
        result = asyncio.run(
            _child(where["dsn"], where["bootstrap"], where["topic"], args.rows, args.batch)
        )
        print(json.dumps(result))
        return 0

    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic
    from rich.console import Console
    from rich.table import Table

    from devstack.apache_kafka import ApacheKafkaService
    from devstack.postgres import PostgresService

    implementations = {"after": ROOT}
    if args.before is not None:
        implementations = {"before": args.before.resolve(), **implementations}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in implementations}
    database_url = os.environ.get("DATABASE_URL", "")
    with (
        PostgresService(database_url, settings=STATEMENT_SETTINGS) as postgres,
        ApacheKafkaService() as kafka,
    ):
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
        for _ in range(args.repeat):
            for name, root in implementations.items():
                topic = f"bench-relay-{uuid.uuid4().hex[:8]}"
                admin.create_topics([NewTopic(topic, 8, 1)])[topic].result(30)
                dsn = postgres.create_database("bench")
                try:
                    runs[name].append(
                        _run_child(root, dsn, kafka.bootstrap_servers, topic, args.rows, args.batch)
                    )
                finally:
                    postgres.drop_database(dsn)
                    admin.delete_topics([topic])

    medians = {
        name: min(
            results,
            key=lambda r: abs(r["seconds"] - statistics.median(x["seconds"] for x in results)),
        )
        for name, results in runs.items()
    }
    if args.json:
        print(json.dumps({"runs": runs, "median": medians}, indent=2))
        return 0
    table = Table(title=f"one relay draining {args.rows} outbox rows, batch {args.batch}")
    for column in (
        "implementation",
        "rows",
        "seconds",
        "events/s",
        "batches",
        "statements/batch",
        "commits/batch",
        "relay CPU ms/batch",
        "relay CPU ms/event",
        "Postgres CPU ms/event",
    ):
        table.add_column(column, justify="left" if column == "implementation" else "right")
    for name, result in medians.items():
        table.add_row(
            name,
            str(result["rows"]),
            f"{result['seconds']:.2f}",
            f"{result['events_per_s']:.0f}",
            str(result["batches"]),
            f"{result['statements_per_batch']:.2f}",
            f"{result['commits_per_batch']:.2f}",
            f"{result['python_cpu_ms_per_batch']:.1f}",
            f"{result.get('relay_cpu_ms_per_event', float('nan')):.3f}",
            f"{result.get('postgres_cpu_ms_per_event', float('nan')):.3f}",
        )
    Console(width=160).print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
