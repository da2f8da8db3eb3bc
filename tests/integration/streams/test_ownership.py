"""Request topic ownership: the group description read from a real broker (also
one that stops and comes back) and the watchdog's escalation on it (the
assignor is tested with a worker process, in tests/e2e/test_ownership.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from devstack.apache_kafka import ApacheKafkaService
from streams.ownership import (
    GroupOwnership,
    OwnershipLost,
    OwnershipReader,
    OwnershipWatchdog,
    Thresholds,
)

THRESHOLDS = Thresholds(interval_s=1.0, rejoin_after_s=30.0, exit_after_s=60.0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Watched:
    """A watchdog of ``topic`` on a clock the test moves, noting its rejoins and stops."""

    def __init__(self, topic: str, describe: Any) -> None:
        self.clock = Clock()
        self.rejoins: list[float] = []
        self.stopped: list[OwnershipLost] = []
        self.watchdog = OwnershipWatchdog(
            topic=topic,
            describe=describe,
            rejoin=self._rejoin,
            stop_process=self._stop_process,
            thresholds=THRESHOLDS,
            clock=self.clock,
        )

    async def _rejoin(self) -> None:
        self.rejoins.append(self.clock.now)

    async def _stop_process(self, reason: OwnershipLost) -> None:
        self.stopped.append(reason)


class Member:
    """A plain consumer of the group, subscribed to ``topics``, polled until assigned."""

    def __init__(self, bootstrap: str, group: str, topics: list[str]) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 6000,
            }
        )
        self.consumer.subscribe(topics)

    def wait_assigned(self, timeout_s: float = 30.0) -> list[TopicPartition]:
        deadline = time.monotonic() + timeout_s
        while not self.consumer.assignment():
            assert time.monotonic() < deadline, "no assignment"
            self.consumer.poll(0.2)
        return list(self.consumer.assignment())


@pytest.fixture
def members() -> Iterator[Callable[[str, str, list[str]], Member]]:
    made: list[Member] = []

    def make(bootstrap: str, group: str, topics: list[str]) -> Member:
        member = Member(bootstrap, group, topics)
        made.append(member)
        return member

    yield make
    for member in made:
        member.consumer.close()


@pytest.fixture
async def readers() -> AsyncIterator[Callable[..., OwnershipReader]]:
    made: list[OwnershipReader] = []

    def make(bootstrap: str, group: str, topic: str, **kwargs: Any) -> OwnershipReader:
        reader = OwnershipReader(bootstrap, group, topic, **kwargs)
        made.append(reader)
        return reader

    yield make
    for reader in made:
        await reader.stop()


async def _read(bootstrap: str, group: str, topic: str) -> GroupOwnership:
    async with OwnershipReader(bootstrap, group, topic) as reader:
        return await reader.read()


async def test_read_ownership_names_owners_unowned_partitions_and_lag(
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
    members: Callable[[str, str, list[str]], Member],
) -> None:
    requests = new_topic(kafka_bootstrap, 3, prefix="own-requests")
    other = new_topic(kafka_bootstrap, 2, prefix="own-other")
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for n in range(5):
        producer.produce(requests, value=b"r%d" % n, partition=0)
    producer.produce(requests, value=b"x", partition=2)
    producer.flush(10)

    owning = f"own-{uuid.uuid4().hex[:8]}"
    member = members(kafka_bootstrap, owning, [requests])
    member.wait_assigned()
    member.consumer.commit(offsets=[TopicPartition(requests, 0, 2)], asynchronous=False)
    seen = await _read(kafka_bootstrap, owning, requests)
    assert seen.stable and seen.members == 1
    assert seen.partitions == (0, 1, 2)
    assert seen.unowned == ()
    assert set(seen.owners) == {0, 1, 2}
    # Committed 2 of 5 on partition 0; nothing committed on 2, one record there.
    assert seen.lag == {0: 3, 1: 0, 2: 1}

    # A stable group whose member holds only another topic's partitions.
    elsewhere = f"own-{uuid.uuid4().hex[:8]}"
    members(kafka_bootstrap, elsewhere, [other]).wait_assigned()
    seen = await _read(kafka_bootstrap, elsewhere, requests)
    assert seen.stable and seen.members == 1
    assert seen.unowned == (0, 1, 2)
    assert seen.lag == {0: 5, 1: 0, 2: 1}

    # A topic the broker does not know has no partitions, and asking about it
    # does not create it (the broker creates topics on metadata requests that allow it).
    missing = f"own-missing-{uuid.uuid4().hex[:8]}"
    seen = await _read(kafka_bootstrap, elsewhere, missing)
    assert seen.partitions == () and seen.lag == {}
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    assert missing not in (await asyncio.to_thread(admin.list_topics, timeout=10)).topics


async def test_watchdog_rejoins_then_stops_the_process_on_a_real_stable_group(
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
    members: Callable[[str, str, list[str]], Member],
    readers: Callable[..., OwnershipReader],
    caplog: pytest.LogCaptureFixture,
) -> None:
    requests = new_topic(kafka_bootstrap, 3, prefix="own-requests")
    other = new_topic(kafka_bootstrap, 1, prefix="own-other")
    group = f"own-{uuid.uuid4().hex[:8]}"
    # The group is stable and its only member owns nothing of the request
    # topic, whatever anyone rejoins: the state the incident left behind.
    members(kafka_bootstrap, group, [other]).wait_assigned()
    reader = readers(kafka_bootstrap, group, requests)
    watched = Watched(requests, reader.read)
    watchdog, clock, rejoins, stopped = (
        watched.watchdog,
        watched.clock,
        watched.rejoins,
        watched.stopped,
    )
    assert not watchdog.health().ready  # no assignment yet
    watchdog.on_assigned([])
    await watchdog.check()
    health = watchdog.health()
    assert health.healthy and health.ready
    assert health.detail["unowned"] == [0, 1, 2]
    assert health.detail["assigned"] == []

    clock.now += 29
    await watchdog.check()
    assert rejoins == []
    clock.now += 1
    await watchdog.check()
    assert rejoins == [clock.now]
    assert watchdog.health().healthy  # rejoining may still help

    clock.now += 59
    await watchdog.check()
    assert stopped == []
    clock.now += 1
    with caplog.at_level(logging.CRITICAL, logger="streams.ownership"):
        await watchdog.check()
    assert len(stopped) == 1 and len(rejoins) == 1
    assert f"partition(s) 0, 1, 2 of {requests} have had no owner for 90s" in str(stopped[0])
    assert any(
        r.levelno == logging.CRITICAL and f"0, 1, 2 of {requests}" in r.getMessage()
        for r in caplog.records
    )
    health = watchdog.health()
    assert not health.healthy
    assert health.name == "requests"
    assert health.detail["lag"] == 0
    assert "unowned for 90s" in health.summary


async def test_watchdog_counts_a_group_nobody_is_left_in_as_unowned(
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
    members: Callable[[str, str, list[str]], Member],
    readers: Callable[..., OwnershipReader],
) -> None:
    requests = new_topic(kafka_bootstrap, 2, prefix="own-requests")
    group = f"own-{uuid.uuid4().hex[:8]}"
    # This worker's consumer owned every partition, committed, and left the
    # group (as a member that polled nothing for too long does): the group is
    # settled, EMPTY, and no request on the topic is consumed any more.
    member = members(kafka_bootstrap, group, [requests])
    assigned = member.wait_assigned()
    member.consumer.commit(offsets=[TopicPartition(requests, 0, 0)], asynchronous=False)
    member.consumer.close()
    reader = readers(kafka_bootstrap, group, requests)
    assert (await reader.read()).state == "EMPTY"
    watched = Watched(requests, reader.read)
    watchdog, clock, rejoins, stopped = (
        watched.watchdog,
        watched.clock,
        watched.rejoins,
        watched.stopped,
    )
    # Before its first assignment a member may simply not have joined yet.
    await watchdog.check()
    assert watchdog.health().healthy and watchdog.health().detail["unowned_for_s"] == 0
    watchdog.on_assigned(tp.partition for tp in assigned)
    await watchdog.check()
    assert watchdog.health().detail["unowned"] == [0, 1]
    assert "unowned" in watchdog.health().summary
    clock.now += 30
    await watchdog.check()
    assert rejoins == [clock.now]
    clock.now += 60
    await watchdog.check()
    assert len(stopped) == 1
    health = watchdog.health()
    assert not health.healthy
    assert health.detail["group_state"] == "EMPTY"
    assert "unowned for 90s" in health.summary


async def test_a_broker_that_describes_no_assignments_leaves_ownership_unjudged(
    tansu_bootstrap: str,
    members: Callable[[str, str, list[str]], Member],
    readers: Callable[..., OwnershipReader],
) -> None:
    # Tansu, make dev's broker, describes a stable group's members without
    # their assignments: nobody seems to own anything, although this worker
    # consumes every partition. Read as a lapse, that made every dev worker
    # rejoin and then exit with status 1 two and a half minutes after it started.
    requests = f"own-requests-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": tansu_bootstrap})
    admin.create_topics([NewTopic(requests, 2, 1)])[requests].result(30)
    group = f"own-{uuid.uuid4().hex[:8]}"
    member = members(tansu_bootstrap, group, [requests])
    assigned = member.wait_assigned()
    reader = readers(tansu_bootstrap, group, requests)
    seen = await reader.read()
    assert seen.stable and seen.members == 1 and seen.partitions == (0, 1)
    assert not seen.assignments_reported
    assert seen.unowned == ()
    clock = Clock()

    async def never(*_: Any) -> None:
        raise AssertionError("not expected")

    watchdog = OwnershipWatchdog(
        topic=requests,
        describe=reader.read,
        rejoin=never,
        stop_process=never,
        thresholds=THRESHOLDS,
        clock=clock,
    )
    watchdog.on_assigned(tp.partition for tp in assigned)
    for _ in range(4):
        member.consumer.poll(0.1)
        await watchdog.check()
        clock.now += 60
    health = watchdog.health()
    assert health.healthy and health.summary == "ok", health
    assert health.detail["unowned"] is None
    assert health.detail["assignments_reported"] is False


async def test_watchdog_forgets_a_lapse_once_every_partition_is_owned_again() -> None:
    clock = Clock()
    states = [
        GroupOwnership("STABLE", (0, 1), {0: "a"}, 1),
        # A rebalance in progress does not count, in either direction.
        GroupOwnership("PREPARING_REBALANCE", (0, 1), {}, 1),
        GroupOwnership("STABLE", (0, 1), {0: "a", 1: "b"}, 2),
        GroupOwnership("STABLE", (0, 1), {1: "b"}, 1),
    ]
    rejoins: list[float] = []

    async def describe() -> GroupOwnership:
        return states.pop(0)

    async def rejoin() -> None:
        rejoins.append(clock.now)

    async def stop_process(reason: OwnershipLost) -> None:
        raise AssertionError(reason)

    watchdog = OwnershipWatchdog(
        topic="t",
        describe=describe,
        rejoin=rejoin,
        stop_process=stop_process,
        thresholds=THRESHOLDS,
        clock=clock,
    )
    await watchdog.check()
    clock.now += 31
    await watchdog.check()  # rebalancing: not judged
    assert rejoins == []
    await watchdog.check()  # owned again: the lapse is over
    assert watchdog.health().detail["unowned_for_s"] == 0
    clock.now += 100
    await watchdog.check()  # a new lapse starts now, not 131s ago
    assert rejoins == []
    assert watchdog.health().healthy


async def test_watchdog_keeps_running_while_the_group_cannot_be_read() -> None:
    async def describe() -> GroupOwnership:
        raise OSError("broker unreachable")

    async def never(*_: Any) -> None:
        raise AssertionError("not expected")

    watchdog = OwnershipWatchdog(
        topic="t", describe=describe, rejoin=never, stop_process=never, thresholds=THRESHOLDS
    )
    await watchdog.check()
    health = watchdog.health()
    assert health.healthy
    assert health.detail["last_error"] == "OSError: broker unreachable"


async def test_watchdog_stops_on_an_error_that_is_not_the_broker_being_away() -> None:
    async def describe() -> GroupOwnership:
        # A defect in reading the description, not an outage: waiting cannot fix it,
        # and a watchdog that only logs it guards nothing from then on.
        raise KeyError("members")

    async def never(*_: Any) -> None:
        raise AssertionError("not expected")

    watchdog = OwnershipWatchdog(
        topic="t", describe=describe, rejoin=never, stop_process=never, thresholds=THRESHOLDS
    )
    with pytest.raises(KeyError):
        await watchdog.check()


@pytest.fixture
def own_kafka() -> Iterator[ApacheKafkaService]:
    """A broker of our own, to stop and start again."""
    with ApacheKafkaService("") as broker:
        yield broker


def _thread_states(pid: int) -> list[str]:
    """The scheduler state of each thread of ``pid`` (``T``: stopped)."""
    states = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/stat") as stat:
            states.append(stat.read().rsplit(")", 1)[1].split()[0])
    return states


async def _all_threads_stopped(pid: int, *, timeout_s: float) -> str:
    """Once every thread of ``pid`` is in the stopped state: their states, for messages."""
    deadline = time.monotonic() + timeout_s
    while True:
        states = _thread_states(pid)
        if set(states) <= {"T", "t"} or time.monotonic() > deadline:
            return f"pid {pid}, thread states {''.join(sorted(states))}"
        await asyncio.sleep(0.05)


async def _owned(reader: OwnershipReader, *, timeout_s: float) -> GroupOwnership:
    """The first read showing a stable group owning every partition; reads may fail until then."""
    last: list[object] = []
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                try:
                    seen = await reader.read()
                except (KafkaError, OSError, TimeoutError) as exc:
                    last[:] = [exc]
                else:
                    last[:] = [seen]
                    if seen.stable and seen.partitions and not seen.unowned:
                        return seen
                await asyncio.sleep(0.3)
    except TimeoutError:
        raise AssertionError(f"the group never owned every partition; last read {last}") from None


async def test_reads_fail_cleanly_while_the_broker_is_away_and_succeed_once_it_is_back(
    own_kafka: ApacheKafkaService,
    new_topic: Callable[..., str],
    readers: Callable[..., OwnershipReader],
) -> None:
    bootstrap = own_kafka.bootstrap_servers
    requests = new_topic(bootstrap, 3, prefix="own-requests")
    group = f"own-{uuid.uuid4().hex[:8]}"
    reader = readers(bootstrap, group, requests, timeout_s=3.0)

    async def never(*_: Any) -> None:
        raise AssertionError("not expected")

    watchdog = OwnershipWatchdog(
        topic=requests,
        describe=reader.read,
        rejoin=never,
        stop_process=never,
        thresholds=THRESHOLDS,
    )
    member = AIOKafkaConsumer(
        requests,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        session_timeout_ms=30_000,
        heartbeat_interval_ms=1000,
    )
    await member.start()
    try:
        await _owned(reader, timeout_s=60)
        # Twice: the second outage meets the client the first one left behind.
        for _ in range(2):
            await asyncio.to_thread(own_kafka.halt)
            for _ in range(3):
                with pytest.raises((KafkaError, OSError, TimeoutError)):
                    await reader.read()
            await watchdog.check()
            health = watchdog.health()
            assert health.healthy and health.detail["last_error"], health

            await asyncio.to_thread(own_kafka.resume)
            seen = await _owned(reader, timeout_s=60)
            assert seen.partitions == (0, 1, 2) and seen.members == 1
            await watchdog.check()
            health = watchdog.health()
            assert "last_error" not in health.detail and health.detail["unowned"] == [], health

        # A broker that accepts connections but does not answer: the reads time
        # out (the client's own request timeout or the read's, whichever comes
        # first), and the answers arrive late, once it goes on.
        assert own_kafka.pid is not None
        os.kill(own_kafka.pid, signal.SIGSTOP)
        try:
            # Every thread stopped, not only signalled: a thread busy in the
            # kernel (a flush, under a loaded machine) stops when it leaves it.
            stopped = await _all_threads_stopped(own_kafka.pid, timeout_s=10)
            for _ in range(2):
                with pytest.raises((KafkaError, TimeoutError)):
                    seen = await reader.read()
                    raise AssertionError(f"read {seen} from a stopped broker ({stopped})")
        finally:
            os.kill(own_kafka.pid, signal.SIGCONT)
        await _owned(reader, timeout_s=60)
    finally:
        await member.stop()
