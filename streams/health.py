"""What ``/healthz`` and ``/readyz`` say: one entry per part of the process.

Each part that runs here (the store, the claim loops, the relay, the request
agent, the broker connection) reports a ``PartHealth`` from state it already
keeps in memory, so answering costs no I/O beyond the store's ``SELECT 1``.

Two questions, two endpoints, because an orchestrator acts on them differently:

* ``/healthz`` (liveness): is any part *stuck* — alive but not doing its job for
  longer than its threshold (a relay that cannot publish, a request topic with
  partitions nobody owns, claim loops that cannot claim)? Non-200 means
  "restart me".
* ``/readyz`` (readiness): is every part *ready* — connected and serving? A
  worker whose broker is not reachable yet is alive (its HTTP verbs work) but
  not ready. Non-200 means "do not count me in yet".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class PartHealth:
    """One part's state. ``healthy`` False means stuck; ``ready`` False means not serving yet."""

    name: str
    healthy: bool = True
    ready: bool = True
    # One line an operator reads first: what the part is doing or waiting for.
    summary: str = "ok"
    # Numbers behind the summary (ages in seconds, counts, partitions).
    detail: Mapping[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "ready": self.ready,
            "summary": self.summary,
            **dict(self.detail),
        }


class ReportsHealth(Protocol):
    """A part that can say how it is, from memory, without I/O."""

    def health(self) -> PartHealth: ...


HealthSource = Callable[[], PartHealth]


@dataclass(frozen=True, slots=True)
class HealthReport:
    parts: tuple[PartHealth, ...]

    @property
    def healthy(self) -> bool:
        return all(part.healthy for part in self.parts)

    @property
    def ready(self) -> bool:
        return all(part.ready and part.healthy for part in self.parts)

    def body(self, **extra: Any) -> dict[str, Any]:
        if not self.healthy:
            status = "stuck"
        elif not self.ready:
            status = "not ready"
        else:
            status = "ok"
        return {
            "status": status,
            **extra,
            "parts": {part.name: part.as_json() for part in self.parts},
        }


def report(parts: Iterable[PartHealth]) -> HealthReport:
    return HealthReport(tuple(parts))


__all__ = ["HealthReport", "HealthSource", "PartHealth", "ReportsHealth", "report"]
