"""The Faust app: the one process users deploy (``faust -A streams.app worker``).

Everything is configured by ``streams.settings.Settings``, read from the
environment once when this module is imported; a malformed variable stops the
import with its name. Roles switch the parts on:

* ``api``    - the HTTP verbs on the Faust web server (``/healthz`` and
  ``/readyz`` are always on); no Kafka client;
* ``worker`` - the request and completions agents, the claim loops, the lease
  sweeper (leases and deadlines); Faust's consumer and producer start once the
  broker answers (``streams.broker``);
* ``relay``  - the outbox relay to the events topic, with its own producer.

Any combination runs alone: Faust starts no Kafka client of its own at boot.

``WFJOBS_WORKER_ID`` is required to start a worker process: it is written into
``lease_owner``, so a row always tells which process holds it, and a process
refuses to start while another live one runs under the same id. Handler modules
named in ``WFJOBS_HANDLERS`` are imported before anything starts.

Postgres is the store, so Faust keeps no tables (``store='memory://'``) and
needs no leader election topic.
"""

from __future__ import annotations

import gc

# Loading the service allocates some hundred thousand objects that live until
# exit (modules, classes, descriptors). The cyclic collector would trace them
# while they load, at every full collection afterwards and once more at exit,
# finding nothing to free; so collection waits until they are loaded, and then
# they are set aside (``gc.freeze``). The few thousand cyclic leftovers of the
# imports are set aside with them: a bounded, one-time cost of memory.
gc.disable()

import logging
import os
import sys
from typing import Any, NoReturn

import faust

from schemas.errors import WorkerIdTaken
from streams.agents import STOP_MARGIN_S, exit_unless_stopped_within
from streams.broker import BootWithoutKafka, connect_kafka
from streams.completions_agent import register_completions_agent
from streams.http_errors import HANDLER_ARGS
from streams.kafka_security import faust_credentials
from streams.request_agent import register_request_agent
from streams.runtime import Runtime
from streams.settings import Settings, SettingsError
from streams.web import HttpVerbs, register_views


