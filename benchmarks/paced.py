"""Where a paced job's time goes, and what a wake-up costs on this machine.

``python -m benchmarks.paced [--jobs 500] [--rate 100] [--fast-postgres] [--json]``

The peers benchmark's paced phase (its ``WorkflowJobs.paced``: jobs arriving
open loop at ``--rate`` per second, each done when its completion's NOTIFY
reaches a listener), run once on a durable embedded Postgres (unless
``DATABASE_URL`` is set) with every store call of a job timed on the way: the
submit, the claim that took it, each group-commit write (two checkpoints and
the completion that carries the last one). The table gives the median of each
call and of each gap between them over the measured jobs, the CPU that
the process and the server spent per paced job, and the server's own time
(planning and executing, from ``pg_stat_statements``) in each statement of
the paced phase, beside which the rest of a call is its round trip.

Before that, the cost of waking up: one process sleeping and waking (a
blocking sleep, an asyncio sleep), and ``SELECT 1`` sent back to back against
sent 10 ms apart, with the client's and the server's CPU per statement, and
the latency ``store.gather`` adds to a write that comes alone. A
paced job is a chain of round trips each of which starts from idle on both
sides, so these figures, not the code between them, set most of its cost.
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable, Hashable, Iterable, Sequence
from typing import Any

import psycopg

from benchmarks import peers
from devstack.postgres import PostgresService
from store.gather import Gather

Marks = dict[str, list[tuple[str, float, float]]]


def _wrap(
    cls: type,
    name: str,
    keys: Callable[[tuple[Any, ...], dict[str, Any], Any], Iterable[tuple[str, str]]],
    marks: Marks,
) -> None:
    """Time every call of ``cls.name``; ``keys`` names the jobs (and labels) a call was for."""
    original = getattr(cls, name)

    async def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        answer = await original(self, *args, **kwargs)
        ended = time.monotonic()
        for job, label in keys(args, kwargs, answer):
            marks[job].append((label, started, ended))
        return answer

    setattr(cls, name, timed)


def instrument(marks: Marks) -> None:
    from store.group_commit import GroupCommit
    from store.runs import RunStore

    _wrap(RunStore, "submit", lambda a, k, r: [(str(k["job_id"]), "submit")], marks)
    _wrap(RunStore, "claim_batch", lambda a, k, r: [(str(c.job.job_id), "claim") for c in r], marks)
    _wrap(GroupCommit, "write", lambda a, k, r: [(str(a[1].job_id), str(a[0]))], marks)


def spans(marks: Marks, slots: dict[str, float], done: dict[str, float]) -> dict[str, float]:
    """Median milliseconds of each call and each gap, in a job's order."""
    found: dict[str, list[float]] = collections.defaultdict(list)
    for job, slot in slots.items():
        calls = sorted(marks.get(job, []), key=lambda mark: mark[1])
        if not calls or job not in done:
            continue
        previous, previous_end = "arrival slot", slot
        seen: collections.Counter[str] = collections.Counter()
        for label, started, ended in calls:
            seen[label] += 1
            name = f"{label} {seen[label]}" if label == "checkpoint" else label
            found[f"{previous} to {name}"].append((started - previous_end) * 1000)
            found[name].append((ended - started) * 1000)
            previous, previous_end = name, ended
        found[f"{previous} to the listener's NOTIFY"].append((done[job] - previous_end) * 1000)
        found["total"].append((done[job] - slot) * 1000)
    return {name: statistics.median(values) for name, values in found.items()}


def blocking_wake_ms(wakes: int = 300) -> float:
    """CPU milliseconds one blocking 10 ms sleep and its wake-up cost."""
    started = time.process_time()
    for _ in range(wakes):
        time.sleep(0.01)
    return (time.process_time() - started) * 1000 / wakes


class _Echo(Gather[int, int]):
    """A gather whose statement is one suspension of the loop: its own cost alone."""

    def keys(self, item: int) -> list[Hashable]:
        return [item]

    async def send(self, items: Sequence[int]) -> list[int]:
        await asyncio.sleep(0)
        return list(items)


async def lone_write_ms(writes: int = 400) -> dict[str, float]:
    """Median latency of a write that comes alone after 10 ms of quiet, as a
    paced job's do: through ``store.gather`` and, for the floor, its send called
    directly."""
    gather = _Echo()
    through: list[float] = []
    direct: list[float] = []
    for index in range(writes):
        await asyncio.sleep(0.01)
        started = time.perf_counter()
        await gather.gather(index)
        through.append(time.perf_counter() - started)
        await asyncio.sleep(0.01)
        started = time.perf_counter()
        await gather.send([index])
        direct.append(time.perf_counter() - started)
    return {
        "a lone write through store.gather, latency": statistics.median(through) * 1000,
        "its send called directly, latency": statistics.median(direct) * 1000,
    }


