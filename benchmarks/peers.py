"""Side by side: workflow-jobs against the fastest Postgres job queues, on one Postgres.

    python -m benchmarks.peers [--jobs 2000] [--concurrency 16] [--repeat 3] [--only SYSTEM ...]

The design's throughput claim is that a 3-step workflow, every step
checkpointed and every event on Kafka, runs at the speed of the fastest
Postgres job queues that checkpoint nothing. This measures it; it asserts
nothing. In one run, on one Postgres server (embedded unless ``DATABASE_URL``
is set), each system gets a fresh database of its own and does the same thing:

1. enqueue N jobs, one call per job, from ``--concurrency`` concurrent callers;
2. start a worker with ``--concurrency`` slots and let it drain the queue.

Rows:

* ``workflow-jobs`` -- the 3-step in-process sample (tokenize, embed, review),
  submitted through ``RunStore.submit`` and run by the real claim loops inside
  the real ``streams.runtime.Runtime`` (worker role). Per job: one submit, three
  checkpoints and one completion, each a row change plus its outbox row in one
  statement; the outbox rows stay PENDING because no relay runs.
* ``workflow-jobs, group commit off`` -- the same with
  ``WFJOBS_GROUP_COMMIT=false``; not run by a worker without that setting.
  ``WFJOBS_*`` variables of the benchmark's environment reach every
  workflow-jobs row.
* ``workflow-jobs + Kafka`` -- the same with the relay role on as well: the run
  ends when every outbox row is acknowledged by a real Apache Kafka broker and
  marked PUBLISHED; the events are counted on the topic afterwards.
* ``pgqueuer``, ``procrastinate`` -- a no-op job, enqueued and drained with the
  library's own API (``Queries.enqueue`` and ``PgQueuer.run(mode=drain)``;
  ``Task.defer_async`` and ``App.run_worker_async(wait=False)``). They write no
  checkpoint and publish nothing.
* ``bare SKIP LOCKED`` -- a hand-written queue: one INSERT per job, then one
  ``UPDATE ... FOR UPDATE SKIP LOCKED`` claim and one DELETE per job, each its
  own commit: the least a queue that takes one job at a time can do. (A queue
  that claims and completes in batches, as pgqueuer does, commits less often.)
* ``bare SKIP LOCKED, a durable commit and an event per step`` and its
  ``gathered`` twin -- the bare queue keeping the product's two conditions:
  each step's answer and its event committed, and flushed, before the next
  step starts. One commit per step from each runner's connection, or every
  ready commit point in one statement, as the product's group commit does.
* ``workflow-jobs' store alone, no engine`` -- the first row's writes through
  its ``RunStore``, with nothing on top.

Every run is a child process of its own (a clean interpreter, its own CPU
accounting) in a fresh database, and first does an unmeasured warm-up of the
same shape. Between the two, all its connections are closed, its database is
vacuumed and analyzed, and the server checkpoints, so each measured run starts
from the same state. Each system runs ``--repeat`` times, in rounds that
interleave the systems, and the table shows its median run; the Kafka rows go
last, with the broker started for them only.

Measured per system: wall time of the enqueue and drain phases, drain jobs/s
and end-to-end jobs/s over both, paced submit-to-completion latency
percentiles (a separate phase after the counters are read: jobs arriving at a
fixed rate with the worker running, after a second's worth of unmeasured
ones, each completion seen when its commit's NOTIFY arrives), write
transactions per job (transaction ids handed out), Postgres commits per job
(``pg_stat_database.xact_commit`` delta of its database), top-level
statements per job (``pg_stat_statements``, when loaded),
WAL bytes per job (server-wide; only one system runs at a time), CPU
milliseconds per job of the Python process over both phases (all its threads,
including librdkafka's) and in the drain alone, with how busy that kept the
process (a share of one core), and CPU milliseconds per job of the Postgres server
(postmaster, its background processes and every backend that ran).
Commits and statements also include the small fixed cost of starting and
stopping the worker, spread over the jobs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import importlib.metadata
import importlib.util
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import psycopg
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from devstack.apache_kafka import ApacheKafkaService
from devstack.postgres import PostgresService
from devstack.processes import ServiceError

if TYPE_CHECKING:
    from streams.runtime import Runtime
    from streams.settings import Settings

RESULT_PREFIX = "PEERS-RESULT "
EVENTS_PER_JOB = 5  # ACCEPTED, three STEP_CHECKPOINTs, COMPLETED
WORKFLOW_NAME = "bench-peers-embed-review"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
POLL_S = 0.005
DRAIN_TIMEOUT_S = 900.0

# Durable like a production server: every commit waits for its WAL flush. The
# test settings (fsync off) make commits nearly free, which flatters whoever
# commits most; ``--fast-postgres`` uses them for comparison.
DURABLE_SETTINGS: dict[str, str] = {
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
}
# Top-level statements only: what a client sent, not what ran inside the
# functions and triggers it called.
STATEMENT_SETTINGS: dict[str, str] = {
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track": "top",
}


@dataclass(frozen=True)
class SystemSpec:
    key: str
    label: str
    # The package that has to be importable; None for the project's own rows.
    needs: str | None
    peer: bool
    kafka: bool = False
    # Worker settings (documented WFJOBS_* variables) this row sets on top of the rest.
    env: tuple[tuple[str, str], ...] = ()
    # Paced latency needs a completion to be observable as it commits.
    paced: bool = True


SYSTEMS: tuple[SystemSpec, ...] = (
    SystemSpec("workflow-jobs", "workflow-jobs", None, peer=False),
    SystemSpec(
        "workflow-jobs-no-group-commit",
        "workflow-jobs, group commit off",
        None,
        peer=False,
        env=(("WFJOBS_GROUP_COMMIT", "false"),),
    ),
    SystemSpec("workflow-jobs-kafka", "workflow-jobs + Kafka", None, peer=False, kafka=True),
    SystemSpec("pgqueuer", "pgqueuer", "pgqueuer", peer=True),
    SystemSpec("procrastinate", "procrastinate", "procrastinate", peer=True),
    SystemSpec("baseline", "bare SKIP LOCKED", None, peer=False, paced=False),
    SystemSpec(
        "baseline-steps",
        "bare SKIP LOCKED, a durable commit and an event per step",
        None,
        peer=False,
        paced=False,
    ),
    SystemSpec(
        "baseline-gathered",
        "bare SKIP LOCKED, a durable commit and an event per step, gathered",
        None,
        peer=False,
        paced=False,
    ),
    SystemSpec(
        "store-alone", "workflow-jobs' store alone, no engine", None, peer=False, paced=False
    ),
)
BY_KEY = {spec.key: spec for spec in SYSTEMS}


# --------------------------------------------------------------------------- results


@dataclass
class Phase:
    enqueue_s: float
    drain_s: float
    cpu_s: float
    handled: int
    # The Python side's CPU in the drain alone.
    drain_cpu_s: float


class Stopwatch:
    """A run's two phases, timed by the wall clock and this process's CPU from its making."""

    def __init__(self) -> None:
        self._started = self._now()
        self._enqueued = self._drained = self._started

    @staticmethod
    def _now() -> tuple[float, float]:
        return time.monotonic(), time.process_time()

    def enqueued(self) -> None:
        self._enqueued = self._now()

    def drained(self) -> None:
        self._drained = self._now()

    def phase(self, handled: int) -> Phase:
        (started, cpu_started), (enqueued, cpu_enqueued) = self._started, self._enqueued
        drained, cpu_done = self._drained
        return Phase(
            enqueued - started,
            drained - enqueued,
            cpu_done - cpu_started,
            handled,
            cpu_done - cpu_enqueued,
        )


@dataclass
class Counters:
    commits: int
    statements: int | None
    postgres_cpu_s: float | None
    kafka_cpu_s: float | None
    wal_lsn: str
    next_xid: int


@dataclass
class ChildResult:
    system: str
    jobs: int
    warmup_jobs: int
    enqueue_s: float
    drain_s: float
    cpu_s: float
    commits: int
    statements: int | None
    postgres_cpu_s: float | None
    kafka_cpu_s: float | None
    wal_bytes: int
    write_xacts: int
    verified: bool
    drain_cpu_s: float = 0.0
    checks: dict[str, Any] = field(default_factory=dict)
    # Submit-to-completion latencies of the paced phase, milliseconds.
    paced: dict[str, float] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    top_statements: list[dict[str, Any]] = field(default_factory=list)


def jobs_per_s(result: ChildResult) -> float:
    """End to end: the jobs over enqueue and drain together."""
    return result.jobs / max(result.enqueue_s + result.drain_s, 1e-9)


def drain_jobs_per_s(result: ChildResult) -> float:
    return result.jobs / max(result.drain_s, 1e-9)


def total_cpu_s(result: ChildResult) -> float | None:
    """Every process of the run: the Python side, Postgres and, in its rows, the broker."""
    if result.postgres_cpu_s is None:
        return None
    return result.cpu_s + result.postgres_cpu_s + (result.kafka_cpu_s or 0.0)


@dataclass
class Row:
    spec: SystemSpec
    results: list[ChildResult] = field(default_factory=list)
    skipped: str = ""
    failed: str = ""

    @property
    def result(self) -> ChildResult | None:
        """The median run by jobs/s (the lower middle one for an even count).

        A whole run rather than per-column medians, so the columns of a row
        always belong together.
        """
        if not self.results:
            return None
        ranked = sorted(self.results, key=jobs_per_s)
        return ranked[(len(ranked) - 1) // 2]

    @property
    def wall_s(self) -> float:
        assert self.result is not None
        return self.result.enqueue_s + self.result.drain_s

    @property
    def jobs_per_s(self) -> float:
        assert self.result is not None
        return jobs_per_s(self.result)

    @property
    def spread(self) -> str:
        rates = sorted(jobs_per_s(result) for result in self.results)
        return f"{rates[0]:.0f}-{rates[-1]:.0f}" if len(rates) > 1 else "-"


# --------------------------------------------------------------------------- measuring


@dataclass(frozen=True)
class Target:
    """Where a child works and what it may look at."""

    dsn: str
    admin_dsn: str
    database: str
    concurrency: int
    postmaster_pid: int | None
    kafka_bootstrap: str
    kafka_pid: int | None
    topic_prefix: str


def _stat_times(pid: int) -> list[int]:
    # Fields after the command name, which may itself contain spaces or ")".
    return [
        int(value)
        for value in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[11:15]
    ]


def process_cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of a live process and all its threads (Linux)."""
    if pid is None:
        return None
    try:
        utime, stime, _, _ = _stat_times(pid)
    except (OSError, ValueError):
        return None
    return (utime + stime) / CLOCK_TICKS


