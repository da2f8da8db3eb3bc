"""The relay through a broker outage, on an Apache Kafka of the test's own.

The broker is stopped and started again on the same port with the same data
(``ApacheKafkaService.halt`` / ``resume``), which the session's shared broker
must never be. The outage lasts longer than ten producer message timeouts: the
old relay spent an attempt on each and dead-lettered the row after ten.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from devstack.apache_kafka import ApacheKafkaService
from schemas.serde import EventDecoder, event_serializer
from store import Outbox, RunStore, open_pool
from streams.relay import OutboxRelay, producer_config
from tests.integration.delivery.test_relay import (
    Store,
    checkpoint,
    claim_all,
    consume,
    outbox_ids,
    submit,
)
from tests.integration.streams.conftest import serve

pytestmark = pytest.mark.kafka

MESSAGE_TIMEOUT_MS = 1000


@pytest.fixture(scope="module")
def own_broker() -> Iterator[ApacheKafkaService]:
    """A broker only this module uses, so it can be stopped and started again."""
    with ApacheKafkaService("", num_partitions=3) as broker:
        yield broker


def _topic(bootstrap: str, partitions: int = 3) -> str:
    name = f"outage-{uuid.uuid4().hex[:12]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=30)[name].result(30)
    deadline = time.monotonic() + 30
    while True:
        meta = admin.list_topics(topic=name, timeout=5).topics.get(name)
        if (
            meta is not None
            and meta.error is None
            and len(meta.partitions) == partitions
            and all(p.leader >= 0 for p in meta.partitions.values())
        ):
            return name
        assert time.monotonic() < deadline, f"topic {name} has no leaders"
        time.sleep(0.05)


@pytest.fixture
async def store(make_database: Callable[[], str]) -> AsyncIterator[Store]:
    dsn = make_database(migrated=True)
    pool = await open_pool(dsn, min_size=1, max_size=8)
    try:
        yield Store(dsn, pool, RunStore(pool), Outbox(pool, lease_s=30.0))
    finally:
        await pool.close()


async def _until(what: str, check: Callable[[], Awaitable[bool]], timeout_s: float) -> None:
    """Await ``check()`` becoming true, asking every 0.2 s; fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    for _ in range(int(timeout_s / 0.2) + 1):
        if await check():
            return
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    raise AssertionError(f"{what} within {timeout_s:.0f}s")


async def test_a_broker_outage_longer_than_ten_message_timeouts_fails_no_event(
    store: Store, own_broker: ApacheKafkaService
) -> None:
    bootstrap = own_broker.bootstrap_servers
    topic = await asyncio.to_thread(_topic, bootstrap)
    relay = OutboxRelay(
        store.outbox,
        producer_config=producer_config(
            bootstrap,
            {"reconnect.backoff.max.ms": 500},
            message_timeout_ms=MESSAGE_TIMEOUT_MS,
        ),
        topic=topic,
        serializer=event_serializer(registry=None, topic=topic),
        interval_s=0.05,
        backoff_max_s=0.3,
    )
    jobs = [await submit(store) for _ in range(6)]
    leases = await claim_all(store, jobs)
    await relay.start()
    try:
        await _until("the first events went out", _drained(store), 60)

        await asyncio.to_thread(own_broker.halt)
        outage_started = time.monotonic()
        # Events keep committing while the broker is away.
        for step in range(3):
            for job in jobs:
                await checkpoint(store, leases[job], step)
        # More failed passes than the old attempt limit, each waiting out the
        # producer's message timeout.
        passes_before = relay.stats.failing_passes

        async def eleven_failed_passes() -> bool:
            return relay.stats.failing_passes - passes_before >= 11

        await _until("eleven passes failed", eleven_failed_passes, 180)
        assert time.monotonic() - outage_started > 10 * MESSAGE_TIMEOUT_MS / 1000
        assert relay.stats.failed == 0
        assert relay.stats.published == len(jobs)

        await asyncio.to_thread(own_broker.resume)
        for job in jobs:
            await store.runs.complete(leases[job], result={}, verdict="done")
        await _until("the outbox drained after the outage", _drained(store), 120)
    finally:
        await relay.stop()

    async with store.pool.connection() as conn:
        cursor = await conn.execute(
            "SELECT count(*) FROM workflow_run_events_outbox WHERE status <> 'PUBLISHED'"
        )
        row = await cursor.fetchone()
    assert row == (0,)
    total = len(jobs) * 5
    messages = await asyncio.to_thread(consume, bootstrap, topic, total)
    seen: dict[str, list[int]] = defaultdict(list)
    decoder = EventDecoder()
    for message in messages:
        event = decoder.decode(message.value())
        if event.event_id not in seen[event.job_id]:  # consumers dedupe on event_id
            seen[event.job_id].append(event.event_id)
    for job in jobs:
        ids = await outbox_ids(store, job)
        assert len(ids) == 5
        assert seen[str(job)] == ids, "every event, once, in commit order"


def _drained(store: Store) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await store.outbox.pending_count() == 0

    return check


async def test_healthz_says_stuck_while_the_relay_cannot_publish_and_ok_once_it_can(
    make_database: Callable[[], str], own_broker: ApacheKafkaService
) -> None:
    dsn = make_database(migrated=True)
    bootstrap = own_broker.bootstrap_servers
    topic = await asyncio.to_thread(_topic, bootstrap)
    env = {
        "DATABASE_URL": dsn,
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "WFJOBS_ROLES": "api,relay",
        "WFJOBS_EVENTS_TOPIC": topic,
        "WFJOBS_RELAY_INTERVAL_S": "0.1",
        "WFJOBS_RELAY_MESSAGE_TIMEOUT_MS": "1000",
        "WFJOBS_RELAY_BACKOFF_MAX_S": "1",
        "WFJOBS_RELAY_STUCK_AFTER_S": "4",
        "WFJOBS_RELAY_LEASE_S": "10",
    }
    async with serve(env) as (client, runtime):
        assert runtime.relay is not None
        pool = runtime.pool
        assert pool is not None

        async def write_event() -> None:
            async with pool.connection() as conn:
                await conn.execute(
                    "INSERT INTO workflow_run_events_outbox (job_id, event_type, payload)"
                    " VALUES (%s, 'ACCEPTED', '')",
                    (uuid.uuid4(),),
                )

        async def relay_part(expected_status: int) -> Callable[[], Awaitable[bool]]:
            async def check() -> bool:
                response = await client.get("/healthz")
                body: dict[str, Any] = await response.json()
                return response.status == expected_status and (
                    body["parts"]["relay"]["healthy"] is (expected_status == 200)
                )

            return check

        await write_event()
        outbox = runtime.outbox
        assert outbox is not None

        async def published() -> bool:
            return await outbox.pending_count() == 0

        await _until("the first event went out", published, 60)
        assert (await client.get("/healthz")).status == 200

        await asyncio.to_thread(own_broker.halt)
        try:
            await write_event()
            await _until("/healthz said 503", await relay_part(503), 90)
            body = await (await client.get("/healthz")).json()
            relay = body["parts"]["relay"]
            assert relay["summary"].startswith("cannot publish for")
            assert relay["last_publish_ok"] is False
            assert relay["last_publish_at"] is not None
        finally:
            await asyncio.to_thread(own_broker.resume)
        await _until("/healthz said 200 again", await relay_part(200), 120)
        await _until("the event written in the outage went out", published, 60)
        body = await (await client.get("/healthz")).json()
        assert body["parts"]["relay"]["last_publish_ok"] is True
