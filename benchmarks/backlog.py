"""Per-job cost against the length of the queue: does a job cost more when many wait?

    python -m benchmarks.backlog [--backlogs 1000 10000 100000] [--window 2000] [--concurrency 16]

For each backlog size B, in a fresh database on one durable Postgres (embedded
unless ``DATABASE_URL`` is set), the 3-step sample workflow of
``benchmarks.peers`` is submitted B + warm-up + window times through
``RunStore.submit``; the database is vacuumed and analyzed and the server
checkpointed; then the worker's own ``streams.runtime.Runtime`` (worker role,
no relay, configured through the documented ``WFJOBS_*`` variables, which the
benchmark's environment may add to) starts and drains. The measured window is
the ``--window`` jobs completed after the first ``--warmup`` ones, read while
the worker keeps running, so at least B jobs are still queued when it ends.
The answer is flat columns: a claim or a plan that reads more as the queue
grows shows here as CPU, statements or WAL per job rising with B.

Counters, all deltas over the window, divided by the jobs completed in it:
CPU of this process (all threads) and of the Postgres server (postmaster and
every backend), write transactions (transaction ids handed out, exact and
immediate), top-level statements (``pg_stat_statements``), WAL bytes and the full-page
images among them (``pg_stat_wal``).
Commit counts are left out here: ``pg_stat_database`` is only exact with
every connection closed, and the worker is running. It asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import psycopg
from rich.console import Console
from rich.table import Table

from benchmarks.peers import (
    DURABLE_SETTINGS,
    STATEMENT_SETTINGS,
    Counters,
    Target,
    WorkflowJobs,
    enable_statements,
    fan_out,
    machine_summary,
    quiesce,
    read_counters,
    server_version,
    until,
    wal_bytes,
)
from devstack.postgres import PostgresService


@dataclass
class BacklogResult:
    backlog: int
    fill_s: float
    window_jobs: int
    window_s: float
    cpu_s: float
    postgres_cpu_s: float | None
    write_xacts: int
    statements: int | None
    wal_bytes: int
    # Full-page images: the first change of a page after a checkpoint logs the
    # whole page. The window starts right after one, so an index whose pages
    # are touched at random (keyed by job_id) logs one image per page it has,
    # and has more pages the longer the queue: WAL per job that a longer window
    # (or a server's own checkpoint interval) spreads thin.
    page_images: int | None
    queued_after: int

    @property
    def jobs_per_s(self) -> float:
        return self.window_jobs / max(self.window_s, 1e-9)

    def per_job_ms(self, seconds: float | None) -> float | None:
        return None if seconds is None else seconds * 1000 / self.window_jobs

    @property
    def all_cpu_ms(self) -> float | None:
        pg = self.per_job_ms(self.postgres_cpu_s)
        return None if pg is None else pg + self.cpu_s * 1000 / self.window_jobs


async def measure(
    target: Target, backlog: int, args: argparse.Namespace, console: Console
) -> BacklogResult:
    system = WorkflowJobs(target, kafka=False)
    await system.setup()
    topic = f"{target.topic_prefix}-events"
    total = backlog + args.warmup + args.window
    api, submit_one, _ = await system.submitter(topic)

    async def submit(index: int) -> None:
        await submit_one(index)

    try:
        with console.status(f"queueing {total} jobs..."):
            started = time.monotonic()
            await fan_out(total, args.concurrency, submit)
            fill_s = time.monotonic() - started
    finally:
        await api.stop()
    # Every measured size starts from the same state: statistics that know the
    # backlog, no dead rows from the fill, no checkpoint pending.
    quiesce(target, vacuum=True)
    api, _, worker = await system.submitter(topic)
    try:
        await worker.start()
        await worker.wait_ready()
        claims = worker.claims
        assert claims is not None
        await until(lambda: claims.stats.completed >= args.warmup, "the warm-up jobs")
        images_before = page_images(target)
        done_before, before = claims.stats.completed, read_counters(target)
        started, cpu_started = time.monotonic(), time.process_time()
        await until(
            lambda: claims.stats.completed >= args.warmup + args.window, "the measured window"
        )
        done_after, after = claims.stats.completed, read_counters(target)
        images_after = page_images(target)
        window_s, cpu_s = time.monotonic() - started, time.process_time() - cpu_started
    finally:
        await worker.stop()
        await api.stop()
    queued_after = await count_queued(target.dsn)
    return result_of(
        backlog,
        fill_s,
        done_after - done_before,
        window_s,
        cpu_s,
        before,
        after,
        target,
        queued_after,
        None if images_before is None or images_after is None else images_after - images_before,
    )


def result_of(
    backlog: int,
    fill_s: float,
    jobs: int,
    window_s: float,
    cpu_s: float,
    before: Counters,
    after: Counters,
    target: Target,
    queued_after: int,
    images: int | None,
) -> BacklogResult:
    postgres_cpu = (
        None
        if before.postgres_cpu_s is None or after.postgres_cpu_s is None
        else after.postgres_cpu_s - before.postgres_cpu_s
    )
    statements = (
        None
        if before.statements is None or after.statements is None
        else after.statements - before.statements
    )
    return BacklogResult(
        backlog=backlog,
        fill_s=fill_s,
        window_jobs=jobs,
        window_s=window_s,
        cpu_s=cpu_s,
        postgres_cpu_s=postgres_cpu,
        write_xacts=after.next_xid - before.next_xid,
        statements=statements,
        wal_bytes=wal_bytes(target, before.wal_lsn, after.wal_lsn),
        page_images=images,
        queued_after=queued_after,
    )


def page_images(target: Target) -> int | None:
    """Full-page images written so far by the whole server; None before PostgreSQL 14."""
    with psycopg.connect(target.admin_dsn, autocommit=True) as conn:
        try:
            row = conn.execute("SELECT wal_fpi FROM pg_stat_wal").fetchone()
        except psycopg.Error:
            return None
    return int(row[0]) if row else None


async def count_queued(dsn: str) -> int:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        row = await (
            await conn.execute("SELECT count(*) FROM workflow_run WHERE status = 'QUEUED'")
        ).fetchone()
    return int(row[0]) if row else -1


def run_all(args: argparse.Namespace, console: Console) -> tuple[list[BacklogResult], str]:
    external_db = bool(os.environ.get("DATABASE_URL"))
    server_settings = {} if args.fast_postgres else dict(DURABLE_SETTINGS)
    server_settings.update(STATEMENT_SETTINGS)
    postgres = PostgresService(settings=None if external_db else server_settings)
    results: list[BacklogResult] = []
    try:
        with console.status("starting Postgres..."):
            postgres.start()
        enable_statements(postgres.dsn, create=not external_db)
        durability = "fsync off" if args.fast_postgres else "durable (fsync on)"
        where = "DATABASE_URL (its own settings)" if external_db else f"embedded, {durability}"
        facts = f"PostgreSQL {server_version(postgres.dsn)}, {where}"
        for backlog in args.backlogs:
            console.print(f"backlog [bold]{backlog}[/]...")
            dsn = postgres.create_database(f"backlog_{backlog}")
            target = Target(
                dsn=dsn,
                admin_dsn=postgres.dsn,
                database=str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]),
                concurrency=args.concurrency,
                postmaster_pid=None if external_db else postgres.pid,
                kafka_bootstrap="",
                kafka_pid=None,
                topic_prefix="bench-backlog",
            )
            try:
                result = asyncio.run(measure(target, backlog, args, console))
                results.append(result)
                console.print(f"  {result.jobs_per_s:.0f} jobs/s")
            finally:
                with contextlib.suppress(psycopg.Error):
                    postgres.drop_database(dsn)
    finally:
        postgres.stop()
    return results, facts


def _fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def render(
    results: list[BacklogResult], facts: str, args: argparse.Namespace, console: Console
) -> None:
    console.print(
        f"[bold]backlog[/]: window of {args.window} jobs after {args.warmup} warm-up jobs, "
        f"concurrency {args.concurrency}, {dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}"
    )
    console.print(f"machine: {machine_summary()}; postgres: {facts}")
    table = Table(title="per job, while the backlog waits")
    for title in (
        "queued",
        "fill jobs/s",
        "window jobs",
        "drain jobs/s",
        "Python CPU ms",
        "Postgres CPU ms",
        "all CPU ms",
        "x smallest",
        "write xacts",
        "statements",
        "WAL KiB",
        "page images",
        "queued after",
    ):
        table.add_column(title, justify="right")
    base = results[0].all_cpu_ms if results else None
    for r in results:
        total = r.all_cpu_ms
        table.add_row(
            str(r.backlog),
            f"{(r.backlog + args.warmup + args.window) / max(r.fill_s, 1e-9):.0f}",
            str(r.window_jobs),
            f"{r.jobs_per_s:.0f}",
            _fmt(r.per_job_ms(r.cpu_s)),
            _fmt(r.per_job_ms(r.postgres_cpu_s)),
            _fmt(total),
            "n/a" if total is None or not base else f"{total / base:.2f}",
            f"{r.write_xacts / r.window_jobs:.2f}",
            "n/a" if r.statements is None else f"{r.statements / r.window_jobs:.2f}",
            f"{r.wal_bytes / 1024 / r.window_jobs:.1f}",
            "n/a" if r.page_images is None else f"{r.page_images / r.window_jobs:.2f}",
            str(r.queued_after),
        )
    console.print(table)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.backlog",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--backlogs",
        type=int,
        nargs="+",
        default=[1000, 10000, 100000],
        help="jobs still queued at the end of the window, one run each",
    )
    parser.add_argument("--window", type=int, default=2000, help="measured jobs per size")
    parser.add_argument("--warmup", type=int, default=200, help="jobs completed before the window")
    parser.add_argument(
        "--concurrency", type=int, default=16, help="submit callers and worker claim loops"
    )
    parser.add_argument(
        "--fast-postgres", action="store_true", help="embedded Postgres with fsync off"
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if min(args.backlogs) < 0 or args.window < 1 or args.warmup < 0 or args.concurrency < 1:
        parser.error("--backlogs, --warmup must not be negative; --window, --concurrency positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(stderr=args.json, width=None if sys.stdout.isatty() else 200)
    results, facts = run_all(args, console)
    if args.json:
        payload: dict[str, Any] = {
            "postgres": facts,
            "machine": machine_summary(),
            "window": args.window,
            "warmup": args.warmup,
            "concurrency": args.concurrency,
            "results": [
                {**asdict(r), "jobs_per_s": r.jobs_per_s, "all_cpu_ms_per_job": r.all_cpu_ms}
                for r in results
            ],
        }
        print(json.dumps(payload, indent=2))
    else:
        render(results, facts, args, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