def server_cpu_s(postmaster_pid: int | None) -> float | None:
    """CPU seconds of a Postgres server: postmaster, live children, reaped children.

    Backends that already exited are in the postmaster's cutime/cstime, so a
    reading taken while no client is connected covers every backend that ran.
    """
    if postmaster_pid is None:
        return None
    ticks = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue  # gone between listing and reading
        fields = text.rsplit(")", 1)[1].split()
        if int(fields[1]) == postmaster_pid:
            ticks += int(fields[11]) + int(fields[12])
    try:
        utime, stime, cutime, cstime = _stat_times(postmaster_pid)
    except (OSError, ValueError):
        return None
    return (ticks + utime + stime + cutime + cstime) / CLOCK_TICKS


def read_counters(target: Target) -> Counters:
    # Read through the admin database, so the reading never counts as a
    # commit or a statement of the database being measured.
    with psycopg.connect(target.admin_dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (target.database,)
        ).fetchone()
        commits = int(row[0]) if row else 0
        statements: int | None = None
        try:
            found = conn.execute(
                "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements"
                " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s)",
                (target.database,),
            ).fetchone()
            statements = int(found[0]) if found else None
        except psycopg.Error:
            statements = None  # the extension is not loaded on this server
        lsn = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        # The next transaction id, without taking one: only a transaction
        # that writes is given an id, so the delta counts write transactions
        # exactly and at once (server-wide; one system runs at a time).
        xid = conn.execute(
            "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
        ).fetchone()
    return Counters(
        next_xid=int(xid[0]) if xid else 0,
        commits=commits,
        statements=statements,
        wal_lsn=str(lsn[0]) if lsn else "0/0",
        postgres_cpu_s=server_cpu_s(target.postmaster_pid),
        kafka_cpu_s=process_cpu_s(target.kafka_pid),
    )


def wal_bytes(target: Target, start: str, end: str) -> int:
    """WAL written between two positions, by the whole server.

    Only one system runs at a time, so this is its write volume: row versions,
    index entries and the full-page images that follow a checkpoint.
    """
    with psycopg.connect(target.admin_dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)", (end, start)
        ).fetchone()
    return int(row[0]) if row else 0


def reset_statements(target: Target) -> None:
    """Forget this database's statement statistics, so a listing shows the measured run only."""
    with (
        psycopg.connect(target.admin_dsn, autocommit=True) as conn,
        contextlib.suppress(psycopg.Error),
    ):
        conn.execute(
            "SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database"
            " WHERE datname = %s), 0)",
            (target.database,),
        )


def top_statements(target: Target, limit: int) -> list[dict[str, Any]]:
    """The statements that took the most server time, for finding where a run went."""
    with psycopg.connect(target.admin_dsn, autocommit=True) as conn:
        try:
            rows = conn.execute(
                "SELECT calls, total_exec_time, total_plan_time, rows, query"
                " FROM pg_stat_statements"
                " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s)"
                " ORDER BY total_exec_time DESC LIMIT %s",
                (target.database, limit),
            ).fetchall()
        except psycopg.Error:
            return []
    return [
        {
            "calls": int(calls),
            "total_ms": round(float(total), 1),
            "mean_ms": round(float(total) / max(int(calls), 1), 3),
            # Zero unless the server tracks planning (pg_stat_statements.track_planning).
            "mean_plan_ms": round(float(plan) / max(int(calls), 1), 3),
            "rows": int(count),
            "query": " ".join(str(query).split())[:160],
        }
        for calls, total, plan, count, query in rows
    ]


def quiesce(target: Target, *, vacuum: bool) -> None:
    """Wait until no client is connected to the database, so its statistics are flushed.

    A backend reports its commit counts in batches, at the latest when it
    exits; only with every connection closed is ``xact_commit`` exact.
    """
    if vacuum:
        with psycopg.connect(target.dsn, autocommit=True) as conn:
            conn.execute("VACUUM (ANALYZE)")
    with psycopg.connect(target.admin_dsn, autocommit=True) as conn:
        deadline = time.monotonic() + 60.0
        while True:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = %s AND backend_type = 'client backend'",
                (target.database,),
            ).fetchone()
            if row is not None and int(row[0]) == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"clients still connected to {target.database} after 60 s")
            time.sleep(0.05)
        if vacuum:
            # Whoever comes next starts without a checkpoint pending from the warm-up.
            with contextlib.suppress(psycopg.Error):
                conn.execute("CHECKPOINT")
    # A leaving backend drops out of pg_stat_activity just before it flushes
    # its statistics.
    time.sleep(0.3)


async def until(
    predicate: Callable[[], bool], what: str, timeout_s: float = DRAIN_TIMEOUT_S
) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(POLL_S)


async def fan_out(count: int, concurrency: int, call: Callable[[int], Awaitable[None]]) -> None:
    """``call(i)`` for every i below ``count``, ``concurrency`` at a time."""
    indexes = iter(range(count))

    async def caller() -> None:
        for index in indexes:
            await call(index)

    await asyncio.gather(*(caller() for _ in range(concurrency)))


def job_input(index: int) -> dict[str, Any]:
    # The same payload for every system: the workflow's input.
    return {"text": f"benchmark job {index}: durable workflow jobs on Postgres and Kafka"}


# --------------------------------------------------------------------------- paced latency

DONE_CHANNEL = "bench_done"
PACED_TIMEOUT_S = 120.0


def done_trigger(table: str, event: str, key: str, when: str = "true") -> str:
    """A trigger that announces each finished job of ``table`` on ``DONE_CHANNEL``.

    Postgres delivers a notification only once its transaction is committed,
    which with ``synchronous_commit`` on is after the commit's WAL flush: its
    arrival is the moment the completion became durable, observed the same
    way for every engine, without polling and without hooks in their code.
    """
    return f"""
CREATE FUNCTION bench_done() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{DONE_CHANNEL}', {key}::text);
    RETURN NULL;
END $$;
CREATE TRIGGER bench_done AFTER {event} ON {table}
    FOR EACH ROW WHEN ({when}) EXECUTE FUNCTION bench_done();
"""


async def install(dsn: str, sql: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql)


class DoneListener:
    """Notes when each job's completion commits, from ``DONE_CHANNEL``."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.done_at: dict[str, float] = {}
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> DoneListener:
        self._conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
        await self._conn.execute(f"LISTEN {DONE_CHANNEL}")
        self._task = asyncio.create_task(self._listen(self._conn))
        return self

    async def _listen(self, conn: psycopg.AsyncConnection[Any]) -> None:
        async for note in conn.notifies():
            self.done_at.setdefault(note.payload, time.monotonic())

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._conn is not None:
            await self._conn.close()

    async def wait_for(self, keys: Sequence[str] | dict[str, float], what: str) -> None:
        def done() -> bool:
            if self._task is not None and self._task.done():
                self._task.result()  # a dead listener would wait out the timeout
            return all(key in self.done_at for key in keys)

        await until(done, what, PACED_TIMEOUT_S)


async def _paced(
    jobs: int, rate: float, submit: Callable[[int], Awaitable[str]], *, index_base: int = 0
) -> dict[str, float]:
    """Submit ``jobs`` jobs at ``rate`` per second, open loop: each job's id and its slot."""
    scheduled: dict[str, float] = {}

    async def one(index: int, slot: float) -> None:
        scheduled[await submit(index)] = slot

    tasks: list[asyncio.Task[None]] = []
    start = time.monotonic()
    for index in range(jobs):
        slot = start + index / rate
        delay = slot - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(index_base + index, slot)))
    await asyncio.gather(*tasks)
    return scheduled


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(fraction * len(sorted_values)) - 1))
    return sorted_values[index]


