"""One job's store calls, each alone: the latency a job pays per commit point.

``python -m benchmarks.round_trips [--calls 300] [--fast-postgres] [--json]``

A paced job (nothing else running) waits for its submit, its claim, two
checkpoints and the completion that writes the last one, one after another.
This times each of those calls on its own, back to back on an idle durable
Postgres, through the same ``RunStore`` the worker uses, beside ``SELECT 1``
(what a round trip costs before any work). The claim is timed both ways a
store can send it: through a claim connection that holds the planner
settings for its session (what a worker does), and as a pipelined transaction
that sets them each time (a store without one); a checkpoint both through the
group commit (alone, so in its single-row form) and as its own statement with
group commit off. Wall milliseconds per call, median and p90 of ``--calls``
calls (half as many for each kind of checkpoint); nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from benchmarks.peers import DURABLE_SETTINGS
from store.records import Lease

ENTRY: dict[str, Any] = {"name": "tokenize", "skipped": False, "response": {"ids": [1, 2]}}
LAST: dict[str, Any] = {"name": "embed", "skipped": False, "response": {"dimensions": 8}}


async def _time(calls: int, call: Callable[[int], Awaitable[Any]]) -> dict[str, float]:
    seconds = []
    for index in range(calls):
        started = time.perf_counter()
        await call(index)
        seconds.append(time.perf_counter() - started)
    seconds.sort()
    return {
        "p50_ms": statistics.median(seconds) * 1000,
        "p90_ms": seconds[int(len(seconds) * 0.9)] * 1000,
    }


async def measure(dsn: str, calls: int) -> dict[str, dict[str, float]]:
    from store.migrate import migrate
    from store.pool import create_pool, open_pool
    from store.run_sql import CLAIM_SESSION
    from store.runs import RunStore
    from workflows.cache import DefinitionCache
    from workflows.samples import automatic_workflow

    await migrate(dsn)
    pool = await open_pool(dsn, min_size=2, max_size=2)
    claim_pool = create_pool(dsn, min_size=1, max_size=1, session=CLAIM_SESSION)
    await claim_pool.open(wait=True)
    # A worker's group commit and submits each have a connection of their own.
    commit_pool = await open_pool(dsn, min_size=1, max_size=1)
    submit_pool = await open_pool(dsn, min_size=1, max_size=1)
    try:
        compiled = DefinitionCache().get(workflow := automatic_workflow("bench-round-trips"))
        worker = RunStore(
            pool, claim_pool=claim_pool, commit_pool=commit_pool, submit_pool=submit_pool
        )
        plain = RunStore(pool)
        ungrouped = RunStore(pool, group_commit=False)

        async def submit(_: int) -> None:
            await worker.submit(
                job_id=uuid.uuid4(),
                workflow_name=compiled.name,
                definition=workflow,
                definition_hash=compiled.definition_hash,
                input=compiled.validate_input({"text": "a b c"}),
            )

        async def select_one(_: int) -> None:
            async with pool.connection() as conn:
                await conn.execute("SELECT 1")

        for index in range(2 * calls):
            await submit(index)
        leases: list[Lease] = []

        async def claim_with(store: RunStore) -> Callable[[int], Awaitable[None]]:
            async def claim(_: int) -> None:
                [claimed] = await store.claim_batch("bench-round-trips", 1)
                leases.append(claimed.lease)

            return claim

        results = {
            "SELECT 1": await _time(calls, select_one),
            "submit": await _time(calls, submit),
            "claim, claim connection": await _time(calls, await claim_with(worker)),
            "claim, pipelined transaction": await _time(calls, await claim_with(plain)),
        }
        half = calls // 2
        results["checkpoint"] = await _time(
            half, lambda index: worker.checkpoint(leases[index], ENTRY)
        )
        results["checkpoint, group commit off"] = await _time(
            half, lambda index: ungrouped.checkpoint(leases[half + index], ENTRY)
        )
        results["complete with the last checkpoint"] = await _time(
            calls,
            lambda index: worker.complete(
                leases[index], result={"ok": True}, verdict="done", last_checkpoint=LAST
            ),
        )
        return results
    finally:
        for opened in (claim_pool, commit_pool, submit_pool, pool):
            await opened.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="calls of each kind")
    parser.add_argument("--fast-postgres", action="store_true", help="the test settings: fsync off")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    from rich.console import Console
    from rich.table import Table

    from devstack.postgres import PostgresService

    external = os.environ.get("DATABASE_URL", "")
    settings = None if external else ({} if args.fast_postgres else dict(DURABLE_SETTINGS))
    with PostgresService(external, settings=settings) as postgres:
        dsn = postgres.create_database("bench")
        try:
            results = asyncio.run(measure(dsn, args.calls))
        finally:
            postgres.drop_database(dsn)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    durability = "fast (fsync off)" if args.fast_postgres else "durable (fsync on)"
    table = Table(title=f"one call at a time, {args.calls} of each, {durability} Postgres")
    for column in ("call", "p50 ms", "p90 ms"):
        table.add_column(column, justify="left" if column == "call" else "right")
    for name, figures in results.items():
        table.add_row(name, f"{figures['p50_ms']:.3f}", f"{figures['p90_ms']:.3f}")
    Console().print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
