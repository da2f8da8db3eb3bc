"""Every partition of the request topic gets an owner, or the worker says so and exits.

Worker processes against a real broker:

* the empty assignment: the group leader assigns from metadata that lacks the
  request topic (as right after a broker restart), every member gets nothing
  and the group is stable; once the topic's partitions are known again they
  are assigned and every request produced meanwhile is consumed;
* partitions the group has never assigned (added to the topic) are picked up
  by the watchdog's rejoin, long before the five-minute metadata refresh;
* a leader that keeps assigning from stale metadata: the worker rejoins, then
  exits non-zero naming the partitions nobody owns.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import faust
import httpx
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.cluster import ClusterMetadata
from aiokafka.errors import KafkaError
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions

# The same class confluent_kafka.admin re-exports, from the module its stubs type.
from confluent_kafka.cimpl import NewTopic

from devstack.apache_kafka import ApacheKafkaService
from schemas.contract import WorkflowRunRequest
from schemas.serde import encode_request
from store.pool import open_pool
from streams.ownership import GroupOwnership, OwnershipReader
from tests.e2e.harness import Stack, stack_topics, wait_until
from tests.forkserver import ForkServer
from tests.workflows_fixtures import envelope

pytestmark = pytest.mark.e2e

WORKFLOW = envelope(name="e2e-owned", review="invoke")


@pytest.fixture(scope="module")
def strict_kafka() -> Iterator[ApacheKafkaService]:
    """Our own broker that creates no topic on a metadata request, so a topic can be absent."""
    with ApacheKafkaService("", properties={"auto.create.topics.enable": "false"}) as broker:
        yield broker


async def _stack(
    make_database: Callable[[], str],
    new_topic: Callable[..., str],
    bootstrap: str,
    tmp: Path,
    launch: ForkServer,
    *,
    requests: str | None = None,
) -> Stack:
    dsn = make_database(migrated=True)
    topics = stack_topics(new_topic, bootstrap, requests=requests)
    pool = await open_pool(dsn, min_size=1, max_size=4)
    return Stack(dsn=dsn, bootstrap=bootstrap, topics=topics, tmp=tmp, pool=pool, launch=launch)


@pytest.fixture
async def stacks() -> AsyncIterator[list[Stack]]:
    made: list[Stack] = []
    yield made
    for stack in made:
        stack.stop_workers()
        await stack.pool.close()


async def ownership(stack: Stack) -> GroupOwnership:
    async with OwnershipReader(stack.bootstrap, stack.group, stack.requests_topic) as reader:
        return await reader.read()


async def wait_ownership(
    stack: Stack, check: Callable[[GroupOwnership], bool], *, timeout_s: float
) -> GroupOwnership:
    last: list[object] = []

    async def seen() -> GroupOwnership | None:
        try:
            found = await ownership(stack)
        except (KafkaError, OSError, TimeoutError) as exc:
            # A broker just back may not serve the group yet.
            last[:] = [exc]
            return None
        last[:] = [found]
        return found if check(found) else None

    try:
        return await wait_until(seen, timeout_s=timeout_s, interval_s=0.3)
    except TimeoutError:
        raise AssertionError(
            f"group never got there; last seen {last}\n{stack.worker_logs()}"
        ) from None


async def requests_part(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        body = (await http.get("/healthz")).json()
    part: dict[str, Any] = body["parts"]["requests"]
    return part


def produce(stack: Stack, count: int, *, partition: int | None = None) -> list[uuid.UUID]:
    producer = Producer({"bootstrap.servers": stack.bootstrap, "acks": "all"})
    jobs = []
    for n in range(count):
        job = uuid.uuid4()
        request = WorkflowRunRequest(job_id=str(job), workflow_name=WORKFLOW["name"])
        request.input.update({"text": f"request {n}"})
        value = encode_request(request, registry=stack.registry, topic=stack.requests_topic)
        if partition is None:
            producer.produce(stack.requests_topic, value=value, key=str(job).encode())
        else:
            producer.produce(stack.requests_topic, value=value, partition=partition)
        jobs.append(job)
    assert producer.flush(15) == 0, "the broker did not acknowledge every request"
    return jobs


async def test_empty_assignment_from_metadata_without_the_topic_heals_and_every_request_is_consumed(
    strict_kafka: ApacheKafkaService,
    make_database: Callable[[], str],
    new_topic: Callable[..., str],
    stacks: list[Stack],
    tmp_path: Path,
    fork_server: ForkServer,
) -> None:
    bootstrap = strict_kafka.bootstrap_servers
    requests = f"e2e-requests-{uuid.uuid4().hex[:12]}"
    stack = await _stack(
        make_database, new_topic, bootstrap, tmp_path, fork_server, requests=requests
    )
    stacks.append(stack)
    # The watchdog stays out of it: this is the assignor's own recovery.
    quiet = {"WFJOBS_UNOWNED_REJOIN_S": "600", "WFJOBS_BROKER_SESSION_TIMEOUT_S": "6"}
    first = await stack.start_worker("w1", **quiet)
    await stack.start_worker("w2", **quiet)
    await stack.put_workflow(first, WORKFLOW)

    # The leader assigns from metadata in which the request topic has no
    # partitions: a stable group, both members holding the empty set.
    await wait_ownership(stack, lambda g: g.stable and g.members == 2, timeout_s=60)
    assert (await ownership(stack)).owners == {}
    assert "Ignoring missing topic" in stack.worker_logs(200)

    # The partitions become known (the broker is back with its topic), and
    # requests are acknowledged on them right away.
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(requests, 3, 1)])[requests].result(timeout=30)
    jobs = produce(stack, 17)

    owned = await wait_ownership(
        stack, lambda g: g.stable and g.partitions == (0, 1, 2) and not g.unowned, timeout_s=60
    )
    assert owned.members == 2
    for job in jobs:
        await stack.wait_for_job(job, {"COMPLETED"}, timeout_s=60)
    assigned: set[int] = set()
    for worker in stack.workers:
        # Each watchdog judges on its own tick: wait for the one after the heal.
        async def settled(url: str = worker.url) -> dict[str, Any] | None:
            part = await requests_part(url)
            return part if part["unowned"] == [] else None

        part = await wait_until(settled, timeout_s=30, interval_s=0.3)
        assert part["healthy"] and part["ready"], part
        assert part["rejoins"] == 0, part
        assigned.update(part["assigned"])
    assert assigned == {0, 1, 2}


async def test_after_a_broker_outage_and_a_short_restart_every_request_is_consumed(
    strict_kafka: ApacheKafkaService,
    make_database: Callable[[], str],
    new_topic: Callable[..., str],
    stacks: list[Stack],
    tmp_path: Path,
    fork_server: ForkServer,
) -> None:
    stack = await _stack(
        make_database, new_topic, strict_kafka.bootstrap_servers, tmp_path, fork_server
    )
    stacks.append(stack)
    fast = {
        "WFJOBS_BROKER_SESSION_TIMEOUT_S": "6",
        "WFJOBS_OWNERSHIP_CHECK_S": "0.5",
        "WFJOBS_UNOWNED_REJOIN_S": "2",
        "WFJOBS_UNOWNED_EXIT_S": "600",
    }
    first = await stack.start_worker("w1", **fast)
    await stack.start_worker("w2", **fast)
    await stack.put_workflow(first, WORKFLOW)
    await wait_ownership(
        stack, lambda g: g.stable and g.members == 2 and not g.unowned, timeout_s=60
    )

    await asyncio.to_thread(strict_kafka.halt)

    # The outage lasts until both workers have noticed it.
    async def noticed() -> bool | None:
        parts = [await requests_part(worker.url) for worker in stack.workers]
        return True if all("last_error" in part for part in parts) else None

    await wait_until(noticed, timeout_s=60)
    await asyncio.to_thread(strict_kafka.resume)
    await asyncio.to_thread(strict_kafka.halt)
    await asyncio.to_thread(strict_kafka.resume)

    jobs = produce(stack, 17)
    await wait_ownership(
        stack, lambda g: g.stable and not g.unowned and g.members == 2, timeout_s=120
    )
    for job in jobs:
        await stack.wait_for_job(job, {"COMPLETED"}, timeout_s=120)
    for worker in stack.workers:
        part = await requests_part(worker.url)
        assert part["healthy"] and part["unowned"] == [], part


async def test_watchdog_rejoins_when_partitions_stay_unowned(
    kafka_bootstrap: str,
    make_database: Callable[[], str],
    new_topic: Callable[..., str],
    stacks: list[Stack],
    tmp_path: Path,
    fork_server: ForkServer,
) -> None:
    stack = await _stack(make_database, new_topic, kafka_bootstrap, tmp_path, fork_server)
    stacks.append(stack)
    worker = await stack.start_worker(
        "w1",
        WFJOBS_OWNERSHIP_CHECK_S="0.5",
        WFJOBS_UNOWNED_REJOIN_S="2",
        WFJOBS_UNOWNED_EXIT_S="600",
    )
    await stack.put_workflow(worker, WORKFLOW)
    await wait_ownership(stack, lambda g: g.stable and not g.unowned, timeout_s=60)

    # Two partitions more: the group's assignment predates them, and the
    # consumer would only see them at its next metadata refresh (minutes).
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_partitions([NewPartitions(stack.requests_topic, 5)])[stack.requests_topic].result(
        timeout=30
    )

    async def grown() -> bool | None:
        meta = await asyncio.to_thread(admin.list_topics, stack.requests_topic, 5)
        partitions = meta.topics[stack.requests_topic].partitions.values()
        led = len(partitions) == 5 and all(p.leader >= 0 for p in partitions)
        return True if led else None

    await wait_until(grown, timeout_s=30)
    jobs = produce(stack, 3, partition=3) + produce(stack, 3, partition=4)

    await wait_ownership(
        stack, lambda g: g.stable and len(g.partitions) == 5 and not g.unowned, timeout_s=60
    )
    for job in jobs:
        await stack.wait_for_job(job, {"COMPLETED"}, timeout_s=60)
    part = await requests_part(worker.url)
    assert part["rejoins"] >= 1 and part["healthy"], part
    assert part["assigned"] == [0, 1, 2, 3, 4]
    assert "rejoining the group" in stack.worker_logs(400)


class StaleAssignor(faust.assignor.PartitionAssignor):  # type: ignore[misc]
    """Faust's assignor fed the metadata a leader has right after a broker restart: no topics."""

    def assign(self, cluster: ClusterMetadata, member_metadata: Any) -> Any:
        return super().assign(ClusterMetadata(), member_metadata)


