"""The one settings object, read from the environment once.

Every variable is prefixed ``WFJOBS_`` except the two conventional ones,
``DATABASE_URL`` and ``KAFKA_BOOTSTRAP_SERVERS``. A malformed value fails fast
with the variable's name.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from schemas.errors import InvalidArgument

ROLES = frozenset({"api", "worker", "relay"})


class SettingsError(InvalidArgument):
    """A configuration variable is missing or malformed."""


@dataclass(frozen=True)
class Settings:
    # Where things are.
    database_url: str = field(default="", metadata={"env": "DATABASE_URL"})
    kafka_bootstrap_servers: str = field(
        default="127.0.0.1:9092", metadata={"env": "KAFKA_BOOTSTRAP_SERVERS"}
    )
    schema_registry_url: str = field(default="", metadata={"env": "WFJOBS_SCHEMA_REGISTRY_URL"})
    event_format: str = field(default="protobuf", metadata={"env": "WFJOBS_EVENT_FORMAT"})

    # Who this process is and what it does.
    worker_id: str = field(default="", metadata={"env": "WFJOBS_WORKER_ID"})
    roles: frozenset[str] = field(default=ROLES, metadata={"env": "WFJOBS_ROLES"})
    handler_modules: tuple[str, ...] = field(default=(), metadata={"env": "WFJOBS_HANDLERS"})

    # Topics.
    requests_topic: str = field(
        default="workflow-run-requests", metadata={"env": "WFJOBS_REQUESTS_TOPIC"}
    )
    events_topic: str = field(
        default="workflow-run-events", metadata={"env": "WFJOBS_EVENTS_TOPIC"}
    )
    consumer_group: str = field(default="workflow-jobs-worker", metadata={"env": "WFJOBS_GROUP"})

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

    # Outbox relay.
    relay_interval_s: float = field(default=0.5, metadata={"env": "WFJOBS_RELAY_INTERVAL_S"})
    relay_batch: int = field(default=100, metadata={"env": "WFJOBS_RELAY_BATCH"})
    relay_max_attempts: int = field(default=10, metadata={"env": "WFJOBS_RELAY_MAX_ATTEMPTS"})

    # Store and web.
    pool_min_size: int = field(default=2, metadata={"env": "WFJOBS_POOL_MIN"})
    pool_max_size: int = field(default=10, metadata={"env": "WFJOBS_POOL_MAX"})
    web_host: str = field(default="127.0.0.1", metadata={"env": "WFJOBS_WEB_HOST"})
    web_port: int = field(default=6066, metadata={"env": "WFJOBS_WEB_PORT"})
    max_body_bytes: int = field(default=1_048_576, metadata={"env": "WFJOBS_MAX_BODY_BYTES"})

    @property
    def store_configured(self) -> bool:
        return bool(self.database_url)

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
            "relay_max_attempts",
            "pool_max_size",
            "max_body_bytes",
        )
        for attribute in positive:
            if getattr(self, attribute) <= 0:
                raise SettingsError(
                    f"{self.env_name(attribute)} must be positive, got {getattr(self, attribute)}"
                )
        if self.pool_min_size < 0 or self.pool_min_size > self.pool_max_size:
            raise SettingsError("WFJOBS_POOL_MIN must be between 0 and WFJOBS_POOL_MAX")
        if self.heartbeat_s < 0 or self.heartbeat_s >= self.lease_s:
            raise SettingsError("WFJOBS_HEARTBEAT_S must be >= 0 and below WFJOBS_LEASE_S")

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
        kind = type(default).__name__
        raise SettingsError(f"{name} must be a {kind}, got {raw!r}") from None
