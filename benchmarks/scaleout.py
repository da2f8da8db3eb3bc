"""Scale-out: drain jobs/s with 1, 2 and 4 worker processes, and against worker concurrency.

    python -m benchmarks.scaleout [--jobs 4000] [--workers 1 2 4] [--concurrency 16]
                                  [--curve 1 2 4 8 16 32]

Each configuration gets a fresh database on one durable Postgres (embedded
unless ``DATABASE_URL`` is set): ``--jobs`` jobs of the 3-step sample workflow
of ``benchmarks.peers`` are queued through ``RunStore.submit``, the database is
vacuumed and analyzed, then P worker processes are started at once, each a
clean interpreter running the worker's own ``streams.runtime.Runtime`` (worker
role, no relay) with C claim loops, configured through the documented
``WFJOBS_*`` variables (the benchmark's environment may add to them, e.g.
``WFJOBS_GROUP_COMMIT=false``). The drain runs from the moment every process
is told to start until every job is COMPLETED, so it includes the workers'
start-up (connecting, registering), as the peers benchmark's drain does.

Configurations: ``--workers`` process counts at ``--concurrency`` claim loops
each (the scale-out figure), then one process at each ``--curve`` concurrency
(jobs/s against concurrency). CPU per job: all worker processes, and the
Postgres server. It asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import psycopg
from rich.console import Console
from rich.table import Table

from benchmarks.peers import (
    DURABLE_SETTINGS,
    Target,
    WorkflowJobs,
    fan_out,
    machine_summary,
    quiesce,
    server_cpu_s,
    server_version,
)
from devstack.postgres import PostgresService

CPU_PREFIX = "SCALEOUT-CPU "
POLL_S = 0.02
DRAIN_TIMEOUT_S = 900.0
COUNT_COMPLETED = "SELECT count(*) FROM workflow_run WHERE status = 'COMPLETED'"


@dataclass
class ScaleResult:
    processes: int
    concurrency: int
    jobs: int
    drain_s: float
    worker_cpu_s: float
    postgres_cpu_s: float | None

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / max(self.drain_s, 1e-9)


def target_for(dsn: str, admin_dsn: str, concurrency: int, postmaster: int | None) -> Target:
    return Target(
        dsn=dsn,
        admin_dsn=admin_dsn,
        database=str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]),
        concurrency=concurrency,
        postmaster_pid=postmaster,
        kafka_bootstrap="",
        kafka_pid=None,
        topic_prefix="bench-scaleout",
    )


# --------------------------------------------------------------------------- a worker process


async def worker_main(dsn: str, concurrency: int, index: int) -> None:
    """Wait for the word on stdin, run a worker until stdin closes, print its CPU time."""
    target = target_for(dsn, dsn, concurrency, None)
    # Each process its own id: a lease names the worker that holds it.
    system = WorkflowJobs(target, kafka=False, worker_id=f"bench-scaleout-{index + 1}")
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.readline)
    cpu_started = time.process_time()
    api, _, worker = await system.submitter("bench-scaleout-events")
    await api.stop()  # only the worker runs here
    await worker.start()
    try:
        await worker.wait_ready()
        await loop.run_in_executor(None, sys.stdin.read)  # until the parent closes it
    finally:
        await worker.stop()
    print(CPU_PREFIX + json.dumps({"index": index, "cpu_s": time.process_time() - cpu_started}))


# --------------------------------------------------------------------------- the parent


async def fill(target: Target, jobs: int) -> None:
    system = WorkflowJobs(target, kafka=False)
    await system.setup()
    api, submit_one, _ = await system.submitter("bench-scaleout-events")

    async def submit(index: int) -> None:
        await submit_one(index)

    try:
        await fan_out(jobs, target.concurrency, submit)
    finally:
        await api.stop()


def drain(
    target: Target,
    processes: int,
    jobs: int,
    timeout_s: float,
    *,
    command: Sequence[str] = ("benchmarks.scaleout",),
    env: Mapping[str, str] | None = None,
) -> ScaleResult:
    """``command``: the module (and extra arguments) each worker process runs, taking
    ``--child``, ``--dsn`` and ``--concurrency`` and printing its CPU line as
    ``worker_main`` does; ``env``: the children's environment (default: ours)."""
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                *command,
                "--child",
                str(index),
                "--dsn",
                target.dsn,
                "--concurrency",
                str(target.concurrency),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=None if env is None else dict(env),
        )
        for index in range(processes)
    ]
    try:
        with psycopg.connect(target.dsn, autocommit=True) as conn:
            cpu_before = server_cpu_s(target.postmaster_pid)
            started = time.monotonic()
            for child in children:
                assert child.stdin is not None
                child.stdin.write("go\n")
                child.stdin.flush()
            while True:
                row = conn.execute(COUNT_COMPLETED).fetchone()
                if row is not None and int(row[0]) >= jobs:
                    break
                if time.monotonic() - started > timeout_s:
                    raise TimeoutError(f"{row[0] if row else '?'} of {jobs} jobs COMPLETED")
                for child in children:
                    if child.poll() is not None:
                        raise RuntimeError(f"worker process exited with {child.returncode}")
                time.sleep(POLL_S)
            drain_s = time.monotonic() - started
            cpu_after = server_cpu_s(target.postmaster_pid)
        worker_cpu = 0.0
        for child in children:
            out, _ = child.communicate(timeout=60)  # closes stdin: the worker stops
            for line in out.splitlines():
                if line.startswith(CPU_PREFIX):
                    worker_cpu += float(json.loads(line[len(CPU_PREFIX) :])["cpu_s"])
            if child.returncode != 0:
                raise RuntimeError(f"worker process exited with {child.returncode}")
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()  # this child only, by its own handle
                child.wait()
    return ScaleResult(
        processes=processes,
        concurrency=target.concurrency,
        jobs=jobs,
        drain_s=drain_s,
        worker_cpu_s=worker_cpu,
        postgres_cpu_s=(
            None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
        ),
    )