async def wake_costs(dsn: str, postmaster_pid: int | None) -> dict[str, float]:
    """CPU milliseconds per wake-up and per statement, back to back and spaced."""
    costs: dict[str, float] = {"time.sleep(10 ms), CPU per wake": blocking_wake_ms()}
    wakes = 300
    started = time.process_time()
    for _ in range(wakes):
        await asyncio.sleep(0.01)
    costs["asyncio.sleep(10 ms), CPU per wake"] = (time.process_time() - started) * 1000 / wakes
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for gap_s, count in ((0.0, 3000), (0.01, 300)):
            client = time.process_time()
            server = peers.server_cpu_s(postmaster_pid)
            for _ in range(count):
                await (await conn.execute("SELECT 1", prepare=True)).fetchall()
                if gap_s:
                    await asyncio.sleep(gap_s)
            label = "back to back" if not gap_s else f"{gap_s * 1000:.0f} ms apart"
            costs[f"SELECT 1 {label}, client CPU"] = (time.process_time() - client) * 1000 / count
            after = peers.server_cpu_s(postmaster_pid)
            if server is not None and after is not None:
                costs[f"SELECT 1 {label}, server CPU"] = (after - server) * 1000 / count
    if "SELECT 1 10 ms apart, client CPU" in costs:
        # The spaced figure includes the sleep's own wake-up.
        costs["SELECT 1 10 ms apart, client CPU"] -= costs["asyncio.sleep(10 ms), CPU per wake"]
    costs.update(await lone_write_ms())
    return costs


async def paced_job(
    admin_dsn: str, postmaster_pid: int | None, jobs: int, rate: float
) -> dict[str, Any]:
    database = f"paced_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
    dsn = psycopg.conninfo.make_conninfo(admin_dsn, dbname=database)
    target = peers.Target(
        dsn=dsn,
        admin_dsn=admin_dsn,
        database=database,
        concurrency=16,
        postmaster_pid=postmaster_pid,
        kafka_bootstrap="",
        kafka_pid=None,
        topic_prefix=database,
    )
    system = peers.WorkflowJobs(target, kafka=False)
    await system.setup()
    await system.run(200, "warmup")
    marks: Marks = collections.defaultdict(list)
    instrument(marks)
    slots: dict[str, float] = {}
    done: dict[str, float] = {}
    paced: Callable[..., Awaitable[dict[str, float]]] = peers._paced
    wait_for = peers.DoneListener.wait_for

    async def keep_slots(
        count: int, pace: float, submit: Any, *, index_base: int = 0
    ) -> dict[str, float]:
        scheduled = await paced(count, pace, submit, index_base=index_base)
        if index_base == 0:
            slots.update(scheduled)
        return scheduled

    async def keep_done(listener: peers.DoneListener, keys: Any, what: str) -> None:
        await wait_for(listener, keys, what)
        done.update(listener.done_at)

    peers._paced = keep_slots  # type: ignore[assignment]
    peers.DoneListener.wait_for = keep_done  # type: ignore[method-assign, assignment]
    counted = peers.enable_statements(admin_dsn, create=postmaster_pid is not None)
    if counted:
        peers.reset_statements(target)
    client, server = time.process_time(), peers.server_cpu_s(postmaster_pid)
    latencies = await system.paced(jobs, rate)
    # The paced phase also runs its unmeasured jobs: one, then a second's worth.
    ran = jobs + 1 + max(int(rate), 50)
    cpu = {"process CPU ms per paced job": (time.process_time() - client) * 1000 / ran}
    after = peers.server_cpu_s(postmaster_pid)
    if server is not None and after is not None:
        cpu["Postgres CPU ms per paced job"] = (after - server) * 1000 / ran
    return {
        "latency": latencies,
        "cpu": cpu,
        "spans": spans(marks, slots, done),
        # The server's own time in each statement (planning and executing; a
        # commit's WAL flush comes after and is not in it), against what the
        # client saw the call take.
        "statements": peers.top_statements(target, 8) if counted else [],
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    external = bool(os.environ.get("DATABASE_URL"))
    settings = {} if args.fast_postgres else dict(peers.DURABLE_SETTINGS)
    settings.update(peers.STATEMENT_SETTINGS)
    settings["pg_stat_statements.track_planning"] = "on"
    postgres = PostgresService(settings=None if external else settings)
    postgres.start()
    try:
        pid = None if external else postgres.pid
        costs = await wake_costs(postgres.dsn, pid)
        job = await paced_job(postgres.dsn, pid, args.jobs, args.rate)
    finally:
        postgres.stop()
    return {"wake costs": costs, **job}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--fast-postgres", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print("what a wake-up costs (ms)")
    for name, value in result["wake costs"].items():
        print(f"  {name:45s} {value:7.3f}")
    latency = result["latency"]
    print(
        f"paced: {args.jobs} jobs at {args.rate:g}/s, p50 {latency['p50']:.2f} ms,"
        f" p95 {latency['p95']:.2f} ms, p99 {latency['p99']:.2f} ms"
    )
    for name, value in result["cpu"].items():
        print(f"  {name:45s} {value:7.2f}")
    print("a paced job, median ms of each call and gap")
    for name, value in result["spans"].items():
        print(f"  {name:45s} {value:7.3f}")
    if result["statements"]:
        print("the server's time per statement in the paced phase, mean ms (plan + exec)")
        for row in result["statements"]:
            print(
                f"  {row['calls']:6d} calls {row['mean_plan_ms']:6.3f} + {row['mean_ms']:6.3f}"
                f"  {row['query'][:70]}"
            )


if __name__ == "__main__":
    main()
