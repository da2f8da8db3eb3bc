"""The pieces of an Apache Kafka install that we make ourselves.

There is no Kafka tarball to download: the broker's jars and their runtime
dependencies are resolved from Maven Central with ``mvn`` into a per-user cache
directory, once per version, and the broker is started from that classpath.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

KAFKA_VERSION = "4.1.1"
SCALA_VERSION = "2.13"
# Kafka 4 logs through slf4j 1.7 into log4j2; the binding must match both.
LOG4J_VERSION = "2.24.3"

BROKER_MAIN = "kafka.Kafka"
STORAGE_TOOL_MAIN = "kafka.tools.StorageTool"


class KafkaRuntimeError(RuntimeError):
    """The broker's classpath could not be prepared."""


def cache_root() -> Path:
    """``$WFJOBS_CACHE_DIR``, else ``$XDG_CACHE_HOME/workflow-jobs``, else ``~/.cache/...``."""
    explicit = os.environ.get("WFJOBS_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "workflow-jobs"


def _pom(version: str) -> str:
    kafka = [f"kafka_{SCALA_VERSION}", "kafka-server", "kafka-tools"]
    deps = [("org.apache.kafka", artifact, version) for artifact in kafka]
    deps.append(("org.apache.logging.log4j", "log4j-slf4j-impl", LOG4J_VERSION))
    rendered = "\n".join(
        f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
        f"<version>{v}</version></dependency>"
        for g, a, v in deps
    )
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>workflow-jobs.local</groupId>
  <artifactId>kafka-classpath</artifactId>
  <version>{version}</version>
  <packaging>pom</packaging>
  <dependencies>
{rendered}
  </dependencies>
</project>
"""


@contextmanager
def exclusive(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_with_maven(
    target: Path,
    *,
    complete: Callable[[Path], bool],
    build: Callable[[str, Path], Path],
    missing_mvn: str,
    error: type[RuntimeError],
) -> Path:
    """``target``, made on first use by ``build(mvn, staging)``, which returns the result.

    Parallel test sessions may all arrive here at once; a file lock makes one of
    them build while the others wait, and ``target`` only appears (by an atomic
    rename of what ``build`` returned) once it is complete.
    """
    if complete(target):
        return target
    home = target.parent
    with exclusive(home / ".resolve.lock"):
        if complete(target):
            return target
        mvn = shutil.which("mvn")
        if mvn is None:
            raise error(missing_mvn)
        staging = Path(tempfile.mkdtemp(prefix=f"{target.name}-", dir=home))
        try:
            built = build(mvn, staging)
            if target.exists():
                shutil.rmtree(target)
            built.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def kafka_libs(version: str = KAFKA_VERSION, *, timeout_s: float = 900.0) -> Path:
    """The directory holding every jar the broker needs, resolving it on first use."""

    def resolve(mvn: str, staging: Path) -> Path:
        (staging / "pom.xml").write_text(_pom(version))
        jars = staging / "jars"
        try:
            proc = subprocess.run(
                [
                    mvn,
                    "-q",
                    "-B",
                    "-f",
                    str(staging / "pom.xml"),
                    "dependency:copy-dependencies",
                    f"-DoutputDirectory={jars}",
                    "-DincludeScope=runtime",
                ],
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise KafkaRuntimeError(
                f"mvn did not resolve Apache Kafka {version} within {timeout_s:.0f}s "
                "(is Maven Central reachable?)"
            ) from exc
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
            raise KafkaRuntimeError(
                f"mvn could not resolve org.apache.kafka:kafka_{SCALA_VERSION}:{version} "
                f"(exit {proc.returncode}):\n{tail}"
            )
        if not _complete(jars, version):
            raise KafkaRuntimeError(f"mvn finished but {jars} lacks the Kafka jars")
        return jars

    return build_with_maven(
        cache_root() / f"kafka-{version}" / "libs",
        complete=lambda libs: _complete(libs, version),
        build=resolve,
        missing_mvn=(
            "Apache Kafka's jars are resolved with Maven, but `mvn` is not on PATH "
            "(install Maven and a Java 17+ runtime)"
        ),
        error=KafkaRuntimeError,
    )


def _complete(libs: Path, version: str) -> bool:
    needed = (f"kafka_{SCALA_VERSION}-{version}.jar", f"kafka-server-{version}.jar")
    return all((libs / name).is_file() for name in needed)


# Flags for a broker that serves one test run or one developer: a single
# collector thread and the quick compiler only. Most of a short-lived broker's
# CPU goes to compiling code it runs a few thousand times at most.
LIGHT_JVM_FLAGS = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")


def class_archive_flags(libs: Path, java: str) -> tuple[list[str], Path | None]:
    """JVM flags sharing the broker's parsed classes between starts, and a file to adopt.

    The first broker on a machine writes the classes it loaded into a class data
    sharing archive when it exits; every later JVM maps that archive instead of
    parsing and verifying thousands of classes again. The archive is written
    under a name of its own and only renamed into place by
    :func:`adopt_class_archive` once its JVM has exited, so a start racing
    another never maps a half-written file. A JVM that finds the archive
    does not match it (another Java) ignores it and starts as usual.
    """
    archive = libs.parent / f"classes-{_java_fingerprint(java)}.jsa"
    if archive.is_file():
        return [f"-XX:SharedArchiveFile={archive}"], None
    pending = archive.with_name(f"{archive.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.partial")
    return [f"-XX:ArchiveClassesAtExit={pending}"], pending


def shared_archive_flags(libs: Path, java: str) -> list[str]:
    """Only the reading half of :func:`class_archive_flags`: for the short-lived tools."""
    archive = libs.parent / f"classes-{_java_fingerprint(java)}.jsa"
    return [f"-XX:SharedArchiveFile={archive}"] if archive.is_file() else []


def adopt_class_archive(pending: Path) -> None:
    """Move an archive its exited JVM wrote into place; drop one it never finished."""
    final = pending.with_name(pending.name.split(".jsa.", 1)[0] + ".jsa")
    if pending.is_file() and pending.stat().st_size > 0:
        os.replace(pending, final)
    else:
        pending.unlink(missing_ok=True)


def _java_fingerprint(java: str) -> str:
    # An archive only fits the JVM build that wrote it; the binary's identity
    # stands in for its version without starting a JVM to ask.
    real = Path(java).resolve()
    stat = real.stat()
    return hashlib.sha256(f"{real}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]


def new_cluster_id() -> str:
    """A cluster id in Kafka's format: URL-safe base64 of a random UUID, unpadded."""
    while True:
        encoded = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        # Kafka refuses ids that would read as a command-line flag.
        if not encoded.startswith("-"):
            return encoded


# What formatting a KRaft log dir writes: the bootstrap metadata (the release's
# feature levels, and any SCRAM users) and the identity of the node and the dir.
BOOTSTRAP_CHECKPOINT = "bootstrap.checkpoint"
META_PROPERTIES = "meta.properties"


def formatted_storage_key(version: str, properties: Mapping[str, str]) -> str:
    """Names what the bootstrap metadata depends on: the release's feature levels.

    Without ``--release-version`` or ``--feature`` the storage tool takes the
    release's latest stable levels, or its unstable ones when the
    ``unstable.*`` settings allow them.
    """
    unstable = sorted(
        (key, value) for key, value in properties.items() if key.startswith("unstable.")
    )
    described = "\n".join(f"{key}={value}" for key, value in unstable)
    return hashlib.sha256(f"{version}\n{described}".encode()).hexdigest()[:16]


def cached_bootstrap_checkpoint(libs: Path, key: str) -> Path:
    """Where the bootstrap metadata of a storage formatted under ``key`` is kept."""
    return libs.parent / f"{BOOTSTRAP_CHECKPOINT}-{key}"


def keep_bootstrap_checkpoint(log_dir: Path, cached: Path) -> None:
    """Keep a freshly formatted dir's bootstrap metadata, whole or not at all."""
    partial = cached.with_name(f"{cached.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.partial")
    shutil.copyfile(log_dir / BOOTSTRAP_CHECKPOINT, partial)
    os.replace(partial, cached)


def reuse_formatted_storage(log_dir: Path, cached: Path, *, cluster_id: str, node_id: str) -> None:
    """Lay out ``log_dir`` as the storage tool would, from bootstrap metadata kept earlier.

    The bootstrap metadata is the same for every format of a release with the
    same settings (no SCRAM users: their salts differ); the identity is what
    differs, so it is written new: this cluster's id and a fresh dir id.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(cached, log_dir / BOOTSTRAP_CHECKPOINT)
    meta = {
        "node.id": node_id,
        "directory.id": new_cluster_id(),
        "version": "1",
        "cluster.id": cluster_id,
    }
    (log_dir / META_PROPERTIES).write_text(render_properties(meta))


def server_properties(
    *,
    broker_port: int,
    controller_port: int,
    log_dir: Path,
    host: str = "127.0.0.1",
    num_partitions: int = 3,
    extra: Mapping[str, str] | None = None,
    sasl_ssl_port: int | None = None,
    sasl_ssl_keystore: Path | None = None,
    sasl_mechanism: str = "SCRAM-SHA-512",
    listeners: Mapping[str, tuple[str, int]] | None = None,
) -> dict[str, str]:
    """A single combined broker + controller, tuned to start fast and serve one test run.

    With ``sasl_ssl_port`` the broker also serves a SASL_SSL listener there:
    TLS with ``sasl_ssl_keystore`` (a PEM file holding the private key, then
    the certificate chain) and ``sasl_mechanism`` authentication, whose
    credentials are added when the storage is formatted (``--add-scram``).

    ``listeners`` adds more, by name: ``{"MTLS": ("SSL", port)}``; their
    ``listener.name.<name>.*`` settings come in ``extra``.
    """
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@{host}:{controller_port}",
        "listeners": f"PLAINTEXT://{host}:{broker_port},CONTROLLER://{host}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{host}:{broker_port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(log_dir),
        "num.partitions": str(num_partitions),
        "auto.create.topics.enable": "true",
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        "offsets.topic.replication.factor": "1",
        # Fifty partitions per internal topic is a cluster default; one broker
        # creating them on the first group join costs seconds for nothing.
        "offsets.topic.num.partitions": "5",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "5",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "num.network.threads": "3",
        "num.io.threads": "4",
        "log.retention.hours": "24",
    }
    if sasl_ssl_port is not None:
        if sasl_ssl_keystore is None:
            raise ValueError("a SASL_SSL listener needs a PEM keystore")
        listener = f"SASL_SSL://{host}:{sasl_ssl_port}"
        prefix = "listener.name.sasl_ssl."
        props["listeners"] += f",{listener}"
        props["advertised.listeners"] += f",{listener}"
        props["listener.security.protocol.map"] += ",SASL_SSL:SASL_SSL"
        props.update(
            {
                "sasl.enabled.mechanisms": sasl_mechanism,
                f"{prefix}sasl.enabled.mechanisms": sasl_mechanism,
                f"{prefix}{sasl_mechanism.lower()}.sasl.jaas.config": (
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;"
                ),
                f"{prefix}ssl.keystore.type": "PEM",
                f"{prefix}ssl.keystore.location": str(sasl_ssl_keystore),
                f"{prefix}ssl.client.auth": "none",
            }
        )
    for name, (protocol, port) in (listeners or {}).items():
        props["listeners"] += f",{name}://{host}:{port}"
        props["advertised.listeners"] += f",{name}://{host}:{port}"
        props["listener.security.protocol.map"] += f",{name}:{protocol}"
    props.update(extra or {})
    return props


def render_properties(props: Mapping[str, str]) -> str:
    return "".join(f"{key}={value}\n" for key, value in props.items())


LOG4J2_PROPERTIES = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
"""