async def test_worker_exits_non_zero_naming_the_partitions_when_rejoining_does_not_help(
    kafka_bootstrap: str,
    make_database: Callable[[], str],
    new_topic: Callable[..., str],
    stacks: list[Stack],
    tmp_path: Path,
    fork_server: ForkServer,
) -> None:
    stack = await _stack(make_database, new_topic, kafka_bootstrap, tmp_path, fork_server)
    stacks.append(stack)
    # A group member that joins first, so it leads every rebalance, and always
    # assigns from metadata without the request topic.
    app = faust.App(stack.group, broker=f"kafka://{kafka_bootstrap}", store="memory://")
    leader = AIOKafkaConsumer(
        stack.requests_topic,
        bootstrap_servers=kafka_bootstrap,
        group_id=stack.group,
        partition_assignment_strategy=[StaleAssignor(app, replicas=0)],
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
        enable_auto_commit=False,
    )
    await leader.start()
    try:
        await wait_ownership(stack, lambda g: g.stable and g.members == 1, timeout_s=60)
        worker = await stack.start_worker(
            "w1",
            WFJOBS_OWNERSHIP_CHECK_S="0.5",
            WFJOBS_UNOWNED_REJOIN_S="2",
            WFJOBS_UNOWNED_EXIT_S="4",
            WFJOBS_BROKER_SESSION_TIMEOUT_S="6",
        )

        async def exited() -> int | None:
            return worker.exit_code()

        try:
            code = await wait_until(exited, timeout_s=90, interval_s=0.3)
        except TimeoutError:
            raise AssertionError(f"the worker did not exit\n{stack.worker_logs(80)}") from None
    finally:
        await leader.stop()
    log = stack.worker_logs(400)
    assert code == 1, log
    assert "rejoining the group" in log
    assert f"partition(s) 0, 1, 2 of {stack.requests_topic} have had no owner" in log, log
