"""Apache Kafka 4.x in KRaft mode for tests, benchmarks and ``make kafka``."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient

from devstack import kafka
from devstack.processes import (
    LOOPBACK,
    ManagedProcess,
    ServiceBase,
    ServiceError,
    broker_answers,
    free_port,
    java_executable,
    log_tail,
    port_open,
    wait_until_ready,
)


def _group_coordinator_answers(bootstrap: str, timeout_s: float) -> bool:
    """Whether a consumer group lookup succeeds.

    The first FindCoordinator makes the broker create ``__consumer_offsets``;
    doing it here, polling fast, saves the first consumer of the session about
    three seconds of librdkafka's slower coordinator retries.
    """
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    group = "workflow-jobs-readiness-probe"
    future = admin.describe_consumer_groups([group], request_timeout=timeout_s)[group]
    try:
        future.result(timeout=timeout_s + 1)
    except Exception:  # COORDINATOR_NOT_AVAILABLE while the topic is being created
        return False
    return True


@dataclass(frozen=True)
class SaslSslListener:
    """A SASL_SSL listener next to the plaintext one, with one SCRAM user.

    ``keystore`` is a PEM file holding the broker's private key (PKCS#8,
    unencrypted) followed by its certificate chain, for the address the
    listener binds (127.0.0.1); clients verify it with the CA that signed it.
    """

    keystore: Path
    username: str
    password: str
    mechanism: str = "SCRAM-SHA-512"

    def scram_argument(self) -> str:
        """The storage tool's ``--add-scram`` value that creates the user."""
        return f"{self.mechanism}=[name={self.username},password={self.password}]"


