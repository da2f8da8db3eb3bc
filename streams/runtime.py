"""What one process holds for its whole life: pool, stores, engine cache, loops.

``Runtime`` is a mode ``Service`` the Faust app starts and stops. It opens the
connection pool (applying migrations first only when ``WFJOBS_AUTO_MIGRATE``
is on), builds the stores, and starts whichever loops the process's roles ask
for: the claim loops, the sweeper and retention for ``worker``, the outbox relay for
``relay``, and one LISTEN connection that wakes whichever of them run here. A
process that leases (``worker`` or ``relay``) first takes its worker id
(``streams.identity``), and refuses to run while another live process has it.
Every loop is a mode service and a child of this one: started in ``on_start``
once the pool is open, stopped in the reverse order (the claim loops first, so
a running segment can still checkpoint while it finishes), and the pool is
closed only after the last of them has stopped. A loop that crashes crashes
the app with it, and the worker process exits non-zero.

A process without ``DATABASE_URL`` still runs: the verbs answer UNAVAILABLE
and no loop starts.

With ``WFJOBS_METRICS`` on, the runtime also owns the process's metrics
(``streams.metrics``): their registry, the event-loop probe (its first child,
so it stops last) and the database read behind the fleet's figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal
from uuid import UUID

import mode

from schemas.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from schemas.verdicts import StepVerdict
from store.channels import JOBS_QUEUED_CHANNEL, OUTBOX_CHANNEL
from store.control import ControlStore
from store.dead_letters import OutboxDeadLetters
from store.definitions import DefinitionStore
from store.errors import is_outage
from store.fleet import FleetStore
from store.job_feed import JobFeed
from store.migrate import migrate
from store.outbox import RELAY_SESSION, Outbox
from store.pool import Pool, create_pool, ping
from store.progress import ProgressStore
from store.records import Job, StepVerifier
from store.retention import RetentionStore
from store.run_sql import CLAIM_SESSION
from store.runs import RunStore
from store.tokens import TokenStore
from store.worker_ids import WorkerIdLock
from streams import logs
from streams.admission import Admission
from streams.claims import ClaimLoops
from streams.fleet import FleetOverview
from streams.fleet_metrics import FleetGauges
from streams.health import HealthReport, HealthSource, PartHealth, report
from streams.identity import WorkerIdentity
from streams.listener import Listener
from streams.loop_lag import LoopLagProbe
from streams.metrics import (
    Metrics,
    claim_families,
    counter,
    relay_families,
    sweeper_families,
)
from streams.progress import ProgressRecorder
from streams.retention import RetentionLoop
from streams.settings import Settings
from streams.sweeper import Sweeper
from streams.tracing import Tracing
from streams.watch import JobWatch
from workflows.cache import DefinitionCache
from workflows.checker import shared_checker
from workflows.failures import StepFailure
from workflows.invokers import (
    GrpcChannels,
    HandlerRegistry,
    default_registry,
    load_handler_modules,
)
from workflows.steps import CompiledWorkflow

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from prometheus_client.metrics_core import Metric

    from streams.relay import OutboxRelay

log = logging.getLogger(__name__)

# How long /healthz and /readyz wait for the store in all: a probe must answer
# in time even when the server went silent, which TCP notices hours later.
STORE_CHECK_S = 2.0


class Runtime(mode.Service):
    """The store side of a process, started and stopped with the Faust app."""

    def __init__(
        self,
        settings: Settings,
        *,
        registry: HandlerRegistry | None = None,
        cache: DefinitionCache | None = None,
        tracing: Tracing | None = None,
        **kwargs: Any,
    ) -> None:
        """``tracing``: the spans' tracer (tests hand in their own provider's);
        by default one built from the settings when ``WFJOBS_TRACING=on``."""
        super().__init__(**kwargs)
        self.settings = settings
        # None when tracing is off: every span site tests this and does nothing more.
        if tracing is None and settings.tracing_enabled:
            tracing = Tracing.from_settings(settings.worker_id, settings.tracing_exporter)
        self.tracing = tracing
        # Handler modules register into the engine's default registry unless a
        # test hands in its own.
        self.registry = registry if registry is not None else default_registry
        # Snapshots were checked in full (rules probed, in the checker's child
        # process) when submitted or stored; a claim only compiles them.
        self.cache = (
            cache
            if cache is not None
            else DefinitionCache(limits=settings.rule_limits(), probe=False)
        )
        self.checker = shared_checker(settings.rule_limits(), settings.compile_timeout_s)
        self.target_policy = settings.target_policy()
        self.channels = GrpcChannels(
            policy=self.target_policy,
            tls=settings.target_tls(),
            max_channels=settings.step_channels_max,
        )
        self.pool: Pool | None = None
        self.claim_pool: Pool | None = None
        self.relay_pool: Pool | None = None
        self.commit_pool: Pool | None = None
        self.submit_pool: Pool | None = None
        self.runs: RunStore | None = None
        self.definitions: DefinitionStore | None = None
        self.tokens: TokenStore | None = None
        self.outbox: Outbox | None = None
        self.dead_letters: OutboxDeadLetters | None = None
        self.control: ControlStore | None = None
        # The id written into lease_owner (the jobs' and the relay's) is this
        # process's alone, before anything leases under it.
        self._worker_id_lock = (
            WorkerIdLock(settings.database_url, settings.worker_id)
            if settings.store_configured
            and settings.worker_id
            and settings.roles & {"worker", "relay"}
            else None
        )
        self.identity: WorkerIdentity | None = None
        self.listener: Listener | None = None
        self.claims: ClaimLoops | None = None
        self.sweeper: Sweeper | None = None
        self.retention: RetentionLoop | None = None
        self.relay: OutboxRelay | None = None
        self.progress: ProgressRecorder | None = None
        self.watch: JobWatch | None = None
        self.fleet: FleetOverview | None = None
        self.admission = Admission(settings.max_queued_jobs)
        # None with WFJOBS_METRICS=off: no instrument exists, nothing is observed.
        self.metrics = Metrics() if settings.metrics_enabled else None
        self.add_metrics_reading(self._loop_families)
        self._ready = asyncio.Event()
        self._handlers_loaded = False
        # Parts outside the runtime (the request agent, the broker connection)
        # add themselves here; see ``health_report``.
        self._health_sources: list[HealthSource] = []
        self._store_check: asyncio.Future[Literal["ok", "busy"]] | None = None
        self._store_check_began = 0.0

    # ------------------------------------------------------------------ lifecycle

    def load_handlers(self) -> None:
        """Import ``WFJOBS_HANDLERS`` once; an import error names the module."""
        if self._handlers_loaded:
            return
        self._handlers_loaded = True
        if self.settings.handler_modules:
            modules = load_handler_modules(self.settings.handler_modules, self.registry)
            log.info("handler modules loaded: %s", ", ".join(m.__name__ for m in modules))

    async def take_worker_id(self) -> None:
        """Take this process's worker id before it starts, if it leases under one.

        ``WorkerIdTaken`` when another live process has it. A store that does
        not answer yet is no refusal: the id is taken (and a clash reported)
        once it does, before any loop leases.
        """
        if self._worker_id_lock is None:
            return
        try:
            await self._worker_id_lock.hold()
        except Exception as exc:
            if not is_outage(exc):
                raise

    async def on_start(self) -> None:
        settings = self.settings
        if self.metrics is not None:
            # First child, so it stops last: the loop's lag is watched to the end.
            await self.add_runtime_dependency(LoopLagProbe(self.metrics.loop_lag.set))
        if "api" in settings.roles and not settings.auth_enabled:
            log.warning(
                "!!! WFJOBS_AUTH=off: the HTTP verbs take no token and every caller may do "
                "everything, to every job. Never run this on a network anyone else can reach. !!!"
            )
        if "worker" in settings.roles:
            settings.require_worker_id()
            self.load_handlers()
        if not settings.store_configured:
            log.warning(
                "DATABASE_URL is not set: the verbs answer 503 UNAVAILABLE and no job runs here"
            )
            self._ready.set()
            return
        if settings.auto_migrate:
            applied = await migrate(settings.database_url)
            log.info("migrations: %s", ", ".join(applied) if applied else "up to date")
        pool = create_pool(
            settings.database_url,
            min_size=settings.pool_min_size,
            max_size=settings.pool_max_size,
            timeout_s=settings.pool_timeout_s,
            application_name=f"workflow-jobs {settings.worker_id}".strip()[:63],
        )
        # Not waiting for the first connections: a database that is briefly
        # away at boot must not keep the worker down; every loop retries.
        await pool.open(wait=False)
        self.pool = pool
        # The claimer and the relay's passes are one task each, so one
        # connection each: their own, holding their statements' settings for
        # the session (store.run_sql.CLAIM_SESSION, store.outbox.RELAY_SESSION).
        claims = "worker" in settings.roles and settings.claim_loops > 0
        if claims:
            self.claim_pool = await _session_connection(settings, "claims", CLAIM_SESSION)
        if "relay" in settings.roles:
            self.relay_pool = await _session_connection(settings, "relay", RELAY_SESSION)
        # The group commit and the grouped submits each send one statement at
        # a time; on a connection of its own each keeps one backend warm.
        if settings.group_commit and claims:
            self.commit_pool = await _session_connection(settings, "commits", {})
        if settings.group_commit and settings.roles & {"api", "worker"}:
            self.submit_pool = await _session_connection(settings, "submits", {})
        self.runs = RunStore(
            pool,
            claim_pool=self.claim_pool,
            commit_pool=self.commit_pool,
            submit_pool=self.submit_pool,
            retry_base_s=settings.retry_base_s,
            retry_max_s=settings.retry_max_s,
            default_max_attempts=settings.max_attempts,
            lease_s=settings.lease_s,
            max_event_bytes=settings.max_event_bytes,
            group_commit=settings.group_commit,
        )
        self.definitions = DefinitionStore(pool)
        self.tokens = TokenStore(pool)
        self.outbox = Outbox(
            pool,
            lease_s=settings.relay_lease_s,
            traced=self.tracing is not None,
            relay_pool=self.relay_pool,
        )
        self.dead_letters = OutboxDeadLetters(pool)
        self.control = ControlStore(pool, max_event_bytes=settings.max_event_bytes)
        fleet_store = FleetStore(pool)
        self.fleet = FleetOverview(fleet_store)
        metrics = self.metrics
        if metrics is not None:
            fleet = FleetGauges(fleet_store.read, cache_s=settings.metrics_db_cache_s)
            metrics.add_collector(fleet, fleet.refresh)
        if self._worker_id_lock is not None:
            self.identity = WorkerIdentity(
                self._worker_id_lock, check_s=settings.effective_heartbeat_s
            )
        # One LISTEN connection serves every loop of this process.
        channels = [JOBS_QUEUED_CHANNEL] if "worker" in settings.roles else []
        if "relay" in settings.roles:
            channels.append(OUTBOX_CHANNEL)
        if channels:
            self.listener = Listener(settings.database_url, *channels)
        if "api" in settings.roles:
            # Watchers share the relay's outbox notifications; without a relay
            # here they listen for themselves, only while someone watches.
            listener = self.listener
            shared = listener is not None and OUTBOX_CHANNEL in listener.channels
            self.watch = JobWatch(
                JobFeed(pool),
                wake=listener.subscribe(OUTBOX_CHANNEL) if listener and shared else None,
                dsn="" if shared else settings.database_url,
                poll_s=settings.watch_poll_s,
                max_watchers=settings.watch_max,
            )
        if "worker" in settings.roles:
            self.progress = ProgressRecorder(
                ProgressStore(pool), interval_s=settings.progress_interval_s
            )
        # No claim loops: a paused worker still sweeps (leases and deadlines)
        # and consumes the request and completion topics, but runs no job.
        if "worker" in settings.roles and settings.claim_loops > 0:
            assert self.listener is not None
            self.claims = ClaimLoops(
                self.runs,
                worker_id=settings.require_worker_id(),
                compile=self.compile_snapshot,
                compiled=self.cache.cached,
                registry=self.registry,
                loops=settings.claim_loops,
                batch=settings.claim_batch,
                poll_interval_s=settings.poll_interval_s,
                heartbeat_s=settings.effective_heartbeat_s,
                max_per_target=settings.max_concurrent_per_target,
                channels=self.channels,
                wake=self.listener.subscribe(JOBS_QUEUED_CHANNEL),
                grace_s=settings.shutdown_grace_s,
                # One statement for the last checkpoint and COMPLETED only pays
                # when that statement is the group commit's.
                hold_back_last_checkpoint=settings.group_commit,
                progress=None if self.progress is None else self.progress.report,
                tracing=self.tracing,
                timings=metrics.claims if metrics is not None else None,
            )
        if "worker" in settings.roles:
            self.sweeper = Sweeper(
                self.runs, interval_s=settings.sweep_interval_s, fallback_of=self.step_fallback
            )
            self.retention = RetentionLoop(
                RetentionStore(
                    pool, batch=settings.retention_batch, pause_s=settings.retention_pause_s
                ),
                settings.retention_policy(),
                interval_s=settings.retention_interval_s,
            )
        if "relay" in settings.roles:
            # Imported here: the relay pulls in the producer client only where it runs.
            from streams.relay import build_relay

            assert self.listener is not None
            self.relay = build_relay(
                settings,
                self.outbox,
                wake=self.listener.subscribe(OUTBOX_CHANNEL),
                registry=self.schema_registry,
                tracing=self.tracing,
                timings=metrics.relay_timings() if metrics is not None else None,
            )
        # Children stop in the reverse of this order: the claim loops first,
        # the worker id last. The pool outlives them all (on_shutdown).
        loops: tuple[mode.Service | None, ...] = (
            self.identity,
            self.listener,
            self.watch,
            self.progress,
            self.relay,
            self.retention,
            self.sweeper,
            self.claims,
        )
        for loop in loops:
            if loop is not None:
                await self.add_runtime_dependency(loop)
        self._ready.set()
        log.info(
            "runtime started: worker %s, roles %s",
            settings.worker_id,
            ", ".join(sorted(settings.roles)),
        )

    async def stop_loops(self) -> None:
        """Stop the loops that run jobs, in their stop order.

        What the agents and the verbs still need (the pool, the worker id, the
        LISTEN connection, the watchers) stops with the runtime itself, and so
        does the relay: its last pass publishes the events of the agents' last
        submits too.
        """
        for loop in (self.claims, self.sweeper, self.retention, self.progress):
            if loop is not None:
                await loop.stop()

    async def on_shutdown(self) -> None:
        # Runs after every child loop has stopped: a segment finishing in its
        # grace, a hand-back and the relay's last pass all still had the pool.
        with contextlib.suppress(Exception):
            await self.channels.close()
        if self._store_check is not None:
            self._store_check.cancel()
        pools = (self.claim_pool, self.relay_pool, self.commit_pool, self.submit_pool, self.pool)
        # Together: a store gone silent makes each close wait out its own timeout.
        await asyncio.gather(
            *(pool.close() for pool in pools if pool is not None), return_exceptions=True
        )
        if self.tracing is not None:
            # Exports what the batch processor still holds: blocking, so in a thread.
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.tracing.shutdown)
        log.info("runtime stopped")

    def install_log_format(self, root: logging.Logger) -> None:
        """Put ``WFJOBS_LOG_FORMAT`` on the handlers the worker's logging set up."""
        logs.install(
            root,
            log_format=self.settings.log_format,
            worker_id=self.settings.worker_id,
            trace_ids=self.tracing.current_ids if self.tracing is not None else None,
        )

    async def wait_ready(self) -> None:
        await self._ready.wait()

    # ------------------------------------------------------------------ metrics

    def add_metrics_reading(self, read: Callable[[], Iterable[Metric]]) -> None:
        """Export what ``read`` builds at every scrape; nothing when metrics are off."""
        if self.metrics is not None:
            self.metrics.add_reading(read)

    def _loop_families(self) -> Iterator[Metric]:
        """The counters the loops running here keep in memory, read as a scrape asks."""
        yield counter("wfjobs_admission_rejections_total", self.admission.rejections)
        if self.claims is not None:
            yield from claim_families(self.claims.stats)
        if self.sweeper is not None:
            yield from sweeper_families(self.sweeper)
        if self.relay is not None:
            yield from relay_families(self.relay.stats)

    async def metrics_exposition(self) -> bytes:
        """``/metrics``: the text format; ``NotFound`` with metrics off."""
        if self.metrics is None:
            raise NotFound("metrics are off here (WFJOBS_METRICS=off)")
        return await self.metrics.exposition()

    @functools.cached_property
    def schema_registry(self) -> SchemaRegistryClient | None:
        """The process's one client of ``WFJOBS_SCHEMA_REGISTRY_URL`` (``None`` without one).

        Shared by the relay and the agents, so a schema id looked up by one is
        known to the others.
        """
        return self.settings.open_registry()

    # ------------------------------------------------------------------ stores

    def _unavailable(self) -> Unavailable:
        if not self.settings.store_configured:
            return Unavailable(
                "no store is configured for this process (DATABASE_URL is not set), "
                "so it cannot read or write jobs"
            )
        return Unavailable("the store is still starting; retry in a moment")

    def require_runs(self) -> RunStore:
        if self.runs is None:
            raise self._unavailable()
        return self.runs

    def require_dead_letters(self) -> OutboxDeadLetters:
        if self.dead_letters is None:
            raise self._unavailable()
        return self.dead_letters

    def require_control(self) -> ControlStore:
        if self.control is None:
            raise self._unavailable()
        return self.control

    def require_definitions(self) -> DefinitionStore:
        if self.definitions is None:
            raise self._unavailable()
        return self.definitions

    def require_fleet(self) -> FleetOverview:
        if self.fleet is None:
            raise self._unavailable()
        return self.fleet

    def require_watch(self) -> JobWatch:
        if self.watch is None:
            raise self._unavailable()
        return self.watch

    def require_tokens(self) -> TokenStore:
        if self.tokens is None:
            raise self._unavailable()
        return self.tokens

    async def admit(self, job_id: UUID | None) -> Job | None:
        """Whether a new job may be created now (see ``streams.admission``).

        ``None`` admits it. When the backlog is at the cap, a ``job_id`` that
        names an existing job returns that job, so a repeated submit is still
        answered as one; anything else raises ``ResourceExhausted``.
        """
        runs = self.require_runs()
        try:
            await self.admission.check(runs)
        except ResourceExhausted:
            if job_id is not None:
                with contextlib.suppress(NotFound):
                    return await runs.get(job_id)
            raise
        return None

    def register_health(self, source: HealthSource) -> None:
        """Report ``source()`` in ``/healthz`` and ``/readyz`` from now on."""
        self._health_sources.append(source)

    async def health_report(self) -> HealthReport:
        """Every part running here: the store first, then each loop, then the rest."""
        parts = [await self._store_health()]
        for loop in (self.claims, self.sweeper, self.retention, self.relay):
            health = getattr(loop, "health", None)
            if callable(health):
                parts.append(health())
        parts.extend(source() for source in self._health_sources)
        return report(parts)

    async def _store_health(self) -> PartHealth:
        """Within ``STORE_CHECK_S`` whatever the server does.

        A check still in flight from an earlier probe is awaited, not doubled,
        so a server gone silent holds one connection, not one per probe.
        """
        if not self.settings.store_configured:
            return PartHealth("store", summary="not configured")
        if self.pool is None:
            return _store_down(self._unavailable().message)
        check = self._store_check
        if check is None or check.done():
            check = self._store_check = asyncio.ensure_future(
                ping(self.pool, self.settings.database_url, STORE_CHECK_S)
            )
            self._store_check_began = time.monotonic()
            # A check that outlived its probes has its error read all the same:
            # the next probe replaces it, and asyncio would log it as unretrieved.
            check.add_done_callback(_read_outcome)
        done, _ = await asyncio.wait({check}, timeout=STORE_CHECK_S)
        if not done:
            waited = time.monotonic() - self._store_check_began
            return _store_down(f"the store did not answer SELECT 1 in {waited:.0f}s")
        try:
            answer = check.result()
        except TimeoutError:
            return _store_down(f"the store did not answer SELECT 1 in {STORE_CHECK_S:.0f}s")
        except Exception as exc:
            return _store_down(f"unreachable: {type(exc).__name__}: {exc}")
        if answer == "busy":
            # Alive, so no restart; out of rotation until a connection frees up.
            return PartHealth(
                "store",
                ready=False,
                summary="busy: every connection of the pool is at work (WFJOBS_POOL_MAX)",
            )
        return PartHealth("store")

    async def check_store(self) -> str:
        """Empty when the store answers, else what is wrong (for /healthz)."""
        if not self.settings.store_configured:
            return self._unavailable().message
        health = await self._store_health()
        return "" if health.healthy and health.ready else health.summary

    # ------------------------------------------------------------------ engine

    def compile(self, envelope: Mapping[str, Any], digest: str | None = None) -> CompiledWorkflow:
        """The compiled workflow for a definition snapshot, from the process cache."""
        return self.cache.get(envelope, digest=digest or None)

    async def compile_snapshot(
        self, envelope: Mapping[str, Any], digest: str | None = None
    ) -> CompiledWorkflow:
        """``compile`` for a handler on the event loop: a snapshot this process has
        not compiled yet is compiled on a compile thread."""
        return await self.cache.get_off_loop(envelope, digest=digest or None)

    async def compile_submitted(self, envelope: Mapping[str, Any]) -> CompiledWorkflow:
        """A definition someone submits or stores, off the event loop.

        Its rules are checked in full under the time limit (see
        ``DefinitionCache.compile_checked``), and its step targets against
        ``WFJOBS_STEP_TARGETS``, before anything is written or dialled.
        """
        compiled = await self.cache.compile_checked(envelope, self.checker)
        self.target_policy.check(compiled)
        return compiled

    async def step_fallback(
        self, definition: Mapping[str, Any], digest: str, step_name: str
    ) -> Mapping[str, Any] | None:
        """The fallback response ``step_name`` declares in ``definition`` (hashed
        ``digest``), if any; a snapshot not yet compiled here is compiled on a
        compile thread.

        A snapshot that no longer compiles here, or names no such step, has
        none: its timed-out step fails the job, with the timeout as the reason.
        """
        try:
            return (await self.compile_snapshot(definition, digest)).step(step_name).fallback
        except InvalidArgument as exc:
            log.warning("step %r: no fallback can be read from its definition: %s", step_name, exc)
            return None

    def step_verifier(
        self,
        step_name: str,
        job: Job,
        *,
        parked_here: bool,
    ) -> StepVerifier:
        """The judge ``RunStore.complete_step`` calls under the row lock, for
        ``job`` as read before the lock.

        It only parses and evaluates rules (no I/O). The job's input and
        checkpoints cannot change while it is WAITING, nor its snapshot ever,
        and the store re-checks that state under the lock. The snapshot is
        compiled here when the job was ``parked_here``, by the hash the row
        names: under the lock it is neither read again nor hashed.
        """
        definition, digest = job.definition or {}, job.definition_hash
        compiled = self.compile(definition, digest) if parked_here else None
        input = job.input if parked_here else None
        checkpoints = job.checkpoints if parked_here else []

        def verify(response: dict[str, Any]) -> StepVerdict:
            # Not parked here when read, and parked now: compiled under the lock.
            workflow = compiled or self.compile(definition, digest)
            step = workflow.step(step_name)
            if step.reads_scope and input is None:
                # The job was not yet parked here when it was read, and is now.
                raise FailedPrecondition(
                    f"job changed state while the response for step {step_name!r} was being "
                    "checked; send it again"
                )
            try:
                return workflow.accept_external(
                    step_name,
                    response,
                    input=input if step.reads_scope else None,
                    checkpoints=list(checkpoints) if step.reads_scope else None,
                )
            except StepFailure as failure:
                # A validate rule that cannot be evaluated is a defect of the
                # definition: the job fails loudly rather than waiting forever.
                return StepVerdict(step_name, False, response, (str(failure),))

        return verify


def _read_outcome(check: asyncio.Future[Any]) -> None:
    if not check.cancelled():
        check.exception()


def _store_down(summary: str) -> PartHealth:
    return PartHealth("store", healthy=False, ready=False, summary=summary)


async def _session_connection(settings: Settings, use: str, session: Mapping[str, str]) -> Pool:
    """A pool of one connection that holds ``session``'s settings, opening in the background."""
    pool = create_pool(
        settings.database_url,
        min_size=1,
        max_size=1,
        timeout_s=settings.pool_timeout_s,
        application_name=f"workflow-jobs {use} {settings.worker_id}".strip()[:63],
        session=session,
    )
    await pool.open(wait=False)
    return pool


__all__ = ["Runtime"]
