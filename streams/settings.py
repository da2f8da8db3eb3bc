"""The one settings object, read from the environment once.

Every variable is prefixed ``WFJOBS_`` except the two conventional ones,
``DATABASE_URL`` and ``KAFKA_BOOTSTRAP_SERVERS``. A malformed value fails fast
with the variable's name.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from schemas import defaults
from schemas.contract import DEFAULT_MAX_EVENT_BYTES, MIN_EVENT_BYTES
from schemas.errors import InvalidArgument
from store import pool
from streams.retention import DEFAULT_JOB_RETENTION, DEFAULT_OUTBOX_RETENTION, parse_policy

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    from store.retention import RetentionPolicy

ROLES = frozenset({"api", "worker", "relay"})


class SettingsError(InvalidArgument):
    """A configuration variable is missing or malformed."""


@dataclass(frozen=True)
class Settings:
    # Where things are.
    database_url: str = field(default="", metadata={"env": "DATABASE_URL"})
    kafka_bootstrap_servers: str = field(
        default=defaults.KAFKA_BOOTSTRAP_SERVERS, metadata={"env": "KAFKA_BOOTSTRAP_SERVERS"}
    )
    schema_registry_url: str = field(default="", metadata={"env": "WFJOBS_SCHEMA_REGISTRY_URL"})
    event_format: str = field(default="protobuf", metadata={"env": "WFJOBS_EVENT_FORMAT"})

    # Who this process is and what it does.
    worker_id: str = field(default="", metadata={"env": "WFJOBS_WORKER_ID"})
    roles: frozenset[str] = field(default=ROLES, metadata={"env": "WFJOBS_ROLES"})
    handler_modules: tuple[str, ...] = field(default=(), metadata={"env": "WFJOBS_HANDLERS"})

    # Topics.
    requests_topic: str = field(
        default=defaults.REQUESTS_TOPIC, metadata={"env": "WFJOBS_REQUESTS_TOPIC"}
    )
    events_topic: str = field(
        default=defaults.EVENTS_TOPIC, metadata={"env": "WFJOBS_EVENTS_TOPIC"}
    )
    # Create the requests, dead-letter and events topics when missing (dev
    # brokers; production provisions its topics).
    create_topics: bool = field(default=False, metadata={"env": "WFJOBS_CREATE_TOPICS"})
    topic_partitions: int = field(default=8, metadata={"env": "WFJOBS_TOPIC_PARTITIONS"})
    topic_replicas: int = field(default=1, metadata={"env": "WFJOBS_TOPIC_REPLICAS"})
    # Empty means "<requests_topic>.dlq"; see ``dlq_topic``.
    requests_dlq_topic: str = field(default="", metadata={"env": "WFJOBS_REQUESTS_DLQ_TOPIC"})
    # Also the Faust app id, which Faust uses as the Kafka consumer group id.
    consumer_group: str = field(default="workflow-jobs-worker", metadata={"env": "WFJOBS_GROUP"})
    # How long the group waits for a silent member, and for members to rejoin
    # during a rebalance. Some brokers (Tansu among them) hold a join for about
    # half of it, so a small value makes a development worker consume sooner.
    broker_session_timeout_s: float = field(
        default=60.0, metadata={"env": "WFJOBS_BROKER_SESSION_TIMEOUT_S"}
    )
    # Cap of the backoff a worker uses while its broker does not answer yet
    # (see streams.broker); the HTTP verbs and the loops run meanwhile.
    broker_retry_max_s: float = field(default=30.0, metadata={"env": "WFJOBS_BROKER_RETRY_MAX_S"})

    # Claim loops.
    claim_loops: int = field(default=4, metadata={"env": "WFJOBS_CLAIM_LOOPS"})
    claim_batch: int = field(default=8, metadata={"env": "WFJOBS_CLAIM_BATCH"})
    poll_interval_s: float = field(default=1.0, metadata={"env": "WFJOBS_POLL_INTERVAL_S"})
    lease_s: float = field(default=300.0, metadata={"env": "WFJOBS_LEASE_S"})
    heartbeat_s: float = field(default=0.0, metadata={"env": "WFJOBS_HEARTBEAT_S"})
    sweep_interval_s: float = field(default=10.0, metadata={"env": "WFJOBS_SWEEP_INTERVAL_S"})
    max_attempts: int = field(default=3, metadata={"env": "WFJOBS_MAX_ATTEMPTS"})
    retry_base_s: float = field(default=5.0, metadata={"env": "WFJOBS_RETRY_BASE_S"})
    max_concurrent_per_target: int = field(
        default=8, metadata={"env": "WFJOBS_MAX_CONCURRENT_PER_TARGET"}
    )
    # How long a stopping worker lets running segments finish before handing
    # the rest back to the queue.
    shutdown_grace_s: float = field(default=10.0, metadata={"env": "WFJOBS_SHUTDOWN_GRACE_S"})
    # Cap of the backoff the request agent uses while the store is unreachable.
    store_retry_max_s: float = field(default=30.0, metadata={"env": "WFJOBS_STORE_RETRY_MAX_S"})
    # Request topic ownership (streams.ownership): how often the group is
    # described, how long partitions may stay unowned in a stable group before
    # this member rejoins, and how long after that before the process exits.
    ownership_check_s: float = field(default=10.0, metadata={"env": "WFJOBS_OWNERSHIP_CHECK_S"})
    unowned_rejoin_s: float = field(default=30.0, metadata={"env": "WFJOBS_UNOWNED_REJOIN_S"})
    unowned_exit_s: float = field(default=120.0, metadata={"env": "WFJOBS_UNOWNED_EXIT_S"})

    # Outbox relay.
    relay_interval_s: float = field(default=0.5, metadata={"env": "WFJOBS_RELAY_INTERVAL_S"})
    relay_batch: int = field(default=100, metadata={"env": "WFJOBS_RELAY_BATCH"})
    # The producer's delivery deadline: how long a pass waits before it learns
    # that the broker is away (a transient fault, which spends no attempt).
    relay_message_timeout_ms: int = field(
        default=30_000, metadata={"env": "WFJOBS_RELAY_MESSAGE_TIMEOUT_MS"}
    )
    # Cap of the relay's backoff after passes that published nothing.
    relay_backoff_max_s: float = field(default=30.0, metadata={"env": "WFJOBS_RELAY_BACKOFF_MAX_S"})
    # How long the relay may be unable to publish, with rows waiting, before
    # /healthz calls it stuck.
    relay_stuck_after_s: float = field(
        default=120.0, metadata={"env": "WFJOBS_RELAY_STUCK_AFTER_S"}
    )
    # How long leased outbox rows stay a relay's; a relay that dies mid-publish
    # leaves them to another relay after this. Above the message timeout.
    relay_lease_s: float = field(default=60.0, metadata={"env": "WFJOBS_RELAY_LEASE_S"})

    # Retention (see streams.retention): PUBLISHED outbox rows and terminal
    # jobs older than these ages are deleted, in batches with a pause between.
    outbox_retention: str = field(
        default=DEFAULT_OUTBOX_RETENTION, metadata={"env": "WFJOBS_OUTBOX_RETENTION"}
    )
    job_retention: str = field(
        default=DEFAULT_JOB_RETENTION, metadata={"env": "WFJOBS_JOB_RETENTION"}
    )
    retention_interval_s: float = field(
        default=300.0, metadata={"env": "WFJOBS_RETENTION_INTERVAL_S"}
    )
    retention_batch: int = field(default=500, metadata={"env": "WFJOBS_RETENTION_BATCH"})
    retention_pause_s: float = field(default=0.1, metadata={"env": "WFJOBS_RETENTION_PAUSE_S"})

    # Store and web.
    pool_min_size: int = field(default=pool.DEFAULT_MIN_SIZE, metadata={"env": "WFJOBS_POOL_MIN"})
    pool_max_size: int = field(default=pool.DEFAULT_MAX_SIZE, metadata={"env": "WFJOBS_POOL_MAX"})
    # How long a caller waits for a pooled connection before the store counts
    # as unavailable (a 503 for the verbs, a retry for the loops).
    pool_timeout_s: float = field(
        default=pool.DEFAULT_TIMEOUT_S, metadata={"env": "WFJOBS_POOL_TIMEOUT_S"}
    )
    web_host: str = field(default=defaults.WEB_HOST, metadata={"env": "WFJOBS_WEB_HOST"})
    web_port: int = field(default=defaults.WEB_PORT, metadata={"env": "WFJOBS_WEB_PORT"})
    max_body_bytes: int = field(default=1_048_576, metadata={"env": "WFJOBS_MAX_BODY_BYTES"})
    # Largest encoded event (and job input) a commit point may write; larger
    # ones are refused before they are committed (see store.runs).
    max_event_bytes: int = field(
        default=DEFAULT_MAX_EVENT_BYTES, metadata={"env": "WFJOBS_MAX_EVENT_BYTES"}
    )
    # Admission control: no new job while this many are QUEUED; 0 turns it off
    # (see streams.admission).
    max_queued_jobs: int = field(default=0, metadata={"env": "WFJOBS_MAX_QUEUED_JOBS"})
    # Migrations are a deployment step (``wfjobs migrate``, the compose file's
    # one-shot service); a worker applies them itself only when asked to.
    auto_migrate: bool = field(default=False, metadata={"env": "WFJOBS_AUTO_MIGRATE"})
    # Where Faust keeps its local state; empty means Faust's default
    # ("<app id>-data" under the working directory). No tables live there.
    data_dir: str = field(default="", metadata={"env": "WFJOBS_DATA_DIR"})

    @property
    def store_configured(self) -> bool:
        return bool(self.database_url)

    @property
    def dlq_topic(self) -> str:
        """Where undecodable requests go: explicit, else ``<requests_topic>.dlq``."""
        return self.requests_dlq_topic or defaults.dlq_topic_for(self.requests_topic)

    @property
    def broker_url(self) -> str:
        """Faust's broker URL list: ``kafka://`` before each bootstrap server."""
        servers = [s.strip() for s in self.kafka_bootstrap_servers.split(",") if s.strip()]
        return ";".join(f"kafka://{server}" for server in servers)

    def open_registry(self) -> SchemaRegistryClient | None:
        """A client of ``WFJOBS_SCHEMA_REGISTRY_URL``, or ``None`` when none is configured."""
        if not self.schema_registry_url:
            return None
        # Imported here: the settings are read by processes that never touch a registry.
        from schemas.serde import open_registry

        return open_registry(
            self.schema_registry_url,
            events_topic=self.events_topic,
            requests_topic=self.requests_topic,
        )

    def env_name(self, attribute: str) -> str:
        for f in fields(self):
            if f.name == attribute:
                return str(f.metadata["env"])
        raise KeyError(attribute)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            name = f.metadata["env"]
            raw = environ.get(name)
            if raw is None or raw == "":
                continue
            values[f.name] = _parse(name, raw, f.default)
        settings = cls(**values)
        settings._check()
        return settings

    def require_worker_id(self) -> str:
        if not self.worker_id.strip():
            raise SettingsError(
                "WFJOBS_WORKER_ID is required and must not be blank: it is written into "
                "lease_owner so a job row tells which worker holds it"
            )
        return self.worker_id.strip()

    def _check(self) -> None:
        unknown = self.roles - ROLES
        if unknown or not self.roles:
            raise SettingsError(
                f"WFJOBS_ROLES must be a comma-separated subset of {sorted(ROLES)}, "
                f"got {sorted(self.roles)}"
            )
        if self.event_format not in {"protobuf", "avro"}:
            raise SettingsError(
                f"WFJOBS_EVENT_FORMAT must be 'protobuf' or 'avro', got {self.event_format!r}"
            )
        if self.event_format == "avro" and not self.schema_registry_url:
            raise SettingsError(
                "WFJOBS_EVENT_FORMAT=avro needs WFJOBS_SCHEMA_REGISTRY_URL: Avro events "
                "carry the registry's schema id"
            )
        positive = (
            "claim_loops",
            "claim_batch",
            "poll_interval_s",
            "lease_s",
            "sweep_interval_s",
            "max_attempts",
            "retry_base_s",
            "max_concurrent_per_target",
            "relay_interval_s",
            "relay_batch",
            "relay_message_timeout_ms",
            "relay_backoff_max_s",
            "relay_stuck_after_s",
            "relay_lease_s",
            "pool_max_size",
            "pool_timeout_s",
            "max_body_bytes",
            "shutdown_grace_s",
            "topic_partitions",
            "topic_replicas",
            "store_retry_max_s",
            "ownership_check_s",
            "unowned_rejoin_s",
            "unowned_exit_s",
            "broker_session_timeout_s",
            "broker_retry_max_s",
            "retention_interval_s",
            "retention_batch",
        )
        for attribute in positive:
            if getattr(self, attribute) <= 0:
                raise SettingsError(
                    f"{self.env_name(attribute)} must be positive, got {getattr(self, attribute)}"
                )
        if self.max_event_bytes < MIN_EVENT_BYTES:
            raise SettingsError(
                f"WFJOBS_MAX_EVENT_BYTES must be at least {MIN_EVENT_BYTES}, "
                f"got {self.max_event_bytes}"
            )
        if self.relay_lease_s * 1000 <= self.relay_message_timeout_ms:
            raise SettingsError(
                "WFJOBS_RELAY_LEASE_S must be longer than WFJOBS_RELAY_MESSAGE_TIMEOUT_MS: "
                "a lease that runs out mid-publish hands the rows to another relay"
            )
        if self.retention_pause_s < 0:
            raise SettingsError(
                f"WFJOBS_RETENTION_PAUSE_S must not be negative, got {self.retention_pause_s}"
            )
        self.retention_policy()
        if self.max_queued_jobs < 0:
            raise SettingsError(
                f"WFJOBS_MAX_QUEUED_JOBS must be 0 (no cap) or positive, got {self.max_queued_jobs}"
            )
        if self.pool_min_size < 0 or self.pool_min_size > self.pool_max_size:
            raise SettingsError("WFJOBS_POOL_MIN must be between 0 and WFJOBS_POOL_MAX")
        if not self.kafka_bootstrap_servers.strip():
            raise SettingsError("KAFKA_BOOTSTRAP_SERVERS must name at least one host:port")
        if not self.consumer_group.strip():
            raise SettingsError("WFJOBS_GROUP must not be blank")
        if not 0 < self.web_port < 65536:
            raise SettingsError(f"WFJOBS_WEB_PORT must be a TCP port, got {self.web_port}")
        if self.heartbeat_s < 0 or self.heartbeat_s >= self.lease_s:
            raise SettingsError("WFJOBS_HEARTBEAT_S must be >= 0 and below WFJOBS_LEASE_S")

    def retention_policy(self) -> RetentionPolicy:
        """``WFJOBS_OUTBOX_RETENTION`` and ``WFJOBS_JOB_RETENTION``, parsed."""
        try:
            return parse_policy(self.outbox_retention, self.job_retention)
        except ValueError as exc:
            raise SettingsError(str(exc)) from None

    @property
    def effective_heartbeat_s(self) -> float:
        """Extend the lease a third of the way into it unless told otherwise."""
        return self.heartbeat_s or self.lease_s / 3


def _parse(name: str, raw: str, default: Any) -> Any:
    try:
        if isinstance(default, bool):
            lowered = raw.strip().lower()
            if lowered not in {"1", "0", "true", "false", "yes", "no"}:
                raise ValueError(raw)
            return lowered in {"1", "true", "yes"}
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
        if isinstance(default, frozenset):
            return frozenset(part.strip() for part in raw.split(",") if part.strip())
        if isinstance(default, tuple):
            return tuple(part.strip() for part in raw.split(",") if part.strip())
        return raw
    except ValueError:
        kind = {
            "bool": "boolean (true/false)",
            "int": "an integer",
            "float": "a number",
        }.get(type(default).__name__, type(default).__name__)
        raise SettingsError(f"{name} must be {kind}, got {raw!r}") from None
