"""The pieces of an Apicurio Registry install that we make ourselves.

Apicurio Registry is a Confluent-compatible Schema Registry (its Confluent API is
served under ``/apis/ccompat/v7``). Its server is published on Maven Central as a
Quarkus distribution, ``io.apicurio:apicurio-registry-app:<version>:tar.gz:all``:
a runner jar and the ``lib/`` directory it names on its class path. It is fetched
with ``mvn`` into the per-user cache once per version, unpacked there, and started
with ``java -jar``. Its default storage is an in-memory H2 database, so a registry
lives exactly as long as its process.
"""

from __future__ import annotations

import subprocess
import tarfile
from collections.abc import Sequence
from pathlib import Path

from devstack.kafka import build_with_maven, cache_root

APICURIO_VERSION = "3.0.9"
APICURIO_ARTIFACT = "io.apicurio:apicurio-registry-app"
CCOMPAT_PATH = "/apis/ccompat/v7"


class RegistryRuntimeError(RuntimeError):
    """The registry's distribution could not be prepared."""


def runner_jar(dist: Path, version: str = APICURIO_VERSION) -> Path:
    return dist / f"apicurio-registry-app-{version}-runner.jar"


def apicurio_dist(version: str = APICURIO_VERSION, *, timeout_s: float = 900.0) -> Path:
    """The unpacked distribution (runner jar and ``lib/``), fetching it on first use."""

    def fetch(mvn: str, staging: Path) -> Path:
        archive = _fetch(mvn, version, staging, timeout_s)
        unpacked = staging / "dist"
        with tarfile.open(archive) as tar:
            tar.extractall(unpacked, filter="data")
        if not runner_jar(unpacked, version).is_file():
            raise RegistryRuntimeError(f"{archive.name} holds no runner jar")
        return unpacked

    return build_with_maven(
        cache_root() / f"apicurio-registry-{version}" / "dist",
        complete=lambda dist: runner_jar(dist, version).is_file(),
        build=fetch,
        missing_mvn=(
            "Apicurio Registry is fetched with Maven, but `mvn` is not on PATH "
            "(install Maven and a Java 17+ runtime)"
        ),
        error=RegistryRuntimeError,
    )


def _fetch(mvn: str, version: str, staging: Path, timeout_s: float) -> Path:
    coordinates = f"{APICURIO_ARTIFACT}:{version}:tar.gz:all"
    # `dependency:copy` of the one artifact: its POM's parent is not on Maven
    # Central, so nothing that reads the POM (copy-dependencies) can resolve it.
    # Run from the empty staging directory so no pom.xml around us is picked up.
    try:
        proc = subprocess.run(
            [
                mvn,
                "-q",
                "-B",
                "dependency:copy",
                f"-Dartifact={coordinates}",
                f"-DoutputDirectory={staging}",
            ],
            cwd=staging,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise RegistryRuntimeError(
            f"mvn did not fetch {coordinates} within {timeout_s:.0f}s (is Maven Central reachable?)"
        ) from exc
    archive = staging / f"apicurio-registry-app-{version}-all.tar.gz"
    if proc.returncode != 0 or not archive.is_file():
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
        raise RegistryRuntimeError(
            f"mvn could not fetch {coordinates} (exit {proc.returncode}):\n{tail}"
        )
    return archive


def server_argv(
    java: str,
    dist: Path,
    *,
    host: str,
    port: int,
    workdir: Path,
    heap: str = "384m",
    version: str = APICURIO_VERSION,
    extra: Sequence[str] = (),
) -> list[str]:
    """``java -jar`` of the runner, listening on ``host:port``, its scratch files in ``workdir``."""
    return [
        java,
        f"-Xmx{heap}",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",
        "-XX:+ExitOnOutOfMemoryError",
        "-Djava.awt.headless=true",
        f"-Djava.io.tmpdir={workdir}",
        f"-Dquarkus.http.host={host}",
        f"-Dquarkus.http.port={port}",
        *extra,
        "-jar",
        str(runner_jar(dist, version)),
    ]
