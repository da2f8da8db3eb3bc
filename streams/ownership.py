"""Every partition of the request topic has an owner, or the process says so and goes.

A request the broker acknowledged on ``workflow-run-requests`` is only ever
submitted if some member of the request agent's consumer group owns its
partition. Two things here keep that true.

**The root cause, fixed where it lives.** The group leader computes the
assignment from its client's cluster metadata. Right after a broker restart
that metadata can lack the request topic (the broker answered the metadata
request before it knew the topic's partitions again), and Faust's assignor then
skips the topic: every member gets the empty set, the group is stable, and
nothing asks again. aiokafka only notices a topic's partitions changing when
its metadata is refreshed, which is every ``metadata_max_age_ms`` (five
minutes) when no fetch fails, and an empty assignment fetches nothing. And a
member that fetched nothing for ``broker_max_poll_interval`` leaves the group
and refuses to rejoin, so a short gap can become a permanent one.
``OwnershipAssignor`` is Faust's assignor plus what the Java client does since
KAFKA-4631: when a subscribed topic has no partitions in the metadata it
assigned from, it refreshes the metadata with a short backoff until they
appear. The coordinator compares the partition counts after each refresh with
the ones the assignment used and rejoins the group as soon as they differ.

**The watchdog, for whatever else.** ``OwnershipWatchdog`` reads the group's
description from the broker (the admin API, off the event loop) every
``WFJOBS_OWNERSHIP_CHECK_S``. When the group is stable and some partitions of
the request topic have no owner for ``WFJOBS_UNOWNED_REJOIN_S``, it refreshes
this member's metadata and makes it rejoin the group; when they still have
none ``WFJOBS_UNOWNED_EXIT_S`` later, it logs the unowned partitions and stops
the process with a non-zero exit code so the orchestrator starts a fresh one.
Its state is the ``requests`` part of ``/healthz`` and ``/readyz``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import mode
from confluent_kafka import ConsumerGroupState, ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient

# Where the stubs type it; confluent_kafka.admin re-exports it untyped.
from confluent_kafka.admin._listoffsets import OffsetSpec
from faust.assignor import PartitionAssignor
from faust.types import AppT

from streams.health import PartHealth

if TYPE_CHECKING:
    import faust

    from streams.runtime import Runtime

log = logging.getLogger(__name__)

# How long one admin request may take before the check counts as failed.
ADMIN_TIMEOUT_S = 10.0


class OwnershipLost(RuntimeError):
    """Partitions of the request topic stayed unowned although this member rejoined."""


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True, slots=True)
class GroupOwnership:
    """Who owns which partition of one topic in one consumer group, as the broker says."""

    # The group's state as the coordinator names it: STABLE, PREPARING_REBALANCE,
    # COMPLETING_REBALANCE, EMPTY, DEAD or UNKNOWN.
    state: str
    # Every partition of the topic (empty when the broker does not know the topic).
    partitions: tuple[int, ...]
    # Partition -> the member id holding it.
    owners: Mapping[int, str]
    members: int
    # Partition -> records not yet committed by the group (high watermark minus
    # the committed offset, or minus the log start when nothing is committed).
    lag: Mapping[int, int] = field(default_factory=dict)

    @property
    def stable(self) -> bool:
        return self.state == "STABLE"

    @property
    def unowned(self) -> tuple[int, ...]:
        return tuple(p for p in self.partitions if p not in self.owners)


def read_ownership(
    admin: AdminClient, group: str, topic: str, *, timeout_s: float = ADMIN_TIMEOUT_S
) -> GroupOwnership:
    """The group's ownership of ``topic`` (blocking: run it in a thread)."""
    meta = admin.list_topics(topic=topic, timeout=timeout_s).topics.get(topic)
    partitions: tuple[int, ...] = ()
    if meta is not None and meta.error is None:
        partitions = tuple(sorted(meta.partitions))
    description = admin.describe_consumer_groups([group], request_timeout=timeout_s)[group].result(
        timeout=timeout_s + 1
    )
    owners: dict[int, str] = {}
    for member in description.members:
        assignment = member.assignment
        for tp in assignment.topic_partitions if assignment is not None else ():
            if tp.topic == topic:
                owners[tp.partition] = member.member_id
    state = description.state
    name = state.name if isinstance(state, ConsumerGroupState) else str(state)
    return GroupOwnership(
        state=name,
        partitions=partitions,
        owners=owners,
        members=len(description.members),
        lag=_lag(admin, group, topic, partitions, timeout_s) if partitions else {},
    )


def _lag(
    admin: AdminClient, group: str, topic: str, partitions: tuple[int, ...], timeout_s: float
) -> dict[int, int]:
    tps = [TopicPartition(topic, p) for p in partitions]
    committed_result = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, tps)], request_timeout=timeout_s
    )[group].result(timeout=timeout_s + 1)
    committed = {tp.partition: tp.offset for tp in committed_result.topic_partitions or ()}
    # The stubs leave the factories untyped.
    spec: Any = OffsetSpec
    latest = admin.list_offsets({tp: spec.latest() for tp in tps}, request_timeout=timeout_s)
    earliest = admin.list_offsets({tp: spec.earliest() for tp in tps}, request_timeout=timeout_s)
    lag = {}
    for tp in tps:
        high = latest[tp].result(timeout=timeout_s + 1).offset
        start = committed.get(tp.partition, -1)
        if start < 0:
            start = earliest[tp].result(timeout=timeout_s + 1).offset
        lag[tp.partition] = max(0, high - start)
    return lag