class ApacheKafkaService(ServiceBase):
    """Apache Kafka 4.x in KRaft mode: ``KAFKA_BOOTSTRAP_SERVERS`` when set, else our own.

    Our own is one combined broker + controller on two free 127.0.0.1 ports, its
    log dirs in a temporary directory, started from jars resolved with ``mvn``
    (see :mod:`devstack.kafka`).
    """

    def __init__(
        self,
        bootstrap_servers: str | None = None,
        *,
        version: str = kafka.KAFKA_VERSION,
        num_partitions: int = 3,
        heap: str = "512m",
        properties: Mapping[str, str] | None = None,
        startup_timeout_s: float = 120.0,
        sasl_ssl: SaslSslListener | None = None,
        listeners: Mapping[str, str] | None = None,
    ) -> None:
        """``bootstrap_servers=None`` reads ``KAFKA_BOOTSTRAP_SERVERS``; ``""`` forces our own.

        ``sasl_ssl`` adds a SASL_SSL listener to a broker started here (an
        adopted one is used as it is, without one). ``listeners`` adds more
        to it, each on a free port: name -> security protocol, configured by
        ``listener.name.<name>.*`` entries in ``properties``.
        """
        if bootstrap_servers is None:
            bootstrap_servers = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "")
        self._external = bootstrap_servers or None
        self._sasl_ssl = sasl_ssl
        self._sasl_ssl_bootstrap: str | None = None
        self._listeners = dict(listeners or {})
        self._listener_ports: dict[str, int] = {}
        self._version = version
        self._num_partitions = num_partitions
        self._heap = heap
        self._properties = dict(properties or {})
        self._startup_timeout_s = startup_timeout_s
        self._bootstrap: str | None = None
        self._broker_argv: list[str] = []
        self._pending_archive: Path | None = None
        self._cluster_id: str | None = None
        self._halted: str | None = None

    @property
    def bootstrap_servers(self) -> str:
        if self._bootstrap is None:
            raise ServiceError("Apache Kafka is not started")
        return self._bootstrap

    @property
    def external(self) -> bool:
        return self._external is not None

    @property
    def sasl_ssl_bootstrap_servers(self) -> str | None:
        """``"127.0.0.1:PORT"`` of the SASL_SSL listener; ``None`` when there is none."""
        return self._sasl_ssl_bootstrap if self._bootstrap is not None else None

    def listener_bootstrap_servers(self, name: str) -> str:
        """``"127.0.0.1:PORT"`` of the extra listener ``name`` of our running broker."""
        if self._bootstrap is None or name not in self._listener_ports:
            raise ServiceError(f"no running listener {name!r}")
        return f"{LOOPBACK}:{self._listener_ports[name]}"

    def start(self) -> None:
        if self._bootstrap is not None:
            return
        if self._external is not None:
            if not broker_answers(self._external, timeout_s=15.0):
                raise ServiceError(
                    f"the Kafka at {self._external} (KAFKA_BOOTSTRAP_SERVERS or as given) "
                    "does not answer metadata requests"
                )
            self._bootstrap = self._external
            return
        try:
            libs = kafka.kafka_libs(self._version)
        except kafka.KafkaRuntimeError as exc:
            raise ServiceError(str(exc)) from exc
        # Listeners given by the caller are fixed: another attempt would meet the same ports.
        self._start_on_fresh_ports(
            lambda: self._start_broker(libs),
            attempts=1 if "listeners" in self._properties else 3,
        )
        if self._pending_archive is not None:
            # The first broker on this machine: one restart turns the classes it
            # loaded into the archive every later start (this one's too) maps.
            self.halt()
            self.resume()

    def stop(self) -> None:
        # SIGTERM is a controlled shutdown; a single node finishes it in about a second.
        self._release(timeout_s=15.0)
        self._settle_class_archive()
        self._bootstrap = None
        self._halted = None

    def _settle_class_archive(self) -> None:
        """Adopt the class archive our stopped broker wrote; a resumed broker reads it."""
        if self._pending_archive is None:
            return
        kafka.adopt_class_archive(self._pending_archive)
        self._pending_archive = None
        libs = Path(self._broker_argv[self._broker_argv.index("-cp") + 1]).parent
        reading = kafka.shared_archive_flags(libs, java_executable())
        self._broker_argv = [
            flag for flag in self._broker_argv if not flag.startswith("-XX:ArchiveClassesAtExit=")
        ]
        self._broker_argv[1:1] = reading

    def _java_argv(
        self, libs: Path, main: str, *args: str, archive: Sequence[str] = ()
    ) -> list[str]:
        assert self._workdir is not None
        return [
            java_executable(),
            f"-Xmx{self._heap}",
            "-Xms128m",
            *kafka.LIGHT_JVM_FLAGS,
            *archive,
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self._workdir / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self._workdir}",
            "-cp",
            f"{libs}/*",
            main,
            *args,
        ]

    def _start_broker(self, libs: Path) -> None:
        workdir = self._new_workdir("wfjobs-kafka-")
        (workdir / "log4j2.properties").write_text(kafka.LOG4J2_PROPERTIES)
        broker_port, controller_port = free_port(), free_port()
        while controller_port == broker_port:
            controller_port = free_port()
        taken = {broker_port, controller_port}
        self._listener_ports = {}
        for name in self._listeners:
            port = free_port()
            while port in taken:
                port = free_port()
            taken.add(port)
            self._listener_ports[name] = port
        props = kafka.server_properties(
            broker_port=broker_port,
            controller_port=controller_port,
            log_dir=workdir / "data",
            host=LOOPBACK,
            num_partitions=self._num_partitions,
            extra=self._properties,
            sasl_ssl_port=self._sasl_ssl_port(*taken),
            sasl_ssl_keystore=self._sasl_ssl.keystore if self._sasl_ssl else None,
            sasl_mechanism=self._sasl_ssl.mechanism if self._sasl_ssl else "SCRAM-SHA-512",
            listeners={
                name: (protocol, self._listener_ports[name])
                for name, protocol in self._listeners.items()
            },
        )
        config = workdir / "server.properties"
        config.write_text(kafka.render_properties(props))
        self._cluster_id = kafka.new_cluster_id()
        # A format costs a JVM start; its bootstrap metadata is the same every time
        # for the same release and settings, so it is kept and laid out again.
        cached = kafka.cached_bootstrap_checkpoint(
            libs, kafka.formatted_storage_key(self._version, self._properties)
        )
        if self._sasl_ssl is None and cached.is_file():
            kafka.reuse_formatted_storage(
                workdir / "data", cached, cluster_id=self._cluster_id, node_id=props["node.id"]
            )
        else:
            self._format_storage(libs, config)
            if self._sasl_ssl is None:
                kafka.keep_bootstrap_checkpoint(workdir / "data", cached)

        archive, self._pending_archive = kafka.class_archive_flags(libs, java_executable())
        self._broker_argv = self._java_argv(libs, kafka.BROKER_MAIN, str(config), archive=archive)
        self._launch(f"{LOOPBACK}:{broker_port}")

    def _format_storage(self, libs: Path, config: Path) -> None:
        """Format the log dir ``config`` names with the storage tool (a JVM)."""
        workdir = self._workdir
        assert workdir is not None and self._cluster_id is not None
        # The SCRAM user exists from the first metadata record on: no admin call needed.
        scram = ["--add-scram", self._sasl_ssl.scram_argument()] if self._sasl_ssl else []
        format_log = workdir / "format.log"
        with open(format_log, "wb") as log:
            formatted = subprocess.run(
                self._java_argv(
                    libs,
                    kafka.STORAGE_TOOL_MAIN,
                    "format",
                    "--config",
                    str(config),
                    "--cluster-id",
                    self._cluster_id,
                    *scram,
                    archive=kafka.shared_archive_flags(libs, java_executable()),
                ),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=self._startup_timeout_s,
                check=False,
            )
        if formatted.returncode != 0:
            raise ServiceError(
                f"formatting KRaft storage failed (exit {formatted.returncode}):\n"
                f"{log_tail(format_log)}"
            )

    def _sasl_ssl_port(self, *taken: int) -> int | None:
        """A free port for the SASL_SSL listener, not one of ``taken``; ``None`` without one."""
        if self._sasl_ssl is None:
            self._sasl_ssl_bootstrap = None
            return None
        port = free_port()
        while port in taken:
            port = free_port()
        self._sasl_ssl_bootstrap = f"{LOOPBACK}:{port}"
        return port

    def _launch(self, bootstrap: str) -> None:
        workdir = self._workdir
        assert workdir is not None
        self._process = ManagedProcess(
            "kafka", self._broker_argv, log_path=workdir / "server.log", cwd=workdir
        )
        port = int(bootstrap.rsplit(":", 1)[1])
        # Probe the port first: librdkafka is noisy about refused connections.
        wait_until_ready(
            lambda: (
                port_open(LOOPBACK, port)
                and broker_answers(bootstrap, 2.0, cluster_id=self._cluster_id)
            ),
            process=self._process,
            timeout_s=self._startup_timeout_s,
            what=f"Apache Kafka {self._version}",
            interval_s=0.2,
        )
        wait_until_ready(
            lambda: _group_coordinator_answers(bootstrap, 2.0),
            process=self._process,
            timeout_s=self._startup_timeout_s,
            what=f"Apache Kafka {self._version}'s group coordinator",
            interval_s=0.05,
        )
        self._bootstrap = bootstrap

    def halt(self) -> None:
        """Stop our broker but keep its data and its port: a broker outage.

        ``resume`` starts it again on the same address with the same topics,
        groups and committed offsets. Only for a broker we started.
        """
        if self._external is not None or self._process is None or self._bootstrap is None:
            raise ServiceError("only a running broker started here can be halted")
        self._halted = self._bootstrap
        self._process.stop(timeout_s=15.0)
        self._process = None
        self._settle_class_archive()
        self._bootstrap = None

    def resume(self) -> None:
        """Start a halted broker again; returns once it serves groups."""
        if self._halted is None:
            raise ServiceError("the broker is not halted")
        bootstrap, self._halted = self._halted, None
        self._launch(bootstrap)
