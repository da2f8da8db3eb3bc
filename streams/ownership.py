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
description from the broker (aiokafka's admin client, never librdkafka's) every
``WFJOBS_OWNERSHIP_CHECK_S``. When the group is settled (stable, or left by
every member once this one had joined) and some partitions of the request
topic have no owner for ``WFJOBS_UNOWNED_REJOIN_S``, it refreshes this
member's metadata and makes it rejoin the group; when they still have
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
from aiokafka.admin import AIOKafkaAdminClient  # type: ignore[import-untyped]
from aiokafka.coordinator.protocol import (  # type: ignore[import-untyped]
    ConsumerProtocol,
    ConsumerProtocolMemberAssignment,
)
from aiokafka.errors import (  # type: ignore[import-untyped]
    KafkaConnectionError,
    KafkaError,
    LeaderNotAvailableError,
    for_code,
)
from aiokafka.protocol.metadata import MetadataRequest  # type: ignore[import-untyped]
from aiokafka.protocol.offset import OffsetRequest  # type: ignore[import-untyped]
from aiokafka.structs import TopicPartition  # type: ignore[import-untyped]
from faust.assignor import PartitionAssignor
from faust.types import AppT

from streams.backoff import Backoff
from streams.health import PartHealth
from streams.kafka_security import bootstrap_servers, kafka_security
from streams.metrics import request_lag_families

if TYPE_CHECKING:
    import faust

    from streams.runtime import Runtime
    from streams.settings import Settings

log = logging.getLogger(__name__)

# How long one read of the group may take before the check counts as failed.
ADMIN_TIMEOUT_S = 10.0

# The coordinator's names for a group's states, as the watchdog and /healthz spell them.
_GROUP_STATES = {
    "Stable": "STABLE",
    "PreparingRebalance": "PREPARING_REBALANCE",
    "CompletingRebalance": "COMPLETING_REBALANCE",
    "Empty": "EMPTY",
    "Dead": "DEAD",
}
# States in which no rebalance is coming to hand partitions out: a group
# nobody is left in (EMPTY, or DEAD once its metadata is gone) consumes
# nothing, whichever of its members was meant to.
_SETTLED_STATES = frozenset({"STABLE", "EMPTY", "DEAD"})
# ListOffsets' timestamps for the end and the start of a partition's log.
_LATEST = -1
_EARLIEST = -2
# What reading the group raises while the broker is away, refuses this client or
# answers late, as for the broker check (streams.broker): certificate errors are
# OSErrors, a SCRAM exchange the server gets wrong a ValueError.
_BROKER_AWAY = (KafkaError, OSError, TimeoutError, ValueError)


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
    # False when the broker described a stable group's members without any of
    # their assignments, as Tansu does: who owns what is then not known, and
    # no partition counts as unowned.
    assignments_reported: bool = True

    @property
    def stable(self) -> bool:
        return self.state == "STABLE"

    @property
    def settled(self) -> bool:
        """No rebalance in progress: stable, or with no member to hand partitions to."""
        return self.state in _SETTLED_STATES

    @property
    def unowned(self) -> tuple[int, ...]:
        if not self.assignments_reported:
            return ()
        return tuple(p for p in self.partitions if p not in self.owners)


async def read_ownership(
    admin: Any, group: str, topic: str, *, timeout_s: float = ADMIN_TIMEOUT_S
) -> GroupOwnership:
    """The group's ownership of ``topic``, read with a started ``AIOKafkaAdminClient``."""
    async with asyncio.timeout(timeout_s):
        leaders = await _partition_leaders(admin, topic)
        coordinator = await admin.find_coordinator(group)
        (response,) = await admin.describe_consumer_groups([group], coordinator)
        (description,) = response.to_object()["groups"]
        if description["error_code"]:
            raise for_code(description["error_code"])(f"group {group} not described")
        owners: dict[int, str] = {}
        # Only the consumer protocol's assignment is a list of topic partitions;
        # while the group rebalances a member's assignment is empty.
        consumer = description["protocol_type"] == ConsumerProtocol.PROTOCOL_TYPE
        for member in description["members"] if consumer else ():
            if not member["member_assignment"]:
                continue
            assignment = ConsumerProtocolMemberAssignment.decode(member["member_assignment"])
            for assigned, partitions in assignment.assignment:
                if assigned == topic:
                    owners.update(dict.fromkeys(partitions, member["member_id"]))
        partitions = tuple(sorted(leaders))
        state = _GROUP_STATES.get(description["state"], "UNKNOWN")
        # Each member of a stable group carries the assignment the leader gave
        # it, an empty one included; none at all is a broker that does not say.
        members = description["members"]
        silent = state == "STABLE" and bool(members)
        silent = silent and not any(member["member_assignment"] for member in members)
        return GroupOwnership(
            state=state,
            partitions=partitions,
            owners=owners,
            members=len(members),
            lag=await _lag(admin, group, coordinator, topic, leaders) if partitions else {},
            assignments_reported=not silent,
        )


