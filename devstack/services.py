"""``python -m devstack.services {postgres|kafka|tansu|registry}``: one server, by hand.

Starts the service (or adopts the address the environment names: see each
launcher), prints its address, and runs until SIGINT or SIGTERM, when it stops
what it started by pid. The launchers live one per module: :mod:`devstack.postgres`,
:mod:`devstack.apache_kafka`, :mod:`devstack.tansu` and
:mod:`devstack.schema_registry`, on the process helpers of :mod:`devstack.processes`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence

from devstack.apache_kafka import ApacheKafkaService
from devstack.postgres import PostgresService
from devstack.processes import ServiceError, StopSignals, log_tail
from devstack.schema_registry import SchemaRegistryService
from devstack.tansu import TansuService

_AnyService = PostgresService | ApacheKafkaService | TansuService | SchemaRegistryService
_SERVICES: Mapping[str, Callable[[], _AnyService]] = {
    "postgres": PostgresService,
    "kafka": ApacheKafkaService,
    "tansu": TansuService,
    "registry": SchemaRegistryService,
}


def _address(service: _AnyService) -> str:
    if isinstance(service, PostgresService):
        return service.dsn
    if isinstance(service, SchemaRegistryService):
        return service.url
    return service.bootstrap_servers


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devstack.services",
        description="Start one service, print its address, run until SIGINT or SIGTERM.",
    )
    parser.add_argument("service", choices=sorted(_SERVICES))
    args = parser.parse_args(argv)

    with StopSignals() as stops:
        return _run(args.service, stops)


def _run(name: str, stops: StopSignals) -> int:
    service = _SERVICES[name]()
    try:
        service.start()
    except ServiceError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 1
    try:
        print(_address(service), flush=True)
        print(
            f"{name}: pid {service.pid or '-'}, log {service.log_path or '-'}; Ctrl-C to stop",
            file=sys.stderr,
            flush=True,
        )
        while not stops.wait(1.0):
            code = service.exit_code()
            if code is not None:
                log = service.log_path
                tail = log_tail(log) if log else ""
                print(f"{name} exited with code {code}:\n{tail}", file=sys.stderr)
                return 1
        return 0
    finally:
        service.stop()


if __name__ == "__main__":
    raise SystemExit(main())