async def paced_latencies(
    jobs: int, rate: float, submit: Callable[[int], Awaitable[str]], listener: DoneListener
) -> dict[str, float]:
    """Submit ``jobs`` at ``rate`` per second with the worker running; latency percentiles.

    Open loop: each submit starts at its own slot whether or not the earlier
    ones have returned, and its latency counts from the slot, so a stall shows
    in the figures instead of quietly delaying the arrivals. One unmeasured job
    first proves the worker is up and listening; then a second's worth of jobs
    (``rate`` of them, at least 50) arrives at the same pace, unmeasured: a
    worker that has just started is still opening its pool's connections and
    preparing its statements on each, which delayed the first jobs by up to
    100 ms and more, and at 100 jobs/s for 5 s that start alone made the p95
    and the p99. The figures describe a worker that is up, as any engine's
    would be after its first second.
    """
    first = await submit(-1)
    await listener.wait_for([first], "the first paced job")
    warmup = max(int(rate), 50)
    await listener.wait_for(
        await _paced(warmup, rate, submit, index_base=-1 - warmup), "the paced warm-up"
    )
    scheduled = await _paced(jobs, rate, submit)
    await listener.wait_for(scheduled, "every paced job to complete")
    latencies = sorted((listener.done_at[key] - slot) * 1000 for key, slot in scheduled.items())
    return {
        "jobs": float(jobs),
        "rate": rate,
        "p50": percentile(latencies, 0.50),
        "p95": percentile(latencies, 0.95),
        "p99": percentile(latencies, 0.99),
        "max": latencies[-1],
    }


# --------------------------------------------------------------------------- systems


class System(Protocol):
    settings: dict[str, Any]

    async def setup(self) -> None: ...

    async def run(self, jobs: int, phase: str) -> Phase: ...

    async def verify(self, total_jobs: int, measured_jobs: int) -> dict[str, Any]: ...

    async def paced(self, jobs: int, rate: float) -> dict[str, float]: ...


class WorkflowJobs:
    """The product: ``RunStore.submit``, then the worker's own ``Runtime``."""

    def __init__(
        self,
        target: Target,
        *,
        kafka: bool,
        env: Sequence[tuple[str, str]] = (),
        worker_id: str = "bench-peers",
    ) -> None:
        self.target = target
        self.kafka = kafka
        self.worker_id = worker_id
        c = target.concurrency
        # WFJOBS_* variables of the benchmark's own environment reach the
        # worker too (e.g. WFJOBS_GROUP_COMMIT=false for a whole run); the row's
        # own settings and the benchmark's shape take precedence.
        self.inherited = {
            name: value for name, value in os.environ.items() if name.startswith("WFJOBS_")
        }
        self.row_env = dict(env)
        self.settings = {
            "claim loops": c,
            "claim batch": 8,
            "per-target cap": c,
            "pool": c + 2,
            "relay": "on, Apache Kafka" if kafka else "off (outbox rows stay PENDING)",
            **self.inherited,
            **self.row_env,
        }
        from workflows.cache import DefinitionCache
        from workflows.samples import automatic_workflow

        # One cache for the whole process, as in a long-lived worker: the
        # warm-up compiles the definition, the measured run reuses it.
        self.cache = DefinitionCache()
        self.workflow = automatic_workflow(WORKFLOW_NAME)
        self.measured_topic = f"{target.topic_prefix}-events"

    def _settings(self, roles: str, topic: str, pool: int) -> Settings:
        from streams.settings import Settings

        # The documented environment variables: the worker's public surface.
        return Settings.from_env(
            {
                **self.inherited,
                **self.row_env,
                "DATABASE_URL": self.target.dsn,
                "KAFKA_BOOTSTRAP_SERVERS": self.target.kafka_bootstrap or "127.0.0.1:9",
                "WFJOBS_WORKER_ID": self.worker_id,
                "WFJOBS_ROLES": roles,
                "WFJOBS_HANDLERS": "workflows.samples.handlers",
                "WFJOBS_EVENTS_TOPIC": topic,
                "WFJOBS_CLAIM_LOOPS": str(self.target.concurrency),
                "WFJOBS_CLAIM_BATCH": "8",
                "WFJOBS_MAX_CONCURRENT_PER_TARGET": str(self.target.concurrency),
                "WFJOBS_POOL_MIN": str(pool),
                "WFJOBS_POOL_MAX": str(pool),
            }
        )

    async def setup(self) -> None:
        from store.migrate import migrate

        await migrate(self.target.dsn)

    async def submitter(
        self, topic: str
    ) -> tuple[Runtime, Callable[[int], Awaitable[str]], Runtime]:
        """An api runtime and its submit call (returning the job id), and an unstarted worker."""
        from streams.runtime import Runtime

        c = self.target.concurrency
        # The api role only: a pool and the stores, as the submit verb has them.
        api = Runtime(self._settings("api", topic, c), cache=self.cache)
        await api.start()
        await api.wait_ready()
        assert api.pool is not None
        await api.pool.wait(timeout=30.0)
        runs = api.require_runs()
        compiled = api.compile(self.workflow)

        async def submit(index: int) -> str:
            job_id = uuid.uuid4()
            await runs.submit(
                job_id=job_id,
                workflow_name=compiled.name,
                definition=self.workflow,
                definition_hash=compiled.definition_hash,
                input=compiled.validate_input(job_input(index)),
            )
            return str(job_id)

        roles = "worker,relay" if self.kafka else "worker"
        worker = Runtime(self._settings(roles, topic, c + 2), cache=self.cache)
        return api, submit, worker

    async def paced(self, jobs: int, rate: float) -> dict[str, float]:
        await install(
            self.target.dsn,
            done_trigger(
                "workflow_run",
                "UPDATE OF status",
                "NEW.job_id",
                "NEW.status = 'COMPLETED' AND OLD.status <> 'COMPLETED'",
            ),
        )
        api, submit, worker = await self.submitter(self.measured_topic)
        try:
            await worker.start()
            await worker.wait_ready()
            async with DoneListener(self.target.dsn) as listener:
                return await paced_latencies(jobs, rate, submit, listener)
        finally:
            await worker.stop()
            await api.stop()

    async def run(self, jobs: int, phase: str) -> Phase:
        c = self.target.concurrency
        topic = self.measured_topic if phase == "measured" else f"{self.target.topic_prefix}-warmup"
        api, submit_one, worker = await self.submitter(topic)

        async def submit(index: int) -> None:
            await submit_one(index)

        try:
            watch = Stopwatch()
            await fan_out(jobs, c, submit)
            watch.enqueued()
            await worker.start()
            await worker.wait_ready()
            claims = worker.claims
            assert claims is not None
            await until(lambda: claims.stats.completed >= jobs, "every job COMPLETED")
            if self.kafka:
                relay = worker.relay
                assert relay is not None
                await until(
                    lambda: relay.stats.published >= jobs * EVENTS_PER_JOB,
                    "every event acknowledged by Kafka",
                )
                # Acked is not yet marked: wait for the pass to commit its PUBLISHED marks.
                await self._until_outbox_settled(api)
            watch.drained()
            handled = claims.stats.completed
        finally:
            await worker.stop()
            await api.stop()
        return watch.phase(handled)

    async def _until_outbox_settled(self, api: Runtime) -> None:
        assert api.pool is not None
        deadline = time.monotonic() + 60.0
        while True:
            async with api.pool.connection() as conn:
                cursor = await conn.execute(
                    "SELECT count(*) FROM workflow_run_events_outbox WHERE status <> 'PUBLISHED'"
                )
                row = await cursor.fetchone()
            if row is not None and int(row[0]) == 0:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{row[0] if row else '?'} outbox rows never became PUBLISHED")
            await asyncio.sleep(POLL_S)

    async def verify(self, total_jobs: int, measured_jobs: int) -> dict[str, Any]:
        async with await psycopg.AsyncConnection.connect(self.target.dsn, autocommit=True) as conn:
            statuses: dict[str, int] = dict(
                await (
                    await conn.execute("SELECT status, count(*) FROM workflow_run GROUP BY status")
                ).fetchall()
            )
            outbox: dict[str, int] = dict(
                await (
                    await conn.execute(
                        "SELECT status, count(*) FROM workflow_run_events_outbox GROUP BY status"
                    )
                ).fetchall()
            )
            row = await (
                await conn.execute(
                    "SELECT min(jsonb_array_length(checkpoints)),"
                    " max(jsonb_array_length(checkpoints)) FROM workflow_run"
                )
            ).fetchone()
        checks: dict[str, Any] = {
            "rows by status": {str(k): int(v) for k, v in statuses.items()},
            "outbox rows by status": {str(k): int(v) for k, v in outbox.items()},
            "checkpoints per job": f"{row[0]}..{row[1]}" if row else "?",
        }
        ok = statuses == {"COMPLETED": total_jobs} and sum(outbox.values()) == (
            total_jobs * EVENTS_PER_JOB
        )
        ok = ok and row is not None and row[0] == row[1] == 3
        if self.kafka:
            on_topic = count_topic_messages(self.target.kafka_bootstrap, self.measured_topic)
            checks["events on the topic"] = on_topic
            ok = ok and on_topic == measured_jobs * EVENTS_PER_JOB
            ok = ok and outbox == {"PUBLISHED": total_jobs * EVENTS_PER_JOB}
        checks["ok"] = ok
        return checks


