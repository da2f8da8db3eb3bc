"""The one settings object, read from the environment once.

Every variable is prefixed ``WFJOBS_`` except the two conventional ones,
``DATABASE_URL`` and ``KAFKA_BOOTSTRAP_SERVERS``. A malformed value fails fast
with the variable's name.
"""

from __future__ import annotations

import math
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from schemas import defaults
from schemas.contract import DEFAULT_MAX_EVENT_BYTES, MIN_EVENT_BYTES
from schemas.errors import InvalidArgument
from store import databases, pool
from store.runs import MAX_ATTEMPTS_CEILING, RETRY_MAX_CEILING_S
from store.tokens import validate_principal
from streams import kafka_security as client_security
from streams import tracing
from streams.retention import DEFAULT_JOB_RETENTION, DEFAULT_OUTBOX_RETENTION, parse_policy
from workflows.rules import (
    DEFAULT_RULE_CHARS,
    DEFAULT_RULE_COST,
    DEFAULT_RULE_NESTING,
    MAX_RULE_CHARS,
    RuleLimits,
)
from workflows.targets import TargetPolicy, TlsRule

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    from store.retention import RetentionPolicy

ROLES = frozenset({"api", "worker", "relay"})
# What a broker accepts as a topic name (Kafka's Topic.validate); "." and ".."
# are refused as well.
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
_TOPICS = ("requests_topic", "events_topic", "completions_topic", "completion_results_topic")


class SettingsError(InvalidArgument):
    """A configuration variable is missing or malformed."""