class Worker(faust.Worker):
    """Refuses to start without a worker id, before touching Kafka, or under the
    id of another live process, and writes its log lines in ``WFJOBS_LOG_FORMAT``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        runtime = getattr(self.app, "wfjobs_runtime", None)
        if isinstance(runtime, Runtime) and runtime.settings.log_format == "json":
            # The start-up progress is for a terminal: with JSON lines asked
            # for, the worker writes nothing else. (The ``faust`` command's own
            # banner comes before the worker exists; ``faust --quiet`` drops it.)
            self.quiet = True

    async def on_stop(self) -> None:
        # Before the app's Kafka clients: with the broker away, leaving the
        # group and closing the consumer can take seconds, and the loops that
        # run jobs must hand back what they hold well before an orchestrator's
        # patience runs out.
        runtime = getattr(self.app, "wfjobs_runtime", None)
        if isinstance(runtime, Runtime):
            # Every part's stop is bounded, but a store or broker that never
            # answers makes them wait in turn; past this the process exits
            # rather than look alive to its orchestrator (its jobs' leases pass).
            exit_unless_stopped_within(
                runtime.settings.shutdown_grace_s + STOP_MARGIN_S, "being told to stop"
            )
            await runtime.stop_loops()
        await super().on_stop()

    def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
        # Called once mode has given the root logger its handlers (``--logfile``
        # or the terminal, at ``--loglevel``): every line of Faust, mode and the
        # service goes through them, so they are the ones to format.
        super().on_setup_root_logger(logger, level)
        runtime = getattr(self.app, "wfjobs_runtime", None)
        if isinstance(runtime, Runtime):
            runtime.install_log_format(logger)

    def execute_from_commandline(self) -> NoReturn:
        # As with ``python -m``, the working directory is importable, so a
        # project's own handler modules can be named in WFJOBS_HANDLERS (the
        # ``faust`` script's path starts at its own bin directory instead).
        cwd = os.getcwd()
        if cwd not in sys.path:
            sys.path.append(cwd)
        runtime = getattr(self.app, "wfjobs_runtime", None)
        if isinstance(runtime, Runtime):
            try:
                runtime.settings.require_worker_id()
                runtime.settings.require_web_host()
                runtime.load_handlers()
                # On the loop the worker runs on, which keeps the id's session.
                self.loop.run_until_complete(runtime.take_worker_id())
            except (SettingsError, ImportError, WorkerIdTaken) as exc:
                print(f"workflow-jobs: refusing to start: {exc}", file=sys.stderr)
                raise SystemExit(2) from None
            # The handler modules live as long as the process, like the service's own.
            gc.freeze()
        super().execute_from_commandline()


def create_app(settings: Settings, *, runtime: Runtime | None = None) -> faust.App:
    """Build the app ``settings`` describe; the runtime may be handed in by tests."""
    runtime = runtime if runtime is not None else Runtime(settings)
    options: dict[str, Any] = {}
    if settings.data_dir:
        options["datadir"] = settings.data_dir
    app = faust.App(
        settings.consumer_group,
        broker=settings.broker_url,
        # TLS and SASL of Faust's consumer, producer and topic creation.
        broker_credentials=faust_credentials(settings),
        # Only our settings configure the app: Faust would otherwise also read
        # unprefixed variables such as WEB_PORT from the environment.
        env={},
        store="memory://",
        topic_disable_leader=True,
        autodiscover=False,
        web_enabled=True,
        web_bind=settings.web_host,
        web_host=settings.web_host,
        web_port=settings.web_port,
        web_in_thread=False,
        # Faust's own endpoints are off: /router and /table would show the
        # cluster's layout and table data to anyone who can reach the port,
        # and the statistics and graph pages its internals.
        web_router_enabled=False,
        web_tables_enabled=False,
        web_stats_enabled=False,
        web_graph_enabled=False,
        web_metrics_enabled=False,
        # The HTTP parser's limits (over-long URLs and headers answer 414 and 431).
        web_application_options={"handler_args": dict(HANDLER_ARGS)},
        # The request agent decides when an offset may move (see request_agent).
        consumer_auto_offset_reset="earliest",
        # A rebalance must not wait for a message that is stuck behind a store
        # outage: its offset was not acknowledged, so the partition's next
        # owner gets it again, and submitting is idempotent on job_id.
        stream_wait_empty=False,
        broker_session_timeout=settings.broker_session_timeout_s,
        broker_rebalance_timeout=settings.broker_session_timeout_s,
        # The group needs a few heartbeats per session timeout to keep a member.
        broker_heartbeat_interval=min(3.0, settings.broker_session_timeout_s / 3),
        Worker=Worker,
        **options,
    )
    app.wfjobs_runtime = runtime  # type: ignore[attr-defined]
    # No Faust Kafka client at boot: a process without the worker role has no
    # topic to consume and nothing to produce through Faust, and a worker must
    # come up while its broker is away (streams.broker starts them later).
    app.boot_strategy = BootWithoutKafka(app)
    # A dependency added now starts before the children Faust adds at start
    # (web, and later the Kafka parts streams.broker adds) and stops after
    # them. So the claim loops and the sweeper do not wait for the first Kafka
    # rebalance (a crashed group member can hold that up for a whole session
    # timeout), and the store stays open until the request agent has stopped.
    app.add_dependency(runtime)
    register_views(app, HttpVerbs(runtime), verbs="api" in settings.roles)
    if "worker" in settings.roles:
        register_request_agent(app, runtime)
        register_completions_agent(app, runtime)
        connect_kafka(app, runtime)
    return app


def _from_environment() -> faust.App:
    try:
        settings = Settings.from_env()
    except SettingsError as exc:
        raise SystemExit(f"workflow-jobs: invalid configuration: {exc}") from None
    return create_app(settings)


try:
    app = _from_environment()
finally:
    gc.freeze()
    gc.enable()

__all__ = ["Worker", "app", "create_app"]