# What the sample workflow's three steps answer for a job (``job_input``), and
# what its runner then stores: the floor row writes the same bytes.
_TOKENS = ["benchmark", "job", "0", "durable", "workflow", "jobs", "on", "postgres", "and", "kafka"]
STORE_ALONE_ENTRIES: tuple[dict[str, Any], ...] = (
    {
        "name": "tokenize",
        "skipped": False,
        "response": {
            "ids": [35647, 44585, 210, 17058, 48343, 34182, 33193, 3030, 36622, 27400],
            "tokens": _TOKENS,
        },
    },
    {
        "name": "embed",
        "skipped": False,
        "response": {
            "vector": [
                0.182574,
                0.365148,
                0.547723,
                0.547723,
                -0.182574,
                0.182574,
                0.182574,
                -0.365148,
            ],
            "dimensions": 8,
        },
    },
    {
        "name": "review",
        "skipped": False,
        "response": {"note": "approved automatically", "approved": True},
    },
)
STORE_ALONE_RESULT: dict[str, Any] = {
    "note": "approved automatically",
    "tokens": _TOKENS,
    "approved": True,
    "dimensions": 8,
}
STORE_ALONE_VERDICT = "completed 3 steps: tokenize, embed, review"
# The claim batch, as the workflow-jobs rows have it (WFJOBS_CLAIM_BATCH).
CLAIM_AHEAD = 8


class StoreAlone:
    """The product's store with no engine on top: the floor of workflow-jobs' writes.

    The jobs are submitted as the ``workflow-jobs`` row submits them. The drain
    calls ``RunStore`` as runners with nothing else to do would: a claim of up
    to eight jobs whenever eight more fit beside the jobs in hand (the runners'
    count and eight more at most), so one claim is on its way while the runners
    run; then for each job two checkpoints and the completion carrying the
    third, through the
    group commit and connections of its own, as a worker has them, with the
    entries and the result the sample workflow's steps give. Nothing else
    runs: no definition is compiled, no step called, no lease renewed, no
    metric or span kept, and the pools are open before the clock starts. The
    statements, their events and the store's own Python are all it costs, so
    no engine over this store could spend less per job. Its drain rate is no
    such bound: its runners claim only when eight slots are free and wait on
    their commits with the process's core half idle, where the engine's
    claim the next job while a settle commits.
    """

    worker_id = "bench-store-alone"

    def __init__(self, target: Target) -> None:
        self.target = target
        self.product = WorkflowJobs(target, kafka=False, worker_id=self.worker_id)
        self.settings = {
            "runners": target.concurrency,
            "claim batch": f"{CLAIM_AHEAD}, one batch ahead of the runners",
            "group commit": "on, a connection of its own",
            "engine": "none: RunStore called directly",
        }

    async def setup(self) -> None:
        await self.product.setup()

    async def run(self, jobs: int, phase: str) -> Phase:
        from store.pool import create_pool
        from store.records import ClaimedJob
        from store.run_sql import CLAIM_SESSION
        from store.runs import RunStore

        c = self.target.concurrency
        api, submit_one, _ = await self.product.submitter(f"{self.target.topic_prefix}-{phase}")

        async def submit(index: int) -> None:
            await submit_one(index)

        dsn = self.target.dsn
        pool = create_pool(dsn, min_size=c + 2, max_size=c + 2)
        claim_pool = create_pool(dsn, min_size=1, max_size=1, session=CLAIM_SESSION)
        commit_pool = create_pool(dsn, min_size=1, max_size=1)
        pools = (pool, claim_pool, commit_pool)
        handled = 0
        try:
            for each in pools:
                await each.open(wait=True)
            store = RunStore(pool, claim_pool=claim_pool, commit_pool=commit_pool)
            ready: asyncio.Queue[ClaimedJob | None] = asyncio.Queue()
            # One claim ahead of the runners: a job is claimed while others run.
            in_hand = asyncio.Semaphore(c + CLAIM_AHEAD)

            async def claimer() -> None:
                while True:
                    for _ in range(CLAIM_AHEAD):
                        await in_hand.acquire()
                    taken = await store.claim_batch(
                        self.worker_id, CLAIM_AHEAD, compiled=lambda _hash: True
                    )
                    for job in taken:
                        ready.put_nowait(job)
                    for _ in range(CLAIM_AHEAD - len(taken)):
                        in_hand.release()
                    if not taken:
                        for _ in range(c):
                            ready.put_nowait(None)
                        return

            async def runner() -> None:
                nonlocal handled
                while (job := await ready.get()) is not None:
                    for entry in STORE_ALONE_ENTRIES[:-1]:
                        await store.checkpoint(job.lease, entry)
                    await store.complete(
                        job.lease,
                        result=STORE_ALONE_RESULT,
                        verdict=STORE_ALONE_VERDICT,
                        last_checkpoint=STORE_ALONE_ENTRIES[-1],
                    )
                    handled += 1
                    in_hand.release()

            watch = Stopwatch()
            await fan_out(jobs, c, submit)
            watch.enqueued()
            await asyncio.gather(claimer(), *(runner() for _ in range(c)))
            watch.drained()
        finally:
            for each in pools:
                await each.close()
            await api.stop()
        return watch.phase(handled)

    async def paced(self, jobs: int, rate: float) -> dict[str, float]:
        # Its runners stop once the queue is empty: nothing waits for a wake-up.
        return {}

    async def verify(self, total_jobs: int, measured_jobs: int) -> dict[str, Any]:
        return await self.product.verify(total_jobs, measured_jobs)


def count_topic_messages(bootstrap: str, topic: str) -> int:
    """Messages on ``topic``: the sum of its partitions' offset ranges.

    The relay's producer is idempotent but not transactional, so there are no
    control records in the offsets.
    """
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-peers-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=15)
        total = 0
        for partition in metadata.topics[topic].partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=15)
            total += int(high) - int(low)
        return total
    finally:
        consumer.close()


