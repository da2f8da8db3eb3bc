"""Client CPU of a write's parameters: a group-commit flush, a submit batch, a submit's row.

``python -m benchmarks.params [--before DIR] [--runs 9] [--batches 300]``

What the process spends before anything is sent: ``GroupCommit.send`` building
a flush's parameters and psycopg converting them (against a stand-in pool whose
connection converts and returns no rows), ``batch_params`` and the conversion
of a submit batch of 16, and ``RunStore.submit_params`` for one job. No server
is needed. ``--before DIR`` runs the same measurement on another checkout (a
child process importing only that tree's code), in turn with this one. The
least and the median of ``--runs`` runs, in microseconds; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

RESULT_PREFIX = "PARAMS-RESULT "
RESPONSE: dict[str, Any] = {"tokens": ["the", "quick", "brown", "fox", "jumps"], "count": 5}
DEFINITION: dict[str, Any] = {"name": "bench", "steps": [{"name": "a", "target": "t"}] * 3}


def _timed(runs: int, count: int, call: Callable[[], object]) -> dict[str, float]:
    samples = []
    for _ in range(runs):
        started = time.process_time()
        for _ in range(count):
            call()
        samples.append((time.process_time() - started) * 1e6 / count)
    return {"least_us": min(samples), "median_us": statistics.median(samples)}


def measure(runs: int, batches: int) -> dict[str, dict[str, float]]:
    import psycopg
    from psycopg._queries import PostgresQuery
    from psycopg.adapt import AdaptersMap, Transformer
    from psycopg.types.json import Jsonb

    from store.group_commit import GroupCommit, _Write
    from store.group_commit_sql import Kind
    from store.records import Lease
    from store.runs import RunStore
    from store.submit_batch import batch_params
    from store.submit_batch_sql import SUBMIT_BATCH_SQL

    adapters = AdaptersMap(psycopg.adapters)
    with contextlib.suppress(ImportError):
        from store.binary_arrays import register

        register(adapters)

    def convert(sql: str, params: dict[str, Any]) -> None:
        PostgresQuery(Transformer(adapters)).convert(sql, params)

    class Cursor:
        async def fetchall(self) -> list[Any]:
            return []

    class Connection:
        async def execute(self, sql: str, params: dict[str, Any], prepare: bool = False) -> Cursor:
            convert(sql, params)
            return Cursor()

    class Pool:
        @contextlib.asynccontextmanager
        async def connection(self) -> AsyncIterator[Connection]:
            yield Connection()

    def checkpoint() -> Any:
        lease = Lease(uuid.uuid4(), "bench", 1, "bench-flow", 1_764_670_000_000_000, 0.0)
        entry = Jsonb({"name": "tokenize", "skipped": False, "response": RESPONSE})
        return _Write(Kind.CHECKPOINT, lease, {"entry": entry, "payload": os.urandom(160)})

    group = GroupCommit(Pool(), {"checkpoint_type": "STEP_CHECKPOINT"})  # type: ignore[arg-type]
    loop = asyncio.new_event_loop()
    results: dict[str, dict[str, float]] = {}
    try:
        for size in (8, 16):
            flushes = iter([[checkpoint() for _ in range(size)] for _ in range(batches)] * runs)

            def flush(batches_left: Iterator[list[Any]] = flushes) -> None:
                loop.run_until_complete(group.send(next(batches_left)))

            results[f"a flush of {size} checkpoints"] = _timed(runs, batches, flush)
    finally:
        loop.close()

    store = RunStore(None)  # type: ignore[arg-type]

    def submission() -> dict[str, Any]:
        return store.submit_params(
            job_id=uuid.uuid4(),
            workflow_name="bench-flow",
            definition=DEFINITION,
            definition_hash="h" * 64,
            input={"text": "benchmark job: durable workflow jobs on Postgres and Kafka"},
        )

    submits = [[submission() for _ in range(16)] for _ in range(batches)]
    rows = iter(submits * runs)
    results["a submit batch of 16 jobs"] = _timed(
        runs, batches, lambda: convert(SUBMIT_BATCH_SQL, batch_params(next(rows)))
    )
    results["one submit's row and event (submit_params)"] = _timed(runs, batches * 10, submission)
    return results


# Self-contained, like every benchmark that measures another checkout: that
# checkout needs only this file copied in, not a helper module beside it.
def _child(tree: Path, runs: int, batches: int) -> dict[str, dict[str, float]]:
    argv = [sys.executable, "-m", "benchmarks.params", "--child", "--runs", str(runs)]
    argv += ["--batches", str(batches)]
    done = subprocess.run(
        argv, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True
    )
    for line in done.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return dict(json.loads(line.removeprefix(RESULT_PREFIX)))
    raise RuntimeError(f"{tree}: no result\n{done.stdout}\n{done.stderr}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="another checkout to measure in turn")
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(RESULT_PREFIX + json.dumps(measure(args.runs, args.batches)), flush=True)
        return
    here = Path(__file__).resolve().parent.parent
    trees = [("before", args.before), ("this tree", here)] if args.before else [("this tree", here)]
    measured = {label: _child(tree, args.runs, args.batches) for label, tree in trees}
    print(f"{'what':45s}" + "".join(f"{label:>24s}" for label, _ in trees))
    for name in measured["this tree"]:
        cells = "".join(
            f"{m[name]['least_us']:10.1f} ({m[name]['median_us']:8.1f})" for m in measured.values()
        )
        print(f"{name:45s}{cells}   µs, least (median)")


if __name__ == "__main__":
    main()