def configurations(args: argparse.Namespace) -> list[tuple[int, int]]:
    found = [(processes, args.concurrency) for processes in args.workers]
    found += [(1, concurrency) for concurrency in args.curve]
    return list(dict.fromkeys(found))  # each once, in order


def run_all(args: argparse.Namespace, console: Console) -> tuple[list[ScaleResult], str]:
    external_db = bool(os.environ.get("DATABASE_URL"))
    postgres = PostgresService(
        settings=None if external_db else ({} if args.fast_postgres else dict(DURABLE_SETTINGS))
    )
    results: list[ScaleResult] = []
    try:
        with console.status("starting Postgres..."):
            postgres.start()
        durability = "fsync off" if args.fast_postgres else "durable (fsync on)"
        where = "DATABASE_URL (its own settings)" if external_db else f"embedded, {durability}"
        facts = f"PostgreSQL {server_version(postgres.dsn)}, {where}"
        for processes, concurrency in configurations(args):
            console.print(f"{processes} process(es) x {concurrency} claim loops...")
            dsn = postgres.create_database(f"scaleout_{processes}_{concurrency}")
            target = target_for(
                dsn, postgres.dsn, concurrency, None if external_db else postgres.pid
            )
            try:
                asyncio.run(fill(target, args.jobs))
                quiesce(target, vacuum=True)
                result = drain(target, processes, args.jobs, args.timeout)
                results.append(result)
                console.print(f"  {result.jobs_per_s:.0f} jobs/s")
            finally:
                with contextlib.suppress(psycopg.Error):
                    postgres.drop_database(dsn)
    finally:
        postgres.stop()
    return results, facts


def render(
    results: list[ScaleResult], facts: str, args: argparse.Namespace, console: Console
) -> None:
    console.print(
        f"[bold]scale-out[/]: {args.jobs} queued jobs drained per configuration, "
        f"{dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}"
    )
    console.print(f"machine: {machine_summary()}; postgres: {facts}")
    table = Table()
    for title in (
        "processes",
        "claim loops each",
        "slots in all",
        "drain s",
        "drain jobs/s",
        "x 1 process",
        "worker CPU ms/job",
        "Postgres CPU ms/job",
    ):
        table.add_column(title, justify="right")
    single = next(
        (r for r in results if r.processes == 1 and r.concurrency == args.concurrency), None
    )
    for r in results:
        table.add_row(
            str(r.processes),
            str(r.concurrency),
            str(r.processes * r.concurrency),
            f"{r.drain_s:.2f}",
            f"{r.jobs_per_s:.0f}",
            f"{r.jobs_per_s / single.jobs_per_s:.2f}" if single else "n/a",
            f"{r.worker_cpu_s * 1000 / r.jobs:.2f}",
            "n/a" if r.postgres_cpu_s is None else f"{r.postgres_cpu_s * 1000 / r.jobs:.2f}",
        )
    console.print(table)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.scaleout",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--jobs", type=int, default=4000, help="queued jobs per configuration")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument(
        "--concurrency", type=int, default=16, help="claim loops per process for --workers"
    )
    parser.add_argument(
        "--curve",
        type=int,
        nargs="*",
        default=[1, 2, 4, 8, 16, 32],
        help="claim loops of one process, one run each",
    )
    parser.add_argument(
        "--fast-postgres", action="store_true", help="embedded Postgres with fsync off"
    )
    parser.add_argument("--timeout", type=float, default=DRAIN_TIMEOUT_S)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--dsn", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.jobs < 1 or min(args.workers + args.curve + [args.concurrency]) < 1:
        parser.error("--jobs, --workers, --concurrency and --curve must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        asyncio.run(worker_main(args.dsn, args.concurrency, args.child))
        return 0
    console = Console(stderr=args.json, width=None if sys.stdout.isatty() else 200)
    results, facts = run_all(args, console)
    if args.json:
        payload: dict[str, Any] = {
            "postgres": facts,
            "machine": machine_summary(),
            "jobs": args.jobs,
            "results": [{**asdict(r), "jobs_per_s": r.jobs_per_s} for r in results],
        }
        print(json.dumps(payload, indent=2))
    else:
        render(results, facts, args, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
