"""A Confluent-compatible Schema Registry (Apicurio) for the contract tests."""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

from devstack import registry
from devstack.processes import (
    LOOPBACK,
    ManagedProcess,
    ServiceBase,
    ServiceError,
    free_port,
    java_executable,
    port_open,
    wait_until_ready,
)


def _registry_answers(url: str, timeout_s: float) -> bool:
    """Whether ``url`` serves the Confluent Schema Registry API (its subject list)."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/subjects", timeout=timeout_s) as answer:
            return bool(answer.status == 200)
    except (OSError, ValueError):  # refused, reset, timed out, HTTP errors, bad URL
        return False


class SchemaRegistryService(ServiceBase):
    """A Confluent-compatible Schema Registry for the tests.

    ``WFJOBS_TEST_SCHEMA_REGISTRY_URL`` when set (a Confluent API base URL), else
    our own Apicurio Registry, in memory, on a free 127.0.0.1 port (see
    :mod:`devstack.registry`). ``url`` is the Confluent API's base URL,
    what ``WFJOBS_SCHEMA_REGISTRY_URL`` and confluent-kafka clients take.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        version: str = registry.APICURIO_VERSION,
        heap: str = "384m",
        startup_timeout_s: float = 120.0,
    ) -> None:
        """``url=None`` reads ``WFJOBS_TEST_SCHEMA_REGISTRY_URL``; ``""`` forces our own."""
        if url is None:
            url = os.environ.get("WFJOBS_TEST_SCHEMA_REGISTRY_URL", "")
        self._external = url.rstrip("/") or None
        self._version = version
        self._heap = heap
        self._startup_timeout_s = startup_timeout_s
        self._url: str | None = None

    @property
    def url(self) -> str:
        if self._url is None:
            raise ServiceError("the schema registry is not started")
        return self._url

    @property
    def external(self) -> bool:
        return self._external is not None

    def start(self) -> None:
        if self._url is not None:
            return
        if self._external is not None:
            if not _registry_answers(self._external, timeout_s=15.0):
                raise ServiceError(
                    f"the schema registry at {self._external} (WFJOBS_TEST_SCHEMA_REGISTRY_URL "
                    "or as given) does not answer GET /subjects"
                )
            self._url = self._external
            return
        try:
            dist = registry.apicurio_dist(self._version)
        except registry.RegistryRuntimeError as exc:
            raise ServiceError(str(exc)) from exc
        self._start_on_fresh_ports(lambda: self._start_once(dist))

    def _start_once(self, dist: Path) -> None:
        workdir = self._new_workdir("wfjobs-registry-")
        port = free_port()
        argv = registry.server_argv(
            java_executable(),
            dist,
            host=LOOPBACK,
            port=port,
            workdir=workdir,
            heap=self._heap,
            version=self._version,
        )
        self._process = ManagedProcess(
            "schema-registry", argv, log_path=workdir / "registry.log", cwd=workdir
        )
        url = f"http://{LOOPBACK}:{port}{registry.CCOMPAT_PATH}"
        wait_until_ready(
            lambda: port_open(LOOPBACK, port) and _registry_answers(url, 2.0),
            process=self._process,
            timeout_s=self._startup_timeout_s,
            what=f"Apicurio Registry {self._version}",
            interval_s=0.2,
        )
        self._url = url

    def stop(self) -> None:
        self._release(timeout_s=15.0)
        self._url = None
