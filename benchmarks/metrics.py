"""Metrics on against metrics off: drain jobs/s and worker CPU per job, same Postgres, same run.

    python -m benchmarks.metrics [--jobs 3000] [--rounds 4] [--concurrency 16]
                                 [--scrape-s 1.0] [--db-cache-s 1.0]

Each round drains a fresh database twice, once with ``WFJOBS_METRICS=on`` and
once with ``off``, the order alternating from round to round so neither mode
always runs first. A drain is ``benchmarks.scaleout``'s: ``--jobs`` jobs of the
3-step sample workflow queued through ``RunStore.submit``, the database
vacuumed and analyzed, then one worker process (the worker's own ``Runtime``,
worker role, no relay, ``--concurrency`` claim loops) started and timed until
every job is COMPLETED. With metrics on, the worker process also renders its
``/metrics`` exposition every ``--scrape-s`` seconds (what the web view calls:
the fleet figures read from the database once per ``--db-cache-s``, the text
format rendered), far more often than a Prometheus server would, so the cost
measured is an upper bound. CPU per job is the worker process's. It asserts
nothing.

Before the drains it times the hot path on its own, in this process: one
``labels(...).observe(...)`` of the step histogram, and one rendering of the
page those observations leave (``--hot-path-only`` stops there).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from rich.console import Console
from rich.table import Table

from benchmarks.peers import (
    DURABLE_SETTINGS,
    WorkflowJobs,
    machine_summary,
    quiesce,
    server_version,
)
from benchmarks.scaleout import CPU_PREFIX, ScaleResult, drain, fill, target_for
from devstack.postgres import PostgresService
from streams.metrics import Metrics

MODES = ("on", "off")


@dataclass
class Drain:
    round: int
    mode: str
    result: ScaleResult


# --------------------------------------------------------------------------- a worker process


async def worker_main(dsn: str, concurrency: int, index: int, scrape_s: float) -> None:
    """``benchmarks.scaleout.worker_main``, scraping its own metrics while it drains."""
    target = target_for(dsn, dsn, concurrency, None)
    system = WorkflowJobs(target, kafka=False, worker_id=f"bench-metrics-{index + 1}")
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.readline)
    cpu_started = time.process_time()
    api, _, worker = await system.submitter("bench-metrics-events")
    await api.stop()
    await worker.start()
    scraper: asyncio.Task[None] | None = None
    try:
        await worker.wait_ready()
        if worker.metrics is not None:

            async def scrape_forever() -> None:
                while True:
                    await asyncio.sleep(scrape_s)
                    await worker.metrics_exposition()

            scraper = asyncio.create_task(scrape_forever())
        await loop.run_in_executor(None, sys.stdin.read)  # until the parent closes it
    finally:
        if scraper is not None:
            scraper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await scraper
        await worker.stop()
    print(CPU_PREFIX + f'{{"index": {index}, "cpu_s": {time.process_time() - cpu_started}}}')


# --------------------------------------------------------------------------- the hot path


@dataclass
class HotPath:
    observe_us: float
    render_ms: float


def hot_path(observations: int = 100_000, renders: int = 200) -> HotPath:
    """Microseconds per observation, and milliseconds per rendering of the result."""
    metrics = Metrics()
    steps = metrics.claims.step_duration
    names = ("tokenize", "embed", "review")
    started = time.perf_counter()
    for index in range(observations):
        steps.labels("bench", names[index % 3], "ok").observe(0.003)
    observe_us = (time.perf_counter() - started) / observations * 1e6

    async def render() -> float:
        began = time.perf_counter()
        for _ in range(renders):
            await metrics.exposition()
        return (time.perf_counter() - began) / renders * 1e3

    return HotPath(observe_us=observe_us, render_ms=asyncio.run(render()))


# --------------------------------------------------------------------------- the parent


def run_all(args: argparse.Namespace, console: Console) -> tuple[list[Drain], str]:
    external_db = bool(os.environ.get("DATABASE_URL"))
    postgres = PostgresService(settings=None if external_db else dict(DURABLE_SETTINGS))
    drains: list[Drain] = []
    try:
        with console.status("starting Postgres..."):
            postgres.start()
        where = "DATABASE_URL (its own settings)" if external_db else "embedded, durable"
        facts = f"PostgreSQL {server_version(postgres.dsn)}, {where}"
        for round_ in range(1, args.rounds + 1):
            order = MODES if round_ % 2 else tuple(reversed(MODES))
            for mode in order:
                dsn = postgres.create_database(f"metrics_{round_}_{mode}")
                target = target_for(
                    dsn, postgres.dsn, args.concurrency, None if external_db else postgres.pid
                )
                env = {
                    **os.environ,
                    "WFJOBS_METRICS": mode,
                    "WFJOBS_METRICS_DB_CACHE_S": str(args.db_cache_s),
                }
                try:
                    asyncio.run(fill(target, args.jobs))
                    quiesce(target, vacuum=True)
                    result = drain(
                        target,
                        1,
                        args.jobs,
                        args.timeout,
                        command=("benchmarks.metrics", "--scrape-s", str(args.scrape_s)),
                        env=env,
                    )
                finally:
                    with contextlib.suppress(psycopg.Error):
                        postgres.drop_database(dsn)
                drains.append(Drain(round_, mode, result))
                console.print(f"  round {round_}, metrics {mode}: {result.jobs_per_s:.0f} jobs/s")
    finally:
        postgres.stop()
    return drains, facts


def render_hot_path(hot: HotPath, console: Console) -> None:
    console.print(
        f"hot path: one labels(...).observe(...) {hot.observe_us:.2f} us; "
        f"one rendering of /metrics {hot.render_ms:.3f} ms"
    )


def render(drains: list[Drain], facts: str, args: argparse.Namespace, console: Console) -> None:
    console.print(
        f"[bold]metrics on vs off[/]: {args.jobs} queued jobs per drain, 1 worker process x "
        f"{args.concurrency} claim loops, {args.rounds} round(s); with metrics on the worker "
        f"renders /metrics every {args.scrape_s}s (database figures cached {args.db_cache_s}s); "
        f"{dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}"
    )
    console.print(f"machine: {machine_summary()}; postgres: {facts}")
    table = Table()
    for title in ("round", "metrics", "drain s", "jobs/s", "worker CPU ms/job"):
        table.add_column(title, justify="right")
    for d in drains:
        r = d.result
        table.add_row(
            str(d.round),
            d.mode,
            f"{r.drain_s:.2f}",
            f"{r.jobs_per_s:.0f}",
            f"{r.worker_cpu_s * 1000 / r.jobs:.3f}",
        )
    console.print(table)

    def median(mode: str, value: str) -> float:
        picked = [d.result for d in drains if d.mode == mode]
        if value == "rate":
            return statistics.median(r.jobs_per_s for r in picked)
        return statistics.median(r.worker_cpu_s * 1000 / r.jobs for r in picked)

    summary = Table()
    for title in ("median", "metrics on", "metrics off", "on / off"):
        summary.add_column(title, justify="right")
    for label, value in (("jobs/s", "rate"), ("worker CPU ms/job", "cpu")):
        on, off = median("on", value), median("off", value)
        summary.add_row(label, f"{on:.3f}", f"{off:.3f}", f"{on / off:.3f}")
    console.print(summary)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.metrics",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--jobs", type=int, default=3000, help="queued jobs per drain")
    parser.add_argument("--rounds", type=int, default=4, help="drains per mode")
    parser.add_argument("--concurrency", type=int, default=16, help="claim loops")
    parser.add_argument(
        "--scrape-s", type=float, default=1.0, help="seconds between renders of /metrics"
    )
    parser.add_argument(
        "--db-cache-s", type=float, default=1.0, help="WFJOBS_METRICS_DB_CACHE_S of the worker"
    )
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument(
        "--hot-path-only", action="store_true", help="time the observations only, no drains"
    )
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--dsn", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if (
        min(args.jobs, args.rounds, args.concurrency) < 1
        or min(args.scrape_s, args.db_cache_s) <= 0
    ):
        parser.error(
            "--jobs, --rounds, --concurrency, --scrape-s and --db-cache-s must be positive"
        )
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        asyncio.run(worker_main(args.dsn, args.concurrency, args.child, args.scrape_s))
        return 0
    console = Console(width=None if sys.stdout.isatty() else 200)
    render_hot_path(hot_path(), console)
    if args.hot_path_only:
        return 0
    drains, facts = run_all(args, console)
    render(drains, facts, args, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
