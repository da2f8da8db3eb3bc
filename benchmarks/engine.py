"""Client CPU of the engine's own parts of a job, apart from the store and the server.

``python -m benchmarks.engine [--before DIR] [--rounds 6] [--runs 5]``

What a drained job spends in the worker's Python outside its statements:
``run_segment`` of the benchmark's three-step in-process workflow (tokenize,
embed, review) with checkpoints that cost nothing, a job's four events in the
wire format (three STEP_CHECKPOINTs, one COMPLETED) for the entries and result
that segment gives, and of those their Structs, the JSON the row keeps of
the entries and the result, a lease's hash (the claim loops key their books
by lease), and entering and leaving a segment's per-target slot. No server
is needed.
``--before DIR`` measures another checkout the same way (a child process
importing only that tree's code), the two in turn for ``--rounds`` rounds.
Per part, each round's mean of ``--runs`` runs in microseconds: the least
and the median round, and with ``--before`` the median over rounds of this
tree's mean against the other's in the same round, the figure a machine
whose speed drifts between rounds disturbs least. Nothing is asserted.
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
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULT_PREFIX = "ENGINE-RESULT "
TEXT = "benchmark job 17: durable workflow jobs on Postgres and Kafka"
WORKFLOW_NAME = "embed-and-auto-review"


def _timed(runs: int, count: int, call: Callable[[], object]) -> list[float]:
    samples = []
    for _ in range(runs):
        started = time.process_time()
        for _ in range(count):
            call()
        samples.append((time.process_time() - started) * 1e6 / count)
    return samples


async def _timed_async(runs: int, count: int, call: Callable[[], Awaitable[object]]) -> list[float]:
    samples = []
    for _ in range(runs):
        started = time.process_time()
        for _ in range(count):
            await call()
        samples.append((time.process_time() - started) * 1e6 / count)
    return samples


async def measure(runs: int) -> dict[str, list[float]]:
    from schemas.event_wire import completed_bytes, step_checkpoint_bytes
    from schemas.struct_wire import struct_bytes
    from store.records import Lease
    from streams.claims import ClaimLoops
    from workflows.compiler import compile_definition
    from workflows.invokers import HandlerRegistry, load_handler_modules
    from workflows.runner import Completed, run_segment
    from workflows.samples import automatic_workflow

    workflow = compile_definition(automatic_workflow(WORKFLOW_NAME))
    registry = HandlerRegistry()
    load_handler_modules("workflows.samples.handlers", registry)
    job_input = workflow.validate_input({"text": TEXT})
    entries: list[dict[str, Any]] = []

    async def keep(entry: dict[str, Any]) -> None:
        entries.append(entry)

    async def discard(entry: dict[str, Any]) -> None:
        return None

    outcome = await run_segment(
        workflow, job_input, [], job_id="j", attempt=1, on_checkpoint=keep, registry=registry
    )
    assert isinstance(outcome, Completed)

    def segment() -> Awaitable[object]:
        return run_segment(
            workflow, job_input, [], job_id="j", attempt=1, on_checkpoint=discard, registry=registry
        )

    await _timed_async(1, 300, segment)  # warm
    results = {"a segment of three steps (run_segment)": await _timed_async(runs, 2000, segment)}

    # Jobs in turn, as a worker writes them: more than one attempt in the books.
    jobs = [uuid.uuid4() for _ in range(64)]
    turn = iter(range(10**9))

    def events() -> None:
        job_id = jobs[next(turn) % len(jobs)]
        fields: dict[str, Any] = {"job_id": job_id, "workflow_name": WORKFLOW_NAME, "attempt": 1}
        for entry in entries:
            step_checkpoint_bytes(
                **fields,
                occurred_at=datetime.now(UTC),
                step_name=entry["name"],
                response=entry["response"],
                skipped=False,
            )
        completed_bytes(
            **fields, occurred_at=datetime.now(UTC), verdict=outcome.verdict, result=outcome.result
        )

    results["a job's four events, wire format"] = _timed(runs, 5000, events)

    mappings = [entry["response"] for entry in entries] + [outcome.result]
    results["  of which their four Structs"] = _timed(
        runs, 5000, lambda: [struct_bytes(mapping) for mapping in mappings]
    )
    stored = [*entries, outcome.result]
    results["the JSON of a job's entries and result"] = _timed(
        runs, 5000, lambda: [json.dumps(value) for value in stored]
    )

    lease = Lease(uuid.uuid4(), "bench-worker", 1, WORKFLOW_NAME, 1_764_670_000_000_000, 0.001)
    results["a lease's hash"] = _timed(runs, 200_000, lambda: hash(lease))

    # The slot of the workflow's first step, taken from a stand-in for the
    # claim loops that holds only what ``_slot`` reads.
    class Loops:
        _slots: dict[str, asyncio.Semaphore] = {}
        _max_per_target = 16

    loops, step = Loops(), workflow.steps[0]

    async def slot() -> None:
        async with ClaimLoops._slot(loops, step):  # type: ignore[arg-type]
            pass

    results["a segment's slot, entered and left"] = await _timed_async(runs, 100_000, slot)
    return results


# Self-contained, like every benchmark that measures another checkout: that
# checkout needs only this file copied in, not a helper module beside it.
def _child(tree: Path, runs: int) -> dict[str, list[float]]:
    argv = [sys.executable, "-m", "benchmarks.engine", "--child", "--runs", str(runs)]
    done = subprocess.run(
        argv, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True
    )
    for line in done.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return dict(json.loads(line.removeprefix(RESULT_PREFIX)))
    raise RuntimeError(f"{tree}: no result\n{done.stdout}\n{done.stderr}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--before", type=Path, help="another checkout to measure in turn")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(RESULT_PREFIX + json.dumps(asyncio.run(measure(args.runs))), flush=True)
        return
    here = Path(__file__).resolve().parent.parent
    trees = [("before", args.before), ("this tree", here)] if args.before else [("this tree", here)]
    # Per part and tree, the mean of each round's runs.
    rounds: dict[str, dict[str, list[float]]] = {label: {} for label, _ in trees}
    for round_ in range(args.rounds):
        # Alternating the order: a machine whose speed drifts favours neither tree.
        for label, tree in trees if round_ % 2 == 0 else trees[::-1]:
            for name, values in _child(tree, args.runs).items():
                rounds[label].setdefault(name, []).append(statistics.fmean(values))
    header = "".join(f"{label:>22s}" for label, _ in trees)
    paired = "  this / before, median of rounds" if args.before else ""
    print(f"{'what':42s}{header}{paired}")
    for name, mine in rounds["this tree"].items():
        cells = "".join(
            f"{min(r[name]):9.1f} ({statistics.median(r[name]):7.1f})" for r in rounds.values()
        )
        ratio = ""
        if args.before:
            ratios = [a / b for a, b in zip(mine, rounds["before"][name], strict=True)]
            ratio = f"{statistics.median(ratios):12.2f}"
        print(f"{name:42s}{cells}{ratio}")
    print("µs: the least round's mean (the median round's)")


if __name__ == "__main__":
    main()