class PgQueuerPeer:
    """pgqueuer with asyncpg, its default driver: ``Queries.enqueue``, ``PgQueuer.run(drain)``."""

    def __init__(self, target: Target) -> None:
        self.target = target
        c = target.concurrency
        # One worker (one PgQueuer, one connection) with c job slots. The
        # library requires the slots to be at least twice the dequeue batch.
        self.batch = max(1, c // 2)
        self.settings = {
            "version": importlib.metadata.version("pgqueuer"),
            "driver": "asyncpg",
            "enqueue pool": c,
            "max_concurrent_tasks": c,
            "batch_size": self.batch,
        }
        self.handled = 0

    async def setup(self) -> None:
        import asyncpg
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.queries import Queries

        conn = await asyncpg.connect(self.target.dsn)
        try:
            await Queries(AsyncpgDriver(conn)).install()
        finally:
            await conn.close()

    async def run(self, jobs: int, phase: str) -> Phase:
        import asyncpg
        from pgqueuer import PgQueuer
        from pgqueuer.db import AsyncpgDriver, AsyncpgPoolDriver
        from pgqueuer.models import Job
        from pgqueuer.queries import Queries
        from pgqueuer.types import QueueExecutionMode

        c = self.target.concurrency
        self.handled = 0
        pool = await asyncpg.create_pool(self.target.dsn, min_size=c, max_size=c)
        queries = Queries(AsyncpgPoolDriver(pool))
        payloads = [json.dumps(job_input(index)).encode() for index in range(jobs)]

        async def enqueue(index: int) -> None:
            await queries.enqueue("noop", payloads[index])

        worker_conn = None
        try:
            watch = Stopwatch()
            await fan_out(jobs, c, enqueue)
            watch.enqueued()
            worker_conn = await asyncpg.connect(self.target.dsn)
            pgq = PgQueuer(AsyncpgDriver(worker_conn))

            async def noop(job: Job) -> None:
                self.handled += 1

            # Registered by a call rather than as a decorator: the type checker
            # runs without the peers installed, where the decorator is untyped.
            pgq.entrypoint("noop")(noop)
            await pgq.run(
                batch_size=self.batch,
                max_concurrent_tasks=c,
                mode=QueueExecutionMode.drain,
            )
            watch.drained()
        finally:
            if worker_conn is not None:
                await worker_conn.close()
            await pool.close()
        return watch.phase(self.handled)

    async def paced(self, jobs: int, rate: float) -> dict[str, float]:
        import asyncpg
        from pgqueuer import PgQueuer
        from pgqueuer.db import AsyncpgDriver, AsyncpgPoolDriver
        from pgqueuer.models import Job
        from pgqueuer.queries import Queries

        # A finished job leaves the queue table (into its log) when its
        # completion is written; pgqueuer buffers completions for up to 0.1 s.
        await install(self.target.dsn, done_trigger("pgqueuer", "DELETE", "OLD.id"))
        c = self.target.concurrency
        pool = await asyncpg.create_pool(self.target.dsn, min_size=c, max_size=c)
        queries = Queries(AsyncpgPoolDriver(pool))
        worker_conn = await asyncpg.connect(self.target.dsn)
        pgq = PgQueuer(AsyncpgDriver(worker_conn))

        async def noop(job: Job) -> None:
            self.handled += 1

        pgq.entrypoint("noop")(noop)

        async def submit(index: int) -> str:
            ids = await queries.enqueue("noop", json.dumps(job_input(index)).encode())
            return str(ids[0])

        worker = asyncio.create_task(pgq.run(batch_size=self.batch, max_concurrent_tasks=c))
        try:
            async with DoneListener(self.target.dsn) as listener:
                return await paced_latencies(jobs, rate, submit, listener)
        finally:
            pgq.shutdown.set()
            await worker
            await worker_conn.close()
            await pool.close()

    async def verify(self, total_jobs: int, measured_jobs: int) -> dict[str, Any]:
        async with await psycopg.AsyncConnection.connect(self.target.dsn, autocommit=True) as conn:
            queued = await (await conn.execute("SELECT count(*) FROM pgqueuer")).fetchone()
        left = int(queued[0]) if queued else -1
        return {
            "jobs left in the queue": left,
            "handler calls": self.handled,
            "ok": left == 0 and self.handled == measured_jobs,
        }


class ProcrastinatePeer:
    """procrastinate: ``Task.defer_async``, then ``App.run_worker_async(wait=False)``."""

    def __init__(self, target: Target) -> None:
        self.target = target
        c = target.concurrency
        self.settings = {
            "version": importlib.metadata.version("procrastinate"),
            "connector": "PsycopgConnector",
            "pool": c + 2,
            "worker concurrency": c,
            "delete_jobs": "never (the default)",
        }
        self.handled = 0

    async def setup(self) -> None:
        from procrastinate import App, PsycopgConnector

        app = App(connector=PsycopgConnector(conninfo=self.target.dsn))
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    async def run(self, jobs: int, phase: str) -> Phase:
        from procrastinate import App, PsycopgConnector

        c = self.target.concurrency
        self.handled = 0
        connector = PsycopgConnector(conninfo=self.target.dsn, min_size=c + 2, max_size=c + 2)
        app = App(connector=connector)

        async def noop(text: str) -> None:
            self.handled += 1

        # A call, not a decorator, for the same reason as with pgqueuer above.
        task = app.task(name="noop")(noop)
        inputs = [job_input(index)["text"] for index in range(jobs)]

        async def defer(index: int) -> None:
            await task.defer_async(text=inputs[index])

        async with app.open_async():
            await connector.pool.wait(timeout=30.0)
            watch = Stopwatch()
            await fan_out(jobs, c, defer)
            watch.enqueued()
            await app.run_worker_async(concurrency=c, wait=False, install_signal_handlers=False)
            watch.drained()
        return watch.phase(self.handled)

    async def paced(self, jobs: int, rate: float) -> dict[str, float]:
        from procrastinate import App, PsycopgConnector

        await install(
            self.target.dsn,
            done_trigger(
                "procrastinate_jobs",
                "UPDATE OF status",
                "NEW.id",
                "NEW.status = 'succeeded' AND OLD.status <> 'succeeded'",
            ),
        )
        c = self.target.concurrency
        connector = PsycopgConnector(conninfo=self.target.dsn, min_size=c + 2, max_size=c + 2)
        app = App(connector=connector)

        async def noop(text: str) -> None:
            self.handled += 1

        task = app.task(name="noop")(noop)

        async def submit(index: int) -> str:
            return str(await task.defer_async(text=job_input(index)["text"]))

        async with app.open_async():
            await connector.pool.wait(timeout=30.0)
            worker = asyncio.create_task(
                app.run_worker_async(concurrency=c, wait=True, install_signal_handlers=False)
            )
            try:
                async with DoneListener(self.target.dsn) as listener:
                    return await paced_latencies(jobs, rate, submit, listener)
            finally:
                # Cancelling is procrastinate's way to stop a worker from code.
                worker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await worker

    async def verify(self, total_jobs: int, measured_jobs: int) -> dict[str, Any]:
        async with await psycopg.AsyncConnection.connect(self.target.dsn, autocommit=True) as conn:
            rows = await (
                await conn.execute(
                    "SELECT status::text, count(*) FROM procrastinate_jobs GROUP BY 1"
                )
            ).fetchall()
        statuses = {str(status): int(count) for status, count in rows}
        return {
            "jobs by status": statuses,
            "handler calls": self.handled,
            "ok": statuses == {"succeeded": total_jobs} and self.handled == measured_jobs,
        }


BASELINE_SCHEMA = """
CREATE TABLE bench_job (
    id bigserial PRIMARY KEY,
    payload jsonb NOT NULL,
    claimed_at timestamptz,
    checkpoints jsonb NOT NULL DEFAULT '[]'
);
CREATE INDEX bench_job_unclaimed ON bench_job (id) WHERE claimed_at IS NULL;
-- The durable-step rows' outbox, indexed as the product's is.
CREATE TABLE bench_event (
    id bigserial PRIMARY KEY,
    job_id bigint NOT NULL,
    payload bytea NOT NULL,
    status text NOT NULL DEFAULT 'PENDING'
);
CREATE INDEX bench_event_pending ON bench_event (id) WHERE status = 'PENDING';
CREATE INDEX bench_event_job ON bench_event (job_id, id);
"""
BASELINE_ENQUEUE = "INSERT INTO bench_job (payload) VALUES (%s)"
BASELINE_CLAIM = """
UPDATE bench_job SET claimed_at = now()
 WHERE id = (SELECT id FROM bench_job WHERE claimed_at IS NULL
              ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id, payload
"""
BASELINE_COMPLETE = "DELETE FROM bench_job WHERE id = %s"
# The least a queue that makes each step durable before the next, with an
# event of each commit point in the same transaction, can write: a step's
# answer onto the job's row and its event, in one autocommit statement; the
# completion deletes the row and writes the last step's event and its own.
BASELINE_CHECKPOINT = """
WITH step AS (
    UPDATE bench_job SET checkpoints = checkpoints || %(answer)s WHERE id = %(id)s RETURNING id
)
INSERT INTO bench_event (job_id, payload) SELECT id, %(event)s FROM step
"""
BASELINE_COMPLETE_WITH_EVENTS = """
WITH done AS (DELETE FROM bench_job WHERE id = %(id)s RETURNING id)
INSERT INTO bench_event (job_id, payload)
SELECT id, %(event)s FROM done UNION ALL SELECT id, %(event)s FROM done
"""
BASELINE_STEPS = 3
# About the size of the product's STEP_CHECKPOINT event.
BASELINE_EVENT = bytes(256)


class BaselineQueue:
    """The floor: one statement to enqueue, one to claim, one to complete, all autocommit.

    With ``durable_steps``, the floor under the two conditions of the
    performance goals: every step's answer is committed, and waits for its WAL
    flush, before the next step starts (the last one with the completion), and
    every commit point writes its events in the same transaction. The claim,
    which publishes nothing, does not wait for its flush (as the product's does
    not). Three durable commits in a row per job, no engine, one connection per
    runner so that Postgres groups their flushes.
    """

    def __init__(self, target: Target, *, durable_steps: bool = False) -> None:
        self.target = target
        self.durable_steps = durable_steps
        self.settings = {
            "driver": "psycopg (async)",
            "connections": target.concurrency * (2 if durable_steps else 1),
            "claim": "1 job per statement"
            + (", its commit not waiting for the WAL flush" if durable_steps else ""),
        }
        if durable_steps:
            self.settings["steps"] = (
                f"{BASELINE_STEPS}, each answer and its {len(BASELINE_EVENT)}-byte event "
                "committed before the next starts, the last with the DELETE"
            )
        self.handled = 0

    async def setup(self) -> None:
        async with await psycopg.AsyncConnection.connect(self.target.dsn, autocommit=True) as conn:
            await conn.execute(BASELINE_SCHEMA)

    async def run(self, jobs: int, phase: str) -> Phase:
        from psycopg.types.json import Jsonb

        self.handled = 0
        producers = [
            await psycopg.AsyncConnection.connect(self.target.dsn, autocommit=True)
            for _ in range(self.target.concurrency)
        ]
        payloads = [Jsonb(job_input(index)) for index in range(jobs)]
        opened: list[psycopg.AsyncConnection[Any]] = []

        async def producer(conn: psycopg.AsyncConnection[Any], indexes: Iterator[int]) -> None:
            for index in indexes:
                await conn.execute(BASELINE_ENQUEUE, (payloads[index],))

        try:
            watch = Stopwatch()
            indexes = iter(range(jobs))
            await asyncio.gather(*(producer(conn, indexes) for conn in producers))
            watch.enqueued()
            await self.drain(opened)
            watch.drained()
        finally:
            for conn in (*producers, *opened):
                await conn.close()
        return watch.phase(self.handled)

    async def connect(
        self, opened: list[psycopg.AsyncConnection[Any]], *, flush_wait: bool = True
    ) -> psycopg.AsyncConnection[Any]:
        """A connection for the drain, closed with the run's; without ``flush_wait``
        its commits do not wait for their WAL flush."""
        options = "" if flush_wait else "-c synchronous_commit=off"
        conn = await psycopg.AsyncConnection.connect(
            self.target.dsn, autocommit=True, options=options
        )
        opened.append(conn)
        return conn

    async def drain(self, opened: list[psycopg.AsyncConnection[Any]]) -> None:
        from psycopg.types.json import Jsonb

        answer = Jsonb([{"answer": "ok"}])

        async def consumer() -> None:
            # Connecting is part of starting a worker, as it is for every other row.
            conn = await self.connect(opened)
            claims = await self.connect(opened, flush_wait=False) if self.durable_steps else conn
            while True:
                row = await (await claims.execute(BASELINE_CLAIM)).fetchone()
                if row is None:
                    return  # nothing left that another consumer is not already holding
                if self.durable_steps:
                    point = {"id": row[0], "answer": answer, "event": BASELINE_EVENT}
                    for _ in range(BASELINE_STEPS - 1):
                        await conn.execute(BASELINE_CHECKPOINT, point)
                    await conn.execute(BASELINE_COMPLETE_WITH_EVENTS, point)
                else:
                    await conn.execute(BASELINE_COMPLETE, (row[0],))
                self.handled += 1

        await asyncio.gather(*(consumer() for _ in range(self.target.concurrency)))

    async def paced(self, jobs: int, rate: float) -> dict[str, float]:
        # A consumer that finds the queue empty stops: the bare queue has no
        # wake-up to wait on, so it has no paced latency to speak of.
        return {}

    async def verify(self, total_jobs: int, measured_jobs: int) -> dict[str, Any]:
        async with await psycopg.AsyncConnection.connect(self.target.dsn, autocommit=True) as conn:
            row = await (await conn.execute("SELECT count(*) FROM bench_job")).fetchone()
        left = int(row[0]) if row else -1
        return {
            "jobs left": left,
            "handler calls": self.handled,
            "ok": left == 0 and self.handled == measured_jobs,
        }


BASELINE_CLAIM_BATCH = """
UPDATE bench_job SET claimed_at = now()
 WHERE id IN (SELECT id FROM bench_job WHERE claimed_at IS NULL
              ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED)
RETURNING id, payload
"""
# Every runner's next commit point in one statement and one commit: a step's
# answer onto the rows that have steps left, the completion (DELETE) for the
# rows whose last step it was.
BASELINE_GATHERED_WRITE = """
WITH point AS (SELECT * FROM unnest(%s::bigint[], %s::bool[]) AS t(id, last)),
step AS (
    UPDATE bench_job b SET checkpoints = b.checkpoints || %s
      FROM point WHERE b.id = point.id AND NOT point.last
    RETURNING b.id
),
done AS (
    DELETE FROM bench_job b USING point WHERE b.id = point.id AND point.last RETURNING b.id
)
INSERT INTO bench_event (job_id, payload)
SELECT id, %s FROM step
UNION ALL SELECT id, %s FROM done
UNION ALL SELECT id, %s FROM done
"""


class GatheredSteps(BaselineQueue):
    """The durable-step floor with the product's batching and none of its rows.

    Claims of up to ``CLAIM_AHEAD`` jobs whenever that many more fit beside the
    jobs in hand, their commits not waiting for the WAL flush; then, per job,
    three commit points in a row (two step answers, then the completion with
    the third), each awaited before the next. One writer gathers every commit
    point that is ready into one statement and one durable commit, and sends
    the next as soon as the previous returns. Each commit point writes its
    events (``BASELINE_EVENT``, the completion two) in the same statement. A
    job row of one ``bigserial`` and three other columns, no attempt rows, no
    engine.
    """

    def __init__(self, target: Target) -> None:
        super().__init__(target, durable_steps=True)
        self.settings = {
            "driver": "psycopg (async)",
            "runners": target.concurrency,
            "claim batch": CLAIM_AHEAD,
            "commit points": "gathered by one writer, flushed as soon as the previous returns",
            "events": f"{len(BASELINE_EVENT)} bytes each, in the commit point's statement",
        }

    async def drain(self, opened: list[psycopg.AsyncConnection[Any]]) -> None:
        from psycopg.types.json import Jsonb

        c = self.target.concurrency
        answer = Jsonb([{"answer": "ok"}])
        claims = await self.connect(opened, flush_wait=False)
        writes = await self.connect(opened)
        claimed: asyncio.Queue[int | None] = asyncio.Queue()
        room = asyncio.Semaphore(c + CLAIM_AHEAD)
        pending: list[tuple[int, bool, asyncio.Future[None]]] = []
        ready = asyncio.Event()

        async def claimer() -> None:
            while True:
                for _ in range(CLAIM_AHEAD):
                    await room.acquire()
                rows = await (await claims.execute(BASELINE_CLAIM_BATCH, (CLAIM_AHEAD,))).fetchall()
                for _ in range(CLAIM_AHEAD - len(rows)):
                    room.release()
                for row in rows:
                    claimed.put_nowait(int(row[0]))
                if not rows:
                    for _ in range(c):
                        claimed.put_nowait(None)
                    return

        async def writer() -> None:
            while True:
                await ready.wait()
                ready.clear()
                batch = pending[:]
                del pending[:]
                try:
                    await writes.execute(
                        BASELINE_GATHERED_WRITE,
                        (
                            [job for job, _, _ in batch],
                            [last for _, last, _ in batch],
                            answer,
                            *(BASELINE_EVENT,) * 3,
                        ),
                    )
                except BaseException as exc:
                    for _, _, done in batch:
                        done.set_exception(exc)
                    raise
                for _, _, done in batch:
                    done.set_result(None)
                if pending:
                    ready.set()

        async def commit(job: int, last: bool) -> None:
            done = asyncio.get_running_loop().create_future()
            pending.append((job, last, done))
            ready.set()
            await done

        async def runner() -> None:
            while (job := await claimed.get()) is not None:
                for step in range(1, BASELINE_STEPS + 1):
                    await commit(job, step == BASELINE_STEPS)
                self.handled += 1
                room.release()

        write_task = asyncio.create_task(writer())
        try:
            await asyncio.gather(claimer(), *(runner() for _ in range(c)))
        finally:
            write_task.cancel()


def make_system(key: str, target: Target) -> System:
    if key.startswith("workflow-jobs"):
        spec = BY_KEY[key]
        return WorkflowJobs(target, kafka=spec.kafka, env=spec.env)
    if key == "pgqueuer":
        return PgQueuerPeer(target)
    if key == "procrastinate":
        return ProcrastinatePeer(target)
    if key == "baseline":
        return BaselineQueue(target)
    if key == "baseline-steps":
        return BaselineQueue(target, durable_steps=True)
    if key == "baseline-gathered":
        return GatheredSteps(target)
    if key == "store-alone":
        return StoreAlone(target)
    raise ValueError(f"unknown system {key!r}")


# --------------------------------------------------------------------------- the child


async def child_main(args: argparse.Namespace) -> ChildResult:
    target = Target(
        dsn=args.dsn,
        admin_dsn=args.admin_dsn,
        database=str(psycopg.conninfo.conninfo_to_dict(args.dsn)["dbname"]),
        concurrency=args.concurrency,
        postmaster_pid=args.postmaster_pid,
        kafka_bootstrap=args.kafka_bootstrap,
        kafka_pid=args.kafka_pid,
        topic_prefix=args.topic_prefix,
    )
    system = make_system(args.child, target)
    await system.setup()
    warm = await system.run(args.warmup, "warmup")
    if warm.handled != args.warmup:
        raise RuntimeError(f"warm-up handled {warm.handled} of {args.warmup} jobs")
    quiesce(target, vacuum=True)
    reset_statements(target)
    before = read_counters(target)
    measured = await system.run(args.jobs, "measured")
    quiesce(target, vacuum=False)
    after = read_counters(target)
    top = top_statements(target, args.top_statements) if args.top_statements else []
    checks = await system.verify(args.warmup + args.jobs, args.jobs)
    # After every counter is read: the paced phase's trigger and listener are
    # not part of the measured run.
    paced = await system.paced(args.paced_jobs, args.paced_rate) if args.paced_jobs else {}

    def delta(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else b - a

    statements = delta(before.statements, after.statements)
    return ChildResult(
        system=args.child,
        jobs=args.jobs,
        warmup_jobs=args.warmup,
        enqueue_s=measured.enqueue_s,
        drain_s=measured.drain_s,
        cpu_s=measured.cpu_s,
        commits=after.commits - before.commits,
        statements=None if statements is None else int(statements),
        postgres_cpu_s=delta(before.postgres_cpu_s, after.postgres_cpu_s),
        kafka_cpu_s=delta(before.kafka_cpu_s, after.kafka_cpu_s),
        wal_bytes=wal_bytes(target, before.wal_lsn, after.wal_lsn),
        write_xacts=after.next_xid - before.next_xid,
        drain_cpu_s=measured.drain_cpu_s,
        verified=bool(checks.get("ok")) and measured.handled == args.jobs,
        checks=checks,
        settings=system.settings,
        top_statements=top,
        paced=paced,
    )


def run_child(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    result = asyncio.run(child_main(args))
    print(RESULT_PREFIX + json.dumps(asdict(result)), flush=True)
    return 0


# --------------------------------------------------------------------------- the parent


def machine_summary() -> str:
    cores = os.cpu_count() or 0
    memory = ""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = f", {int(line.split()[1]) / 1024 / 1024:.0f} GiB"
    return (
        f"{cores} cores{memory}, {platform.system()} {platform.machine()}, "
        f"Python {platform.python_version()}"
    )


def server_version(admin_dsn: str) -> str:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]).split()[0] if row else "?"


def enable_statements(admin_dsn: str, *, create: bool) -> bool:
    """Whether statement counts can be read; ``create`` only on a server we started."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        try:
            if create:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("SELECT 1 FROM pg_stat_statements LIMIT 1")
        except psycopg.Error:
            return False
    return True


def missing_package(spec: SystemSpec) -> str:
    """Why this row cannot run here, or "" when it can."""
    if spec.needs is not None and importlib.util.find_spec(spec.needs) is None:
        return f"{spec.needs} is not installed (pip install -e '.[bench]')"
    from dataclasses import fields

    from streams.settings import Settings

    known = {str(f.metadata.get("env")) for f in fields(Settings)}
    for name, _ in spec.env:
        if name not in known:
            return f"this version of the worker has no {name} setting"
    return ""


def spawn_child(
    spec: SystemSpec,
    *,
    dsn: str,
    admin_dsn: str,
    args: argparse.Namespace,
    postmaster_pid: int | None,
    kafka: ApacheKafkaService | None,
    workdir: Path,
) -> ChildResult:
    log_path = workdir / f"{spec.key}.log"
    argv = [
        sys.executable,
        "-m",
        "benchmarks.peers",
        "--child",
        spec.key,
        "--dsn",
        dsn,
        "--admin-dsn",
        admin_dsn,
        "--jobs",
        str(args.jobs),
        "--concurrency",
        str(args.concurrency),
        "--warmup",
        str(args.warmup),
        "--topic-prefix",
        args.topic_prefix,
        "--top-statements",
        str(args.top_statements),
        "--paced-jobs",
        str(args.paced_jobs if spec.paced else 0),
        "--paced-rate",
        str(args.paced_rate),
    ]
    if postmaster_pid is not None:
        argv += ["--postmaster-pid", str(postmaster_pid)]
    if kafka is not None:
        argv += ["--kafka-bootstrap", kafka.bootstrap_servers]
        if kafka.pid is not None:
            argv += ["--kafka-pid", str(kafka.pid)]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL
        )
        try:
            stdout, _ = process.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            process.kill()  # this child only, by its own handle
            process.wait()
            raise RuntimeError(
                f"{spec.label} did not finish within {args.timeout:.0f} s; log: {log_path}"
            ) from None
    if process.returncode != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-25:])
        raise RuntimeError(f"{spec.label} exited with {process.returncode}:\n{tail}")
    for line in reversed(stdout.decode(errors="replace").splitlines()):
        if line.startswith(RESULT_PREFIX):
            data = json.loads(line[len(RESULT_PREFIX) :])
            return ChildResult(**data)
    raise RuntimeError(f"{spec.label} printed no result; log: {log_path}")


def settle_broker(kafka: ApacheKafkaService, console: Console) -> None:
    """Wait until a freshly started broker stops burning CPU on its own start-up.

    On two cores a JVM still compiling and creating its internal topics would
    slow whatever runs next; the measured run should compete only with the
    broker's work for it.
    """
    pid = kafka.pid
    if pid is None:
        return
    with console.status("letting Apache Kafka settle..."):
        deadline = time.monotonic() + 30.0
        previous = process_cpu_s(pid)
        while time.monotonic() < deadline:
            time.sleep(1.0)
            current = process_cpu_s(pid)
            if previous is None or current is None or current - previous < 0.05:
                return
            previous = current


def run_all(args: argparse.Namespace, console: Console) -> tuple[list[Row], dict[str, str]]:
    specs = [BY_KEY[key] for key in args.only] if args.only else list(SYSTEMS)
    rows = [Row(spec, skipped=missing_package(spec)) for spec in specs]
    workdir = Path(tempfile.mkdtemp(prefix="wfjobs-peers-"))
    external_db = bool(os.environ.get("DATABASE_URL"))
    server_settings = {} if args.fast_postgres else dict(DURABLE_SETTINGS)
    server_settings.update(STATEMENT_SETTINGS)
    postgres = PostgresService(settings=None if external_db else server_settings)
    kafka: ApacheKafkaService | None = None
    # Anything else running on the machine shows up in every number here.
    facts: dict[str, str] = {"load before": _load_average()}
    try:
        with console.status("starting Postgres..."):
            postgres.start()
        admin_dsn = postgres.dsn
        statements = enable_statements(admin_dsn, create=not external_db)
        durability = (
            "test settings (fsync off, synchronous_commit off)"
            if args.fast_postgres
            else "durable (fsync on, synchronous_commit on)"
        )
        facts["postgres"] = f"PostgreSQL {server_version(admin_dsn)}, " + (
            "DATABASE_URL (its own settings)" if external_db else f"embedded, {durability}"
        )
        facts["statements"] = "pg_stat_statements (top level)" if statements else "not loaded"
        postmaster_pid = None if external_db else postgres.pid
        # Rounds interleave the systems, so a slow spell of the machine hits
        # all of them rather than one. The broker only runs for the rows that
        # use it, so it takes no CPU from the others; those rows go last.
        schedule = [
            (round_, row)
            for group in (False, True)
            for round_ in range(1, args.repeat + 1)
            for row in rows
            if row.spec.kafka == group
        ]
        for round_, row in schedule:
            if row.skipped or row.failed:
                continue
            if row.spec.kafka and kafka is None:
                kafka = ApacheKafkaService()
                try:
                    with console.status("starting Apache Kafka..."):
                        kafka.start()
                except ServiceError as exc:
                    kafka = None
                    for other in rows:
                        if other.spec.kafka:
                            other.skipped = f"Apache Kafka could not start: {exc}"
                    continue
                settle_broker(kafka, console)
                facts["kafka"] = (
                    "KAFKA_BOOTSTRAP_SERVERS"
                    if kafka.external
                    else "Apache Kafka (own, KRaft, one node), started for its rows only"
                )
            console.print(f"round {round_}/{args.repeat}: [bold]{row.spec.label}[/]...")
            dsn = postgres.create_database(row.spec.key.replace("-", "_"))
            child_args = argparse.Namespace(
                **{**vars(args), "topic_prefix": f"bench-peers-{uuid.uuid4().hex[:8]}"}
            )
            try:
                if row.spec.kafka:
                    assert kafka is not None
                    from devstack.stack import ensure_topics

                    # Made up front, so no run waits for auto-creation.
                    ensure_topics(
                        kafka.bootstrap_servers,
                        [f"{child_args.topic_prefix}-warmup", f"{child_args.topic_prefix}-events"],
                        partitions=args.partitions,
                    )
                result = spawn_child(
                    row.spec,
                    dsn=dsn,
                    admin_dsn=admin_dsn,
                    args=child_args,
                    postmaster_pid=postmaster_pid,
                    kafka=kafka if row.spec.kafka else None,
                    workdir=workdir,
                )
                row.results.append(result)
                console.print(
                    f"  {jobs_per_s(result):.0f} jobs/s"
                    + ("" if result.verified else " [red]did not verify[/]")
                )
            except Exception as exc:
                row.failed = str(exc)
                console.print(f"[red]{row.spec.label} failed[/]: {escape(str(exc))}")
            finally:
                # A finished system's tables must not be vacuumed during the next one's run.
                with contextlib.suppress(psycopg.Error):
                    postgres.drop_database(dsn)
    finally:
        if kafka is not None:
            kafka.stop()
        postgres.stop()
    facts["load after"] = _load_average()
    return rows, facts


def _load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f} (1, 5, 15 min)"


# --------------------------------------------------------------------------- output


def _ms(seconds: float | None, jobs: int) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000 / jobs:.2f}"


def render(
    rows: list[Row], facts: dict[str, str], args: argparse.Namespace, console: Console
) -> None:
    console.print(
        f"[bold]peers[/]: {args.jobs} jobs per run (after a {args.warmup}-job warm-up), "
        f"concurrency {args.concurrency} everywhere, median of {args.repeat} run(s) per system, "
        f"{dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}"
    )
    console.print(
        f"machine: {machine_summary()}; every core shared between Postgres, "
        "Kafka (its row only) and the Python side, so no number here is a per-core figure"
    )
    for name in ("postgres", "statements", "kafka"):
        if name in facts:
            console.print(f"{name}: {facts[name]}")
    before, after = facts.get("load before", "?"), facts.get("load after", "?")
    console.print(f"load average: {before} before, {after} after")
    if args.paced_jobs:
        console.print(
            f"paced: {args.paced_jobs} jobs at {args.paced_rate:.0f}/s per run with the worker "
            "already running, from each job's arrival slot until its completion commits "
            "(a NOTIFY from a trigger, delivered after the commit's WAL flush)"
        )
    done = [row for row in rows if row.result is not None]
    wfjobs = next((row for row in done if row.spec.key == "workflow-jobs"), None)
    peers = [row for row in done if row.spec.peer]
    fastest = max(peers, key=lambda row: row.jobs_per_s, default=None)

    def ratio(value: float | None, base: float | None) -> str:
        return "n/a" if value is None or not base else f"{value / base:.2f}"

    def paced(r: ChildResult, name: str) -> str:
        return f"{r.paced[name]:.1f}" if name in r.paced else "n/a"

    base = wfjobs.result if wfjobs else None
    speed = Table(title="throughput and latency")
    for title in (
        "system",
        "jobs",
        "enqueue s",
        "drain s",
        "drain jobs/s",
        "x wfjobs",
        "end-to-end jobs/s",
        "x wfjobs",
        "range",
        "x fastest peer",
        "paced p50 ms",
        "p95 ms",
        "p99 ms",
    ):
        speed.add_column(title, justify="left" if title == "system" else "right")
    cost = Table(title="cost per job")
    for title in (
        "system",
        "commits",
        "write xacts",
        "statements",
        "WAL KiB",
        "Python CPU ms",
        "of it in the drain",
        "Python busy in the drain",
        "Postgres CPU ms",
        "all CPU ms",
        "x wfjobs",
    ):
        cost.add_column(title, justify="left" if title == "system" else "right")
    for row in rows:
        if row.result is None:
            speed.add_row(f"{row.spec.label} (not run, see below)", *["-"] * 12)
            cost.add_row(f"{row.spec.label} (not run)", *["-"] * 10)
            continue
        r = row.result
        verified = all(result.verified for result in row.results)
        label = row.spec.label + ("" if verified else " [red](UNVERIFIED)[/]")
        speed.add_row(
            label,
            str(r.jobs),
            f"{r.enqueue_s:.2f}",
            f"{r.drain_s:.2f}",
            f"{drain_jobs_per_s(r):.0f}",
            ratio(drain_jobs_per_s(r), drain_jobs_per_s(base) if base else None),
            f"{row.jobs_per_s:.0f}",
            ratio(row.jobs_per_s, wfjobs.jobs_per_s if wfjobs else None),
            row.spread,
            ratio(row.jobs_per_s, fastest.jobs_per_s if fastest else None),
            paced(r, "p50"),
            paced(r, "p95"),
            paced(r, "p99"),
        )
        all_cpu = total_cpu_s(r)
        cost.add_row(
            label,
            f"{r.commits / r.jobs:.2f}",
            f"{r.write_xacts / r.jobs:.2f}",
            "n/a" if r.statements is None else f"{r.statements / r.jobs:.2f}",
            f"{r.wal_bytes / 1024 / r.jobs:.1f}",
            _ms(r.cpu_s, r.jobs),
            _ms(r.drain_cpu_s, r.jobs),
            f"{r.drain_cpu_s / max(r.drain_s, 1e-9):.0%}",
            _ms(r.postgres_cpu_s, r.jobs),
            _ms(all_cpu, r.jobs),
            ratio(all_cpu, total_cpu_s(base) if base else None),
        )
    console.print(speed)
    console.print(cost)
    for row in rows:
        if row.result is not None and row.result.kafka_cpu_s is not None:
            console.print(
                f"{row.spec.label}: the Kafka broker used another "
                f"{_ms(row.result.kafka_cpu_s, row.result.jobs)} CPU ms/job"
            )
    for row in rows:
        if row.result is not None:
            settings = ", ".join(f"{k} {v}" for k, v in row.result.settings.items())
            console.print(f"[dim]{row.spec.label}: {escape(settings)}[/]")
    for row in rows:
        if row.result is not None and row.result.top_statements:
            console.print(f"[bold]{row.spec.label}[/]: statements with the most server time")
            for entry in row.result.top_statements:
                console.print(
                    f"  {entry['total_ms']:>9.1f} ms  {entry['calls']:>7} calls "
                    f"{entry['mean_ms']:>8.3f} ms/call  {escape(entry['query'])}"
                )
    for row in rows:
        if row.skipped or row.failed:
            why = escape(row.skipped or row.failed)
            console.print(f"[yellow]{row.spec.label} not run[/]: {why}")
        for result in row.results:
            if not result.verified:
                console.print(
                    f"[red]{row.spec.label} did not verify[/]: {escape(str(result.checks))}"
                )
    if wfjobs is not None and fastest is not None:
        for row in done:
            if row.spec.key.startswith("workflow-jobs"):
                console.print(
                    f"{row.spec.label}: {row.jobs_per_s:.0f} jobs/s = "
                    f"{row.jobs_per_s / fastest.jobs_per_s:.2f} x the fastest peer "
                    f"({fastest.spec.label}, {fastest.jobs_per_s:.0f} jobs/s)"
                )


def as_json(rows: list[Row], facts: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    return {
        "jobs": args.jobs,
        "concurrency": args.concurrency,
        "warmup": args.warmup,
        "repeat": args.repeat,
        "machine": machine_summary(),
        "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        **facts,
        "rows": [
            {
                "system": row.spec.label,
                "skipped": row.skipped,
                "failed": row.failed,
                "jobs_per_s": row.jobs_per_s if row.result else None,
                "median": asdict(row.result) if row.result else None,
                "runs": [asdict(result) for result in row.results],
            }
            for row in rows
        ],
    }


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.peers",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--jobs", type=int, default=2000, help="measured jobs per system")
    parser.add_argument(
        "--concurrency", type=int, default=16, help="enqueue callers and worker slots, for all"
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs per system; the median run is shown"
    )
    parser.add_argument(
        "--warmup", type=int, default=0, help="warm-up jobs per system (0: a tenth of --jobs)"
    )
    parser.add_argument(
        "--only",
        nargs="+",
        choices=[spec.key for spec in SYSTEMS],
        help="run only these systems",
    )
    parser.add_argument(
        "--fast-postgres",
        action="store_true",
        help="embedded Postgres with the test settings (fsync and synchronous_commit off)",
    )
    parser.add_argument("--partitions", type=int, default=3, help="partitions of the events topic")
    parser.add_argument(
        "--timeout", type=float, default=1200.0, help="seconds one system may take in all"
    )
    parser.add_argument(
        "--top-statements",
        type=int,
        default=0,
        metavar="K",
        help="also list each system's K statements with the most server time",
    )
    parser.add_argument(
        "--paced-jobs",
        type=int,
        default=500,
        help="jobs of the paced latency phase per run (0: no paced phase)",
    )
    parser.add_argument(
        "--paced-rate",
        type=float,
        default=100.0,
        help="arrivals per second in the paced phase, the same for every system",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    # The child side: one system, in its own process.
    parser.add_argument("--child", choices=[spec.key for spec in SYSTEMS], help=argparse.SUPPRESS)
    parser.add_argument("--dsn", help=argparse.SUPPRESS)
    parser.add_argument("--admin-dsn", help=argparse.SUPPRESS)
    parser.add_argument("--postmaster-pid", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--kafka-bootstrap", default="", help=argparse.SUPPRESS)
    parser.add_argument("--kafka-pid", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--topic-prefix", default="bench-peers", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.concurrency < 1 or args.repeat < 1 or args.warmup < 0:
        parser.error("--jobs, --concurrency and --repeat must be positive, --warmup not negative")
    if args.paced_jobs < 0 or args.paced_rate <= 0:
        parser.error("--paced-jobs must not be negative and --paced-rate must be positive")
    if args.warmup == 0:
        args.warmup = max(100, args.jobs // 10)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return run_child(args)
    # Wide enough for the table when the output goes to a file or a pipe.
    console = Console(stderr=args.json, width=None if sys.stdout.isatty() else 200)
    rows, facts = run_all(args, console)
    if args.json:
        print(json.dumps(as_json(rows, facts, args), indent=2))
    else:
        render(rows, facts, args, console)
    # Not finishing, or finishing wrong, is a failure; being slower is only a number.
    broken = [
        row for row in rows if row.failed or not all(result.verified for result in row.results)
    ]
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