# --------------------------------------------------------------------------- the assignor


class OwnershipAssignor(PartitionAssignor):
    """Faust's assignor that does not let a topic missing from the metadata stay unassigned.

    ``assign`` runs on the group leader, in the consumer's event loop, with the
    leader client's cluster metadata. A subscribed topic without partitions
    there is skipped by the assignment (nothing else can be done with it), and
    a task refreshes the metadata with a growing pause (``refresh_base_s`` up to
    ``refresh_cap_s``) until the topic's partitions are known; the coordinator
    then sees the partition count differ from the one it assigned with and
    rejoins the group.
    """

    refresh_base_s = 0.2
    refresh_cap_s = 5.0

    _refresher: asyncio.Task[None] | None = None

    def assign(self, cluster: Any, member_metadata: Any) -> Any:
        assignment = super().assign(cluster, member_metadata)
        subscribed = {topic for meta in member_metadata.values() for topic in meta.subscription}
        missing = sorted(topic for topic in subscribed if not cluster.partitions_for_topic(topic))
        if self._refresher is not None:
            self._refresher.cancel()
            self._refresher = None
        if missing:
            log.warning(
                "assigned the group without topic(s) %s: the broker's metadata has no "
                "partitions for them yet; refreshing it until it has",
                ", ".join(missing),
            )
            self._refresher = asyncio.get_running_loop().create_task(
                self._refresh_until_known(cluster, missing), name="ownership-metadata-refresh"
            )
        return assignment

    async def _refresh_until_known(self, cluster: Any, topics: list[str]) -> None:
        pause = self.refresh_base_s
        while any(not cluster.partitions_for_topic(topic) for topic in topics):
            await asyncio.sleep(pause)
            pause = min(self.refresh_cap_s, pause * 2)
            try:
                await aiokafka_consumer(self.app)._client.force_metadata_update()
            except Exception as exc:
                log.warning("metadata refresh failed: %s: %s", type(exc).__name__, exc)
        log.info("partitions of %s are known again; the group rebalances", ", ".join(topics))


def aiokafka_consumer(app: AppT) -> Any:
    """The ``AIOKafkaConsumer`` behind Faust's consumer (it lives in the consumer thread)."""
    return app.consumer._thread._ensure_consumer()  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- the watchdog


@dataclass(frozen=True, slots=True)
class Thresholds:
    interval_s: float
    rejoin_after_s: float
    exit_after_s: float