@dataclass(frozen=True)
class Settings:
    # Where things are. Left out of the representation like every secret: a
    # DSN or a registry URL may carry a password.
    database_url: str = field(default="", repr=False, metadata={"env": "DATABASE_URL"})
    kafka_bootstrap_servers: str = field(
        default=defaults.KAFKA_BOOTSTRAP_SERVERS, metadata={"env": "KAFKA_BOOTSTRAP_SERVERS"}
    )
    schema_registry_url: str = field(
        default="", repr=False, metadata={"env": "WFJOBS_SCHEMA_REGISTRY_URL"}
    )
    event_format: str = field(default="protobuf", metadata={"env": "WFJOBS_EVENT_FORMAT"})

    # How every Kafka client connects (mapped onto each library by
    # streams.kafka_security). A ``*_file`` setting names a file holding the
    # value of its partner, as mounted secrets do; set one of the two.
    kafka_security_protocol: str = field(
        default="PLAINTEXT", metadata={"env": "WFJOBS_KAFKA_SECURITY_PROTOCOL"}
    )
    kafka_sasl_mechanism: str = field(
        default="PLAIN", metadata={"env": "WFJOBS_KAFKA_SASL_MECHANISM"}
    )
    kafka_sasl_username: str = field(default="", metadata={"env": "WFJOBS_KAFKA_SASL_USERNAME"})
    kafka_sasl_username_file: str = field(
        default="", metadata={"env": "WFJOBS_KAFKA_SASL_USERNAME_FILE"}
    )
    kafka_sasl_password: str = field(
        default="", repr=False, metadata={"env": "WFJOBS_KAFKA_SASL_PASSWORD"}
    )
    kafka_sasl_password_file: str = field(
        default="", metadata={"env": "WFJOBS_KAFKA_SASL_PASSWORD_FILE"}
    )
    kafka_oauth_token_url: str = field(default="", metadata={"env": "WFJOBS_KAFKA_OAUTH_TOKEN_URL"})
    kafka_oauth_client_id: str = field(default="", metadata={"env": "WFJOBS_KAFKA_OAUTH_CLIENT_ID"})
    kafka_oauth_client_secret: str = field(
        default="", repr=False, metadata={"env": "WFJOBS_KAFKA_OAUTH_CLIENT_SECRET"}
    )
    kafka_oauth_client_secret_file: str = field(
        default="", metadata={"env": "WFJOBS_KAFKA_OAUTH_CLIENT_SECRET_FILE"}
    )
    kafka_oauth_scope: str = field(default="", metadata={"env": "WFJOBS_KAFKA_OAUTH_SCOPE"})
    kafka_ssl_ca_file: str = field(default="", metadata={"env": "WFJOBS_KAFKA_SSL_CA_FILE"})
    kafka_ssl_cert_file: str = field(default="", metadata={"env": "WFJOBS_KAFKA_SSL_CERT_FILE"})
    kafka_ssl_key_file: str = field(default="", metadata={"env": "WFJOBS_KAFKA_SSL_KEY_FILE"})
    kafka_ssl_key_password: str = field(
        default="", repr=False, metadata={"env": "WFJOBS_KAFKA_SSL_KEY_PASSWORD"}
    )
    kafka_ssl_key_password_file: str = field(
        default="", metadata={"env": "WFJOBS_KAFKA_SSL_KEY_PASSWORD_FILE"}
    )
    kafka_ssl_check_hostname: bool = field(
        default=True, metadata={"env": "WFJOBS_KAFKA_SSL_CHECK_HOSTNAME"}
    )
    # Any other librdkafka property, as a JSON object; applied last.
    kafka_properties: str = field(
        default="", repr=False, metadata={"env": "WFJOBS_KAFKA_PROPERTIES"}
    )
    # The registry client: USER:PASSWORD basic auth, TLS, and whether this
    # process registers the contract's schemas or only uses the latest version.
    schema_registry_basic_auth: str = field(
        default="", repr=False, metadata={"env": "WFJOBS_SCHEMA_REGISTRY_BASIC_AUTH"}
    )
    schema_registry_basic_auth_file: str = field(
        default="", metadata={"env": "WFJOBS_SCHEMA_REGISTRY_BASIC_AUTH_FILE"}
    )
    schema_registry_ca_file: str = field(
        default="", metadata={"env": "WFJOBS_SCHEMA_REGISTRY_CA_FILE"}
    )
    schema_registry_cert_file: str = field(
        default="", metadata={"env": "WFJOBS_SCHEMA_REGISTRY_CERT_FILE"}
    )
    schema_registry_key_file: str = field(
        default="", metadata={"env": "WFJOBS_SCHEMA_REGISTRY_KEY_FILE"}
    )
    schema_registry_auto_register: bool = field(
        default=True, metadata={"env": "WFJOBS_SCHEMA_REGISTRY_AUTO_REGISTER"}
    )

    # Who this process is and what it does.
    worker_id: str = field(default="", metadata={"env": "WFJOBS_WORKER_ID"})
    roles: frozenset[str] = field(default=ROLES, metadata={"env": "WFJOBS_ROLES"})
    handler_modules: tuple[str, ...] = field(default=(), metadata={"env": "WFJOBS_HANDLERS"})

    # Step targets (workflows.targets): the host:port patterns a step may call
    # (none: in-process handlers only), TLS per pattern, and how many gRPC
    # channels stay open at once.
    step_targets: tuple[str, ...] = field(default=(), metadata={"env": "WFJOBS_STEP_TARGETS"})
    step_target_tls: tuple[str, ...] = field(default=(), metadata={"env": "WFJOBS_STEP_TARGET_TLS"})
    step_channels_max: int = field(default=64, metadata={"env": "WFJOBS_STEP_CHANNELS_MAX"})
    # Rules (workflows.rules, workflows.checker): the caps every CEL rule must
    # fit, and how long checking a definition's rules may take.
    rule_max_chars: int = field(
        default=DEFAULT_RULE_CHARS, metadata={"env": "WFJOBS_RULE_MAX_CHARS"}
    )
    rule_max_nesting: int = field(
        default=DEFAULT_RULE_NESTING, metadata={"env": "WFJOBS_RULE_MAX_NESTING"}
    )
    rule_max_cost: int = field(default=DEFAULT_RULE_COST, metadata={"env": "WFJOBS_RULE_MAX_COST"})
    compile_timeout_s: float = field(default=2.0, metadata={"env": "WFJOBS_COMPILE_TIMEOUT_S"})

    # Topics.
    requests_topic: str = field(
        default=defaults.REQUESTS_TOPIC, metadata={"env": "WFJOBS_REQUESTS_TOPIC"}
    )
    events_topic: str = field(
        default=defaults.EVENTS_TOPIC, metadata={"env": "WFJOBS_EVENTS_TOPIC"}
    )
    # Completions of external steps arrive here (StepCompletion), and each is
    # answered there (StepCompletionResult), keyed by job id.
    completions_topic: str = field(
        default=defaults.COMPLETIONS_TOPIC, metadata={"env": "WFJOBS_COMPLETIONS_TOPIC"}
    )
    completion_results_topic: str = field(
        default=defaults.COMPLETION_RESULTS_TOPIC,
        metadata={"env": "WFJOBS_COMPLETION_RESULTS_TOPIC"},
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
    # One writer per process sends the runners' commit points in one statement
    # (store.group_commit); off, each is its own statement (for comparison).
    group_commit: bool = field(default=True, metadata={"env": "WFJOBS_GROUP_COMMIT"})
    poll_interval_s: float = field(default=1.0, metadata={"env": "WFJOBS_POLL_INTERVAL_S"})
    lease_s: float = field(default=300.0, metadata={"env": "WFJOBS_LEASE_S"})
    heartbeat_s: float = field(default=0.0, metadata={"env": "WFJOBS_HEARTBEAT_S"})
    sweep_interval_s: float = field(default=10.0, metadata={"env": "WFJOBS_SWEEP_INTERVAL_S"})
    max_attempts: int = field(default=3, metadata={"env": "WFJOBS_MAX_ATTEMPTS"})
    retry_base_s: float = field(default=5.0, metadata={"env": "WFJOBS_RETRY_BASE_S"})
    # Longest backoff of a retry, however many attempts were spent.
    retry_max_s: float = field(default=3600.0, metadata={"env": "WFJOBS_RETRY_MAX_S"})
    max_concurrent_per_target: int = field(
        default=8, metadata={"env": "WFJOBS_MAX_CONCURRENT_PER_TARGET"}
    )
    # How long a stopping worker lets running segments finish before handing
    # the rest back to the queue.
    shutdown_grace_s: float = field(default=10.0, metadata={"env": "WFJOBS_SHUTDOWN_GRACE_S"})
    # Cap of the backoff the request agent uses while the store is unreachable.
    store_retry_max_s: float = field(default=30.0, metadata={"env": "WFJOBS_STORE_RETRY_MAX_S"})
    # Most requests the request agent submits in one statement: those waiting
    # when the previous batch committed, up to this many.
    request_batch_max: int = field(default=500, metadata={"env": "WFJOBS_REQUEST_BATCH_MAX"})
    # Request topic ownership (streams.ownership): how often the group is
    # described, how long partitions may stay unowned in a settled group before
    # this member rejoins, and how long after that before the process exits.
    ownership_check_s: float = field(default=10.0, metadata={"env": "WFJOBS_OWNERSHIP_CHECK_S"})
    unowned_rejoin_s: float = field(default=30.0, metadata={"env": "WFJOBS_UNOWNED_REJOIN_S"})
    unowned_exit_s: float = field(default=120.0, metadata={"env": "WFJOBS_UNOWNED_EXIT_S"})

    # Outbox relay.
    relay_interval_s: float = field(default=0.5, metadata={"env": "WFJOBS_RELAY_INTERVAL_S"})
    # Rows a relay pass leases, publishes and settles at once: each pass costs
    # two round trips and one wait for the broker whatever its size, so a
    # backlog drains about twice as fast at 500 as at 100 (benchmarks/README.md).
    relay_batch: int = field(default=500, metadata={"env": "WFJOBS_RELAY_BATCH"})
    # After a pass that found some rows but not a full batch, the least time
    # from its start to the next pass's: the events of that time share one pass.
    relay_linger_ms: int = field(default=50, metadata={"env": "WFJOBS_RELAY_LINGER_MS"})
    # The producer's delivery deadline: how long a pass waits before it learns
    # that the broker is away (a transient fault, which spends no attempt).
    relay_message_timeout_ms: int = field(
        default=30_000, metadata={"env": "WFJOBS_RELAY_MESSAGE_TIMEOUT_MS"}
    )
    # Cap of the relay's backoff after passes that published nothing.
    relay_backoff_max_s: float = field(default=30.0, metadata={"env": "WFJOBS_RELAY_BACKOFF_MAX_S"})
    # How long the relay may be unable to publish, with rows waiting, or a pass
    # may wait for the store, before /healthz calls it stuck.
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
    # Watching a job (GET /v1/workflow-runs/{id}/events): how often a watcher
    # reads when no notification wakes it (step checkpoints and progress
    # notify no one), and how many watchers one process serves at once.
    watch_poll_s: float = field(default=1.0, metadata={"env": "WFJOBS_WATCH_POLL_S"})
    watch_max: int = field(default=256, metadata={"env": "WFJOBS_WATCH_MAX"})
    # How often a worker stores the progress its steps report (the latest
    # report of each job, all in one statement).
    progress_interval_s: float = field(default=1.0, metadata={"env": "WFJOBS_PROGRESS_INTERVAL_S"})
    # Admission control: no new job while this many are QUEUED; 0 turns it off
    # (see streams.admission).
    max_queued_jobs: int = field(default=0, metadata={"env": "WFJOBS_MAX_QUEUED_JOBS"})
    # Migrations are a deployment step (``wfjobs migrate``, the compose file's
    # one-shot service); a worker applies them itself only when asked to.
    auto_migrate: bool = field(default=False, metadata={"env": "WFJOBS_AUTO_MIGRATE"})
    # API tokens (streams.auth): "on" unless explicitly "off", which the
    # worker logs loudly at start.
    auth: str = field(default="on", metadata={"env": "WFJOBS_AUTH"})
    # Who owns the jobs the request topic submits: a Kafka producer sends no
    # token. With trust on, a request's own ``principal`` field wins when set.
    request_principal: str = field(default="kafka", metadata={"env": "WFJOBS_REQUEST_PRINCIPAL"})
    trust_request_principal: bool = field(
        default=False, metadata={"env": "WFJOBS_TRUST_REQUEST_PRINCIPAL"}
    )
    # Traces (streams.tracing): "on" makes spans and needs the ``tracing`` extra;
    # the exporter sends them over OTLP/HTTP (the SDK reads the OTEL_*
    # variables), prints them, or only propagates their context.
    tracing: str = field(default="off", metadata={"env": "WFJOBS_TRACING"})
    tracing_exporter: str = field(default="otlp", metadata={"env": "WFJOBS_TRACING_EXPORTER"})
    # Log lines (streams.logs): plain text for a terminal, or JSON lines.
    log_format: str = field(default="text", metadata={"env": "WFJOBS_LOG_FORMAT"})
    # /metrics (streams.metrics): "on" unless explicitly "off", which builds no
    # instrument at all. The database-derived figures are read at most once
    # per this many seconds per process, however often it is scraped.
    metrics: str = field(default="on", metadata={"env": "WFJOBS_METRICS"})
    metrics_db_cache_s: float = field(default=10.0, metadata={"env": "WFJOBS_METRICS_DB_CACHE_S"})
    # Where Faust keeps its local state; empty means Faust's default
    # ("<app id>-data" under the working directory). No tables live there.
    data_dir: str = field(default="", metadata={"env": "WFJOBS_DATA_DIR"})

    @property
    def store_configured(self) -> bool:
        return bool(self.database_url)

    @property
    def auth_enabled(self) -> bool:
        return self.auth == "on"

    @property
    def tracing_enabled(self) -> bool:
        return self.tracing == "on"

    @property
    def metrics_enabled(self) -> bool:
        return self.metrics == "on"

    @property
    def dlq_topic(self) -> str:
        """Where undecodable requests go: explicit, else ``<requests_topic>.dlq``."""
        return self.requests_dlq_topic or defaults.dlq_topic_for(self.requests_topic)

    @property
    def broker_url(self) -> str:
        """Faust's broker URL list: ``kafka://host:port`` for each bootstrap server.

        A server written with a scheme (``SASL_SSL://host:port``) loses it first:
        Faust would read that scheme as the host. TLS and SASL reach Faust as
        ``broker_credentials`` (see ``kafka_security``).
        """
        return ";".join(f"kafka://{server}" for server in self.kafka_servers)

    @property
    def kafka_servers(self) -> list[str]:
        """``KAFKA_BOOTSTRAP_SERVERS`` as ``host:port`` items, any ``scheme://`` dropped."""
        return client_security.bootstrap_servers(self)

    def kafka_security(self) -> client_security.KafkaSecurity:
        """TLS and SASL of every Kafka client, secrets read from their files now."""
        return client_security.kafka_security(self)

    def kafka_client_config(self) -> dict[str, Any]:
        """A librdkafka client's ``bootstrap.servers``, TLS, SASL and pass-through properties."""
        return client_security.librdkafka_config(self)

    def open_registry(self) -> SchemaRegistryClient | None:
        """A client of ``WFJOBS_SCHEMA_REGISTRY_URL``, or ``None`` when none is configured."""
        if not self.schema_registry_url:
            return None
        # Imported here: the settings are read by processes that never touch a registry.
        from schemas.serde import open_registry

        return open_registry(
            self.schema_registry_url,
            conf=client_security.registry_config(self),
            events_topic=self.events_topic,
            requests_topic=self.requests_topic,
            completions_topic=self.completions_topic,
            completion_results_topic=self.completion_results_topic,
        )

    @property
    def shown_registry_url(self) -> str:
        """``WFJOBS_SCHEMA_REGISTRY_URL`` as a log line may show it: no user or password."""
        return ", ".join(
            _without_userinfo(url.strip()) for url in self.schema_registry_url.split(",")
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

    def require_web_host(self) -> None:
        """The HTTP bind address resolves: otherwise the web server's bind, late in
        the start, ends the process with a resolver's traceback. A name lookup,
        so it is asked at start, not with every read of the environment."""
        try:
            socket.getaddrinfo(self.web_host, self.web_port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            raise SettingsError(
                f"WFJOBS_WEB_HOST {self.web_host!r} does not resolve to an address: {exc}"
            ) from None

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
        self._check_database_url()
        self._check_registry_url()
        self._check_topics()
        if self.event_format == "avro" and not self.schema_registry_url:
            raise SettingsError(
                "WFJOBS_EVENT_FORMAT=avro needs WFJOBS_SCHEMA_REGISTRY_URL: Avro events "
                "carry the registry's schema id"
            )
        if self.claim_loops < 0:
            raise SettingsError(
                f"WFJOBS_CLAIM_LOOPS must not be negative (0 pauses claiming), "
                f"got {self.claim_loops}"
            )
        positive = (
            "claim_batch",
            "poll_interval_s",
            "lease_s",
            "sweep_interval_s",
            "max_attempts",
            "retry_base_s",
            "retry_max_s",
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
            "request_batch_max",
            "ownership_check_s",
            "unowned_rejoin_s",
            "unowned_exit_s",
            "broker_session_timeout_s",
            "broker_retry_max_s",
            "retention_interval_s",
            "retention_batch",
            "watch_poll_s",
            "watch_max",
            "progress_interval_s",
            "metrics_db_cache_s",
        )
        for attribute in positive:
            if getattr(self, attribute) <= 0:
                raise SettingsError(
                    f"{self.env_name(attribute)} must be positive, got {getattr(self, attribute)}"
                )
        if self.max_attempts > MAX_ATTEMPTS_CEILING:
            raise SettingsError(
                f"WFJOBS_MAX_ATTEMPTS must be at most {MAX_ATTEMPTS_CEILING}, "
                f"got {self.max_attempts}"
            )
        if self.retry_max_s > RETRY_MAX_CEILING_S:
            raise SettingsError(
                f"WFJOBS_RETRY_MAX_S must be at most {RETRY_MAX_CEILING_S:.0f} (a year), "
                f"got {self.retry_max_s}"
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
        if self.relay_linger_ms < 0:
            raise SettingsError(
                f"WFJOBS_RELAY_LINGER_MS must not be negative, got {self.relay_linger_ms}"
            )
        if self.retention_pause_s < 0:
            raise SettingsError(
                f"WFJOBS_RETENTION_PAUSE_S must not be negative, got {self.retention_pause_s}"
            )
        self.retention_policy()
        self.target_policy()
        self.target_tls()
        self.rule_limits()
        if self.step_channels_max < 1 or self.compile_timeout_s <= 0:
            raise SettingsError(
                "WFJOBS_STEP_CHANNELS_MAX and WFJOBS_COMPILE_TIMEOUT_S must be positive"
            )
        if self.max_queued_jobs < 0:
            raise SettingsError(
                f"WFJOBS_MAX_QUEUED_JOBS must be 0 (no cap) or positive, got {self.max_queued_jobs}"
            )
        if self.pool_min_size < 0 or self.pool_min_size > self.pool_max_size:
            raise SettingsError("WFJOBS_POOL_MIN must be between 0 and WFJOBS_POOL_MAX")
        if not self.kafka_bootstrap_servers.strip():
            raise SettingsError("KAFKA_BOOTSTRAP_SERVERS must name at least one host:port")
        try:
            client_security.check(self)
        except client_security.SecuritySettingsError as exc:
            raise SettingsError(exc.message) from None
        if not self.consumer_group.strip():
            raise SettingsError("WFJOBS_GROUP must not be blank")
        if not 0 < self.web_port < 65536:
            raise SettingsError(f"WFJOBS_WEB_PORT must be a TCP port, got {self.web_port}")
        if self.heartbeat_s < 0 or self.heartbeat_s >= self.lease_s:
            raise SettingsError("WFJOBS_HEARTBEAT_S must be >= 0 and below WFJOBS_LEASE_S")
        if self.auth not in {"on", "off"}:
            raise SettingsError(f"WFJOBS_AUTH must be 'on' or 'off', got {self.auth!r}")
        if self.metrics not in {"on", "off"}:
            raise SettingsError(f"WFJOBS_METRICS must be 'on' or 'off', got {self.metrics!r}")
        try:
            validate_principal(self.request_principal)
        except InvalidArgument as exc:
            raise SettingsError(f"WFJOBS_REQUEST_PRINCIPAL: {exc.message}") from None
        self._check_observability()

    def _check_topics(self) -> None:
        """Every topic name a broker would accept, so a bad one stops the process at
        start rather than the first subscribe, produce or create."""
        named = [(self.env_name(attribute), getattr(self, attribute)) for attribute in _TOPICS]
        if self.requests_dlq_topic:
            named.append(("WFJOBS_REQUESTS_DLQ_TOPIC", self.requests_dlq_topic))
        else:
            named.append(
                ("WFJOBS_REQUESTS_TOPIC (with .dlq, the dead-letter topic)", self.dlq_topic)
            )
        for name, topic in named:
            if not _TOPIC_NAME.fullmatch(topic) or topic in {".", ".."}:
                raise SettingsError(
                    f"{name} must be a Kafka topic name: 1 to 249 letters, digits, '.', '_' "
                    f"or '-', got {topic!r}"
                )

    def _check_database_url(self) -> None:
        """A DSN libpq cannot read stops the process here; the pool would retry
        it for good, logging libpq's refusal, which quotes what it could not read."""
        if self.database_url:
            try:
                databases.check_dsn(self.database_url)
            except InvalidArgument as exc:
                raise SettingsError(f"DATABASE_URL: {exc.message}") from None

    def _check_registry_url(self) -> None:
        """Each comma-separated registry URL as the client takes it: ``http://`` or
        ``https://`` with a host, or confluent's in-process ``mock://``. The client
        refuses any other only when a process first opens it (a relay starting, a
        CLI command), with an "Invalid url" that names no variable."""
        if not self.schema_registry_url:
            return
        for item in self.schema_registry_url.split(","):
            url = item.strip()
            try:
                parts = urlsplit(url)
                parts.port  # noqa: B018 - raises on a port that is not a number
            except ValueError:
                parts = None
            # As the client reads them: a lowercase scheme, written out.
            web = url.startswith(("http://", "https://"))
            if parts is None or not ((web and parts.hostname) or url.startswith("mock://")):
                raise SettingsError(
                    "WFJOBS_SCHEMA_REGISTRY_URL must be one or more comma-separated "
                    f"http:// or https:// URLs, got {_without_userinfo(url)!r}"
                )
            if "@" in parts.netloc and (
                self.schema_registry_basic_auth or self.schema_registry_basic_auth_file
            ):
                given = (
                    "WFJOBS_SCHEMA_REGISTRY_BASIC_AUTH"
                    if self.schema_registry_basic_auth
                    else "WFJOBS_SCHEMA_REGISTRY_BASIC_AUTH_FILE"
                )
                raise SettingsError(
                    f"WFJOBS_SCHEMA_REGISTRY_URL {_without_userinfo(url)!r} carries credentials "
                    f"and {given} is set too: give them in one place"
                )

    def _check_observability(self) -> None:
        if self.tracing not in {"on", "off"}:
            raise SettingsError(f"WFJOBS_TRACING must be 'on' or 'off', got {self.tracing!r}")
        if self.tracing_exporter not in tracing.EXPORTERS:
            raise SettingsError(
                f"WFJOBS_TRACING_EXPORTER must be one of {', '.join(tracing.EXPORTERS)}, "
                f"got {self.tracing_exporter!r}"
            )
        if self.tracing_enabled:
            missing = tracing.missing_packages(self.tracing_exporter)
            if missing:
                raise SettingsError(f"WFJOBS_TRACING=on needs OpenTelemetry: {missing}")
        if self.log_format not in {"text", "json"}:
            raise SettingsError(
                f"WFJOBS_LOG_FORMAT must be 'text' or 'json', got {self.log_format!r}"
            )

    def target_policy(self) -> TargetPolicy:
        """``WFJOBS_STEP_TARGETS``, parsed."""
        try:
            return TargetPolicy.parse(self.step_targets)
        except ValueError as exc:
            raise SettingsError(f"WFJOBS_STEP_TARGETS: {exc}") from None

    def target_tls(self) -> tuple[TlsRule, ...]:
        """``WFJOBS_STEP_TARGET_TLS``, parsed, its files read."""
        try:
            return tuple(TlsRule.parse(text) for text in self.step_target_tls)
        except ValueError as exc:
            raise SettingsError(f"WFJOBS_STEP_TARGET_TLS: {exc}") from None

    def rule_limits(self) -> RuleLimits:
        """``WFJOBS_RULE_MAX_CHARS``, ``WFJOBS_RULE_MAX_NESTING`` and ``WFJOBS_RULE_MAX_COST``."""
        if not 1 <= self.rule_max_chars <= MAX_RULE_CHARS or self.rule_max_nesting < 1:
            raise SettingsError(
                f"WFJOBS_RULE_MAX_CHARS must be between 1 and {MAX_RULE_CHARS} and "
                "WFJOBS_RULE_MAX_NESTING at least 1"
            )
        if self.rule_max_cost < 1:
            raise SettingsError("WFJOBS_RULE_MAX_COST must be at least 1")
        return RuleLimits(
            max_chars=self.rule_max_chars,
            max_nesting=self.rule_max_nesting,
            max_cost=self.rule_max_cost,
        )

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


def _without_userinfo(url: str) -> str:
    """``url`` as it may be shown: a user and password before the host are left out."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, path = rest.partition("/")
    if "@" not in authority:
        return url
    return f"{scheme}://***@{authority.rpartition('@')[2]}{slash}{path}"


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
            # float() also reads "nan" and "inf", which every comparison below
            # would wave through; no setting means either.
            number = float(raw)
            if not math.isfinite(number):
                raise ValueError(raw)
            return number
        if isinstance(default, frozenset):
            return frozenset(part.strip() for part in raw.split(",") if part.strip())
        if isinstance(default, tuple):
            return tuple(part.strip() for part in raw.split(",") if part.strip())
        return raw
    except ValueError:
        kind = {
            "bool": "boolean (true/false)",
            "int": "an integer",
            "float": "a finite number",
        }.get(type(default).__name__, type(default).__name__)
        raise SettingsError(f"{name} must be {kind}, got {raw!r}") from None