async def _partition_leaders(admin: Any, topic: str) -> dict[int, int]:
    """Partition -> its leader's node id; empty when the broker does not know the topic."""
    client = admin._client
    node = client.get_random_node()
    if node is None:
        raise KafkaConnectionError("no broker known to ask for metadata")
    # The admin's own describe_topics lets the broker create a topic it does
    # not know; asking about the request topic must never create it.
    response = await client.send(node, MetadataRequest([topic], allow_auto_topic_creation=False))
    # The leaders' addresses, for the offset requests sent to them.
    client.cluster.update_metadata(response)
    for entry in response.to_object()["topics"]:
        if entry["topic"] == topic and not entry["error_code"]:
            return {p["partition"]: p["leader"] for p in entry["partitions"]}
    return {}


async def _lag(
    admin: Any, group: str, coordinator: int, topic: str, leaders: Mapping[int, int]
) -> dict[int, int]:
    tps = [TopicPartition(topic, p) for p in sorted(leaders)]
    committed = await admin.list_consumer_group_offsets(group, coordinator, tps)
    start = {tp.partition: committed[tp].offset if tp in committed else -1 for tp in tps}
    high = await _offsets(admin, topic, leaders, list(start), _LATEST)
    uncommitted = [p for p, offset in start.items() if offset < 0]
    if uncommitted:
        start.update(await _offsets(admin, topic, leaders, uncommitted, _EARLIEST))
    return {p: max(0, high[p] - start[p]) for p in start}


async def _offsets(
    admin: Any, topic: str, leaders: Mapping[int, int], partitions: list[int], spec: int
) -> dict[int, int]:
    """The log end (``_LATEST``) or start (``_EARLIEST``) of ``partitions``, from their leaders."""
    by_leader: dict[int, list[tuple[int, int]]] = {}
    for p in partitions:
        if leaders[p] < 0:
            raise LeaderNotAvailableError(f"partition {p} of {topic} has no leader")
        by_leader.setdefault(leaders[p], []).append((p, spec))
    offsets: dict[int, int] = {}
    for leader, asked in by_leader.items():
        # Replica -1: a client, not a follower; isolation 0: up to the high watermark.
        response = await admin._client.send(leader, OffsetRequest(-1, 0, [(topic, asked)]))
        for entry in response.to_object()["topics"]:
            for part in entry["partitions"]:
                if part["error_code"]:
                    raise for_code(part["error_code"])(
                        f"no offset for partition {part['partition']} of {topic}"
                    )
                offsets[part["partition"]] = part["offset"]
    return offsets


