"""A job over SASL_SSL end to end: ``wfjobs produce`` -> worker and relay -> ``wfjobs events``.

Every process (the worker with all its roles, both CLI commands) is given only
the broker's SASL_SSL (SCRAM-SHA-512) listener and the security settings, so
each of their Kafka clients (Faust's consumer, producer and topic creation,
the broker probe, the ownership reader, the relay's producer, the CLI's
producer and consumer) must speak SASL over TLS or the job never arrives. The
worker creates the topics itself. Credentials the broker refuses stop the
worker and the CLI at once, with one line naming the setting.

One worker process serves the module.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from devstack.postgres import PostgresService
from devstack.processes import ServiceError, free_port
from devstack.stack import WorkerProcess, worker_environment
from store.definitions import DefinitionStore
from store.outbox import Outbox
from store.pool import Pool, open_pool
from store.runs import RunStore
from tests.conftest import KafkaSasl
from tests.e2e.harness import HANDLERS_MODULE, REPO_ROOT, self_provisioning_worker, wait_until
from tests.forkserver import ForkServer
from tests.workflows_fixtures import envelope

pytestmark = pytest.mark.e2e

WFJOBS = str(Path(sys.executable).parent / "wfjobs")
WORKFLOW = "sasl-auto"


@dataclass
class SaslStack:
    sasl: KafkaSasl
    # The topics, registry and security every process of the module shares.
    settings: Mapping[str, str]
    worker: WorkerProcess
    pool: Pool
    tmp: Path

    def cli_env(self, **overrides: str) -> dict[str, str]:
        inherited = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith("WFJOBS_") and key not in {"KAFKA_BOOTSTRAP_SERVERS"}
        }
        return {**inherited, **self.settings, **overrides}


async def _ready(url: str) -> bool:
    try:
        async with httpx.AsyncClient(timeout=2) as http:
            return (await http.get(f"{url}/readyz")).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
async def sasl_stack(
    kafka_sasl: KafkaSasl,
    postgres_server: PostgresService,
    tmp_path_factory: pytest.TempPathFactory,
    fork_server: ForkServer,
) -> AsyncIterator[SaslStack]:
    tmp = tmp_path_factory.mktemp("sasl")
    dsn = postgres_server.create_database("sasl")
    suffix = uuid.uuid4().hex[:10]
    # A mounted secret, as a deployment would give it.
    password_file = tmp / "kafka-password"
    password_file.write_text(kafka_sasl.password + "\n")
    security = {
        key: value
        for key, value in kafka_sasl.settings_env().items()
        if key != "WFJOBS_KAFKA_SASL_PASSWORD"
    }
    settings = {
        **security,
        "WFJOBS_KAFKA_SASL_PASSWORD_FILE": str(password_file),
        "WFJOBS_REQUESTS_TOPIC": f"sasl-requests-{suffix}",
        "WFJOBS_REQUESTS_DLQ_TOPIC": f"sasl-requests-dlq-{suffix}",
        "WFJOBS_EVENTS_TOPIC": f"sasl-events-{suffix}",
        # confluent-kafka's in-process mock registry: every process registers
        # the contract in the same order, so the ids agree across processes.
        "WFJOBS_SCHEMA_REGISTRY_URL": f"mock://sasl-{suffix}",
    }
    # Faust declares the three topics over SASL_SSL too.
    worker = self_provisioning_worker(
        "sasl",
        dsn=dsn,
        bootstrap=kafka_sasl.bootstrap,
        settings=settings,
        tmp=tmp,
        launch=fork_server,
    )
    pool: Pool | None = None
    try:
        await asyncio.to_thread(worker.start, timeout_s=60.0)

        # Ready: the store answers and the request consumer has joined its group.
        async def ready() -> bool | None:
            return True if await _ready(worker.url) else None

        await wait_until(ready, timeout_s=60.0, interval_s=0.2)
        pool = await open_pool(dsn, min_size=1, max_size=2)
        await DefinitionStore(pool).put(WORKFLOW, envelope(name=WORKFLOW, review="invoke"))
        yield SaslStack(kafka_sasl, settings, worker, pool, tmp)
    except (ServiceError, TimeoutError) as exc:
        raise AssertionError(
            f"the SASL_SSL worker did not start: {exc}\n{worker.log_tail()}"
        ) from None
    finally:
        worker.stop(timeout_s=15)
        if pool is not None:
            await pool.close()
        postgres_server.drop_database(dsn)


async def wfjobs(env: Mapping[str, str], *args: str) -> tuple[int, str, str]:
    """The real command line, as a child process; its exit code, stdout and stderr."""
    process = await asyncio.create_subprocess_exec(
        WFJOBS,
        *args,
        env=dict(env),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), 90)
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode()


async def test_a_produced_request_runs_and_its_events_are_read_over_sasl_ssl(
    sasl_stack: SaslStack,
) -> None:
    job_id = uuid.uuid4()
    code, out, err = await wfjobs(
        sasl_stack.cli_env(),
        "produce",
        "--workflow-name",
        WORKFLOW,
        "--input",
        json.dumps({"text": "over sasl_ssl"}),
        "--job-id",
        str(job_id),
    )
    assert code == 0, err

    runs = RunStore(sasl_stack.pool)

    async def settled() -> str | None:
        try:
            job = await runs.get(job_id)
        except Exception:
            return None
        return job.status if job.status in {"COMPLETED", "FAILED", "DEAD"} else None

    try:
        status = await wait_until(settled, timeout_s=60.0, interval_s=0.2)
    except TimeoutError:
        raise AssertionError(f"job {job_id} not settled\n{sasl_stack.worker.log_tail()}") from None
    assert status == "COMPLETED"
    written = await Outbox(sasl_stack.pool).events_for(job_id)

    code, out, err = await wfjobs(
        sasl_stack.cli_env(),
        "--json",
        "events",
        "--from-beginning",
        "--job",
        str(job_id),
        "--max",
        str(len(written)),
        "--timeout",
        "60",
    )
    assert code == 0, err
    events = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert len(events) == len(written), (out, err)
    assert {event["job_id"] for event in events} == {str(job_id)}
    assert events[-1]["type"].endswith("COMPLETED"), events


async def test_wfjobs_produce_with_a_wrong_password_fails_naming_the_setting(
    sasl_stack: SaslStack,
) -> None:
    env = sasl_stack.cli_env(WFJOBS_KAFKA_SASL_PASSWORD="not-the-password")
    del env["WFJOBS_KAFKA_SASL_PASSWORD_FILE"]
    code, _, err = await wfjobs(
        env, "produce", "--workflow-name", WORKFLOW, "--input", "{}", "--timeout", "30"
    )
    assert code == 1
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "WFJOBS_KAFKA_SASL_PASSWORD" in lines[0], err


async def refused_worker(
    tmp: Path, bootstrap: str, settings: Mapping[str, str], launch: ForkServer
) -> str:
    """The log of a worker whose Kafka settings the broker refuses, once it has exited.

    It must exit by itself, and not cleanly.
    """
    env = worker_environment(
        database_url="",
        bootstrap_servers=bootstrap,
        worker_id="refused",
        web_port=free_port(),
        data_dir=tmp / "faust",
        roles="worker",
        handlers=(HANDLERS_MODULE,),
        extra={**settings, "WFJOBS_GROUP": f"refused-{uuid.uuid4().hex[:8]}"},
    )
    worker = WorkerProcess(env, workdir=tmp, name="refused", cwd=REPO_ROOT, launch=launch)
    try:
        # It may exit before its web server ever answered.
        with contextlib.suppress(ServiceError):
            await asyncio.to_thread(worker.start, timeout_s=60.0)

        async def exited() -> int | None:
            return worker.exit_code()

        code = await wait_until(exited, timeout_s=60.0, interval_s=0.2)
    finally:
        worker.stop(timeout_s=10)
    log = worker.log_tail(200)
    assert code != 0, log
    return log


async def test_a_worker_with_a_wrong_password_exits_at_start_naming_the_setting(
    sasl_stack: SaslStack, fork_server: ForkServer
) -> None:
    log = await refused_worker(
        sasl_stack.tmp / "refused",
        sasl_stack.sasl.bootstrap,
        sasl_stack.sasl.settings_env(password="not-the-password"),
        fork_server,
    )
    named = [line for line in log.splitlines() if "WFJOBS_KAFKA_SASL_PASSWORD" in line]
    assert named, log
    assert "cannot use Kafka" in named[0] and "refused" in named[0], named[0]