class OwnershipWatchdog(mode.Service):
    """Checks the group's ownership of the request topic; rejoins, then exits, when it lapses.

    ``describe`` reads the group (``read_ownership`` in production), ``rejoin``
    makes this member rejoin, ``stop_process`` ends the process with the reason.
    The clock is injectable so the escalation can be tested without waiting.
    """

    def __init__(
        self,
        *,
        topic: str,
        describe: Callable[[], Awaitable[GroupOwnership]],
        rejoin: Callable[[], Awaitable[None]],
        stop_process: Callable[[OwnershipLost], Awaitable[None]],
        thresholds: Thresholds,
        clock: Callable[[], float] = time.monotonic,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._topic = topic
        self._describe = describe
        self._rejoin = rejoin
        self._stop_process = stop_process
        self._thresholds = thresholds
        self._clock = clock
        self.assigned: frozenset[int] | None = None
        self.last: GroupOwnership | None = None
        self.last_error = ""
        self._unowned_since: float | None = None
        self._rejoined_at: float | None = None
        self.rejoins = 0
        self._lost = False

    # ------------------------------------------------------------------ inputs

    def on_assigned(self, partitions: Iterable[int]) -> None:
        """This member's partitions of the request topic after a rebalance."""
        self.assigned = frozenset(partitions)

    @mode.Service.task
    async def _watch(self) -> None:
        while not self.should_stop:
            await self.check()
            await self.sleep(self._thresholds.interval_s)

    async def check(self) -> None:
        """One look at the group, and the next step of the escalation if one is due."""
        try:
            seen = await self._describe()
        except Exception as exc:
            # The broker is away: nothing can be consumed, and nothing can be
            # judged either. The clock of an ongoing lapse keeps running.
            error = f"{type(exc).__name__}: {exc}"
            if error != self.last_error:
                log.warning("request topic ownership not read: %s", error)
            self.last_error = error
            return
        self.last, self.last_error = seen, ""
        now = self._clock()
        if not seen.stable or not seen.unowned:
            # A rebalance in progress hands partitions out again; only a
            # settled group leaving some behind is stuck.
            if not seen.unowned and self._unowned_since is not None:
                log.info("every partition of %s has an owner again", self._topic)
                self._unowned_since = self._rejoined_at = None
            return
        if self._unowned_since is None:
            self._unowned_since = now
            log.warning(
                "partition(s) %s of %s have no owner in a stable group",
                _names(seen.unowned),
                self._topic,
            )
            return
        lapse = now - self._unowned_since
        t = self._thresholds
        if self._rejoined_at is None and lapse >= t.rejoin_after_s:
            log.warning(
                "partition(s) %s of %s unowned for %.0fs: rejoining the group",
                _names(seen.unowned),
                self._topic,
                lapse,
            )
            self._rejoined_at = now
            self.rejoins += 1
            try:
                await self._rejoin()
            except Exception as exc:
                # The exit deadline still runs from here: a member that cannot
                # even ask to rejoin is restarted like one whose rejoin did not help.
                log.warning("rejoin not requested: %s: %s", type(exc).__name__, exc)
        elif self._rejoined_at is not None and now - self._rejoined_at >= t.exit_after_s:
            self._lost = True
            reason = OwnershipLost(
                f"partition(s) {_names(seen.unowned)} of {self._topic} have had no owner for "
                f"{lapse:.0f}s, also after this member rejoined the group; stopping so the "
                "process is restarted"
            )
            log.critical("%s", reason)
            await self._stop_process(reason)

    # ------------------------------------------------------------------ health

    def health(self) -> PartHealth:
        seen = self.last
        detail: dict[str, Any] = {
            "topic": self._topic,
            "assigned": sorted(self.assigned) if self.assigned is not None else None,
            "unowned": list(seen.unowned) if seen is not None else None,
            "rejoins": self.rejoins,
        }
        if seen is not None:
            detail["group_state"] = seen.state
            detail["members"] = seen.members
            if seen.lag:
                detail["lag"] = sum(seen.lag.values())
        if self.last_error:
            detail["last_error"] = self.last_error
        unowned_for = (
            self._clock() - self._unowned_since if self._unowned_since is not None else 0.0
        )
        detail["unowned_for_s"] = round(unowned_for, 1)
        t = self._thresholds
        stuck = self._lost or unowned_for >= t.rejoin_after_s + t.exit_after_s
        ready = self.assigned is not None
        if stuck and seen is not None:
            summary = f"partition(s) {_names(seen.unowned)} unowned for {unowned_for:.0f}s"
        elif self._unowned_since is not None and seen is not None:
            summary = f"partition(s) {_names(seen.unowned)} unowned; rejoining"
        elif not ready:
            summary = "waiting for the first partition assignment"
        else:
            summary = "ok"
        return PartHealth(
            "requests", healthy=not stuck, ready=ready, summary=summary, detail=detail
        )


def _names(partitions: Iterable[int]) -> str:
    return ", ".join(str(p) for p in partitions)


# --------------------------------------------------------------------------- wiring


def install_ownership(app: faust.App, runtime: Runtime, topic: str) -> OwnershipWatchdog:
    """The assignor fix and the watchdog for ``topic``'s consumer group in ``app``."""
    settings = runtime.settings
    # Set before the consumer exists: Faust builds its assignor from this lazily.
    cast(Any, app.conf).PartitionAssignor = OwnershipAssignor
    admins: list[AdminClient] = []

    def read() -> GroupOwnership:
        # Made on first use: building the app must not open connections.
        if not admins:
            admins.append(
                AdminClient({"bootstrap.servers": settings.kafka_bootstrap_servers, "log_level": 0})
            )
        return read_ownership(admins[0], settings.consumer_group, topic)

    async def describe() -> GroupOwnership:
        return await asyncio.to_thread(read)

    async def rejoin() -> None:
        consumer = aiokafka_consumer(app)

        async def in_consumer_thread() -> None:
            # Fresh metadata first: the leader assigns from what its client knows.
            await consumer._client.force_metadata_update()
            consumer._coordinator.request_rejoin()

        # aiokafka lives in Faust's consumer thread, with its own event loop.
        await app.consumer._thread.call_thread(in_consumer_thread)  # type: ignore[attr-defined]

    async def stop_process(reason: OwnershipLost) -> None:
        # A crashed app stops every service and the worker exits with status 1.
        await app.crash(reason)

    watchdog = OwnershipWatchdog(
        topic=topic,
        describe=describe,
        rejoin=rejoin,
        stop_process=stop_process,
        thresholds=Thresholds(
            interval_s=settings.ownership_check_s,
            rejoin_after_s=settings.unowned_rejoin_s,
            exit_after_s=settings.unowned_exit_s,
        ),
    )

    async def on_assigned(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        (assigned,) = args
        watchdog.on_assigned(tp.partition for tp in assigned if tp.topic == topic)

    app.on_partitions_assigned.connect(on_assigned)
    app.add_dependency(watchdog)
    runtime.register_health(watchdog.health)
    return watchdog


__all__ = [
    "GroupOwnership",
    "OwnershipAssignor",
    "OwnershipLost",
    "OwnershipWatchdog",
    "Thresholds",
    "install_ownership",
    "read_ownership",
]