class OwnershipReader(mode.Service):
    """Reads one group's ownership of one topic through an admin client it keeps.

    The client is made on the first read, so building the app opens no
    connection, and closed with the service. A read that fails drops it and the
    next read makes a new one: nothing of a connection the broker's restart
    broke is carried over, and while the broker is away a read fails fast at
    the bootstrap. Everything is aiokafka on this event loop: librdkafka's
    admin requests abort the whole process when they time out across a broker
    restart (confluentinc/librdkafka#4605).
    """

    def __init__(
        self,
        bootstrap_servers: str,
        group: str,
        topic: str,
        *,
        timeout_s: float = ADMIN_TIMEOUT_S,
        security: Callable[[], Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        """``security``: aiokafka's TLS and SASL keyword arguments (``KafkaSecurity.aiokafka``),
        asked for each client made, so a secret read from a file is read again."""
        super().__init__(**kwargs)
        self._servers = [s.strip() for s in bootstrap_servers.split(",") if s.strip()]
        self._security = security
        self._group = group
        self._topic = topic
        self._timeout_s = timeout_s
        self._admin: Any = None
        self._lock = asyncio.Lock()

    async def read(self) -> GroupOwnership:
        async with self._lock:
            try:
                async with asyncio.timeout(self._timeout_s):
                    if self._admin is None:
                        self._admin = AIOKafkaAdminClient(
                            bootstrap_servers=self._servers,
                            client_id="workflow-jobs-ownership",
                            request_timeout_ms=int(self._timeout_s * 1000),
                            **(self._security() if self._security is not None else {}),
                        )
                        await self._admin.start()
                    return await read_ownership(
                        self._admin, self._group, self._topic, timeout_s=self._timeout_s
                    )
            except BaseException:
                await self._drop()
                raise

    async def on_stop(self) -> None:
        async with self._lock:
            await self._drop()

    async def _drop(self) -> None:
        admin, self._admin = self._admin, None
        if admin is None:
            return
        try:
            async with asyncio.timeout(self._timeout_s):
                await admin.close()
        except Exception as exc:
            log.debug("admin client not closed cleanly: %s: %s", type(exc).__name__, exc)


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
        backoff = Backoff(self.refresh_base_s, self.refresh_cap_s)
        while any(not cluster.partitions_for_topic(topic) for topic in topics):
            await asyncio.sleep(backoff.next())
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
        except _BROKER_AWAY as exc:
            # The broker is away: nothing can be consumed, and nothing can be
            # judged either. The clock of an ongoing lapse keeps running.
            # Anything else is a defect, and crashes the service: a watchdog
            # that only logged it would guard nothing from then on.
            error = _describe_error(exc)
            if error != self.last_error:
                log.warning("request topic ownership not read: %s", error)
            self.last_error = error
            return
        self.last, self.last_error = seen, ""
        now = self._clock()
        # A group nobody is in, once this member had joined it, means this
        # member left it too: nothing consumes the topic any more. Before
        # that, it only means the member is still joining (not ready yet).
        settled = seen.stable or (seen.settled and self.assigned is not None)
        if not settled or not seen.unowned:
            # A rebalance in progress hands partitions out again; only a
            # settled group leaving some behind is stuck.
            if not seen.unowned and self._unowned_since is not None:
                log.info("every partition of %s has an owner again", self._topic)
                self._unowned_since = self._rejoined_at = None
            return
        if self._unowned_since is None:
            self._unowned_since = now
            log.warning(
                "partition(s) %s of %s have no owner in a settled group (%s)",
                _names(seen.unowned),
                self._topic,
                seen.state,
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
            "unowned": (
                list(seen.unowned) if seen is not None and seen.assignments_reported else None
            ),
            "rejoins": self.rejoins,
        }
        if seen is not None:
            if not seen.assignments_reported:
                detail["assignments_reported"] = False
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


def _describe_error(exc: BaseException) -> str:
    """The error once: aiokafka's messages already start with their class name."""
    name, text = type(exc).__name__, str(exc)
    return text if text.startswith(name) else f"{name}: {text}" if text else name


def _names(partitions: Iterable[int]) -> str:
    return ", ".join(str(p) for p in partitions)


# --------------------------------------------------------------------------- wiring


def ownership_reader(settings: Settings, topic: str) -> OwnershipReader:
    """The reader of the request agent's group: every admin client it makes is
    secured as the settings say, their secret files read again for it."""
    return OwnershipReader(
        ",".join(bootstrap_servers(settings)),
        settings.consumer_group,
        topic,
        security=lambda: kafka_security(settings).aiokafka(),
    )


def install_ownership(app: faust.App, runtime: Runtime, topic: str) -> OwnershipWatchdog:
    """The assignor fix and the watchdog for ``topic``'s consumer group in ``app``."""
    settings = runtime.settings
    # Set before the consumer exists: Faust builds its assignor from this lazily.
    cast(Any, app.conf).PartitionAssignor = OwnershipAssignor
    reader = ownership_reader(settings, topic)

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
        describe=reader.read,
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
    # Started before the watchdog's first read, closed after its last.
    watchdog.add_dependency(reader)
    app.add_dependency(watchdog)
    runtime.register_health(watchdog.health)
    runtime.add_metrics_reading(
        lambda: request_lag_families(watchdog.last.lag if watchdog.last is not None else None)
    )
    return watchdog


__all__ = [
    "GroupOwnership",
    "OwnershipAssignor",
    "OwnershipLost",
    "OwnershipReader",
    "OwnershipWatchdog",
    "Thresholds",
    "install_ownership",
    "ownership_reader",
    "read_ownership",
]
