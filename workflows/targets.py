"""Which ``host:port`` step targets a deployment lets its workers call, and how.

A definition's author chooses its step targets, and the worker dials them with
bytes the author controls. So a deployment lists the targets steps may call
(``WFJOBS_STEP_TARGETS``), and a definition naming any other is refused when it
is stored or submitted, before anything is dialled; the channel cache refuses
it again at call time, for snapshots stored before the list changed.

A pattern is ``HOST:PORT``. ``HOST`` is a name or address matched as written
(case-insensitively), ``*`` for any host, or ``*.example.internal`` for any name
under that domain; ``PORT`` is a number or ``*``. Patterns match the target's
text: names resolve when they are dialled, so allow only names whose DNS you
trust. ``local`` (in-process handlers) needs no pattern. A target that is not a
plain ``host:port`` (``unix:443`` is a socket to gRPC) is refused whatever the
patterns say.

TLS is chosen per pattern too (``WFJOBS_STEP_TARGET_TLS``): the first rule whose
pattern matches a target decides how its channel is secured; a target no rule
matches is called over plaintext.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from workflows.envelope import GRPC_SCHEMES, DefinitionError, host_port_problem
from workflows.steps import CompiledWorkflow

_HOST = re.compile(
    r"\*|\*\.[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?"
)
_TARGET = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[^:\[\]]+):(?P<port>[0-9]{1,5})")


@dataclass(frozen=True, slots=True)
class TargetPattern:
    """One ``HOST:PORT`` pattern; ``port`` None matches any port."""

    host: str
    port: int | None
    text: str

    @classmethod
    def parse(cls, text: str) -> TargetPattern:
        raw = text.strip()
        host, sep, port = raw.rpartition(":")
        if not sep or not _HOST.fullmatch(host):
            raise ValueError(
                f"{raw!r} is not a target pattern: use HOST:PORT, where HOST is a name, "
                "an address, * or *.domain, and PORT a number or *"
            )
        if port == "*":
            number = None
        elif port.isdigit() and 1 <= int(port) <= 65535:
            number = int(port)
        else:
            raise ValueError(f"{raw!r}: the port must be 1-65535 or *, got {port!r}")
        # A host no target may name (``unix``, ``dns``...) would match nothing,
        # and a deployment that lists it expects the opposite.
        if host.lower() in GRPC_SCHEMES:
            raise ValueError(
                f"{raw!r} can never match: gRPC reads {host!r} as a resolver scheme, not a "
                "host, so no step target may name it"
            )
        return cls(host.lower(), number, raw)

    def matches(self, target: str) -> bool:
        found = _TARGET.fullmatch(target)
        if found is None:
            return False
        host = found["host"].lower()
        if self.port is not None and int(found["port"]) != self.port:
            return False
        if self.host == "*":
            return True
        if self.host.startswith("*."):
            return host.endswith(self.host[1:]) and len(host) > len(self.host) - 1
        return host == self.host


class TargetPolicy:
    """The allow-list of step targets."""

    def __init__(self, patterns: Iterable[TargetPattern]) -> None:
        self.patterns = tuple(patterns)

    @classmethod
    def parse(cls, texts: Iterable[str]) -> TargetPolicy:
        return cls(TargetPattern.parse(text) for text in texts if text.strip())

    def allows(self, target: str) -> bool:
        if host_port_problem(target) is not None:
            return False
        return any(pattern.matches(target) for pattern in self.patterns)

    def describe(self) -> str:
        if not self.patterns:
            return "none: steps run in-process handlers only"
        return ", ".join(pattern.text for pattern in self.patterns)

    def refusal(self, target: str) -> str:
        problem = host_port_problem(target)
        if problem is not None:
            return problem
        return (
            f"{target!r} is not an allowed step target; this deployment allows "
            f"{self.describe()} (WFJOBS_STEP_TARGETS)"
        )

    def check(self, workflow: CompiledWorkflow) -> None:
        """Refuse a workflow with a step target the list does not allow."""
        for step in workflow.steps:
            target = step.remote_target
            if target is not None and not self.allows(target):
                raise DefinitionError(
                    f"steps[{step.index}] {step.name!r}.target: {self.refusal(target)}",
                    path=f"steps[{step.index}].target",
                )


# Any host, any port: for callers of the engine that choose their own targets.
ALLOW_ALL = TargetPolicy([TargetPattern("*", None, "*:*")])


@dataclass(frozen=True, slots=True)
class TlsRule:
    """How to secure channels to targets matching ``pattern``.

    ``ca`` is a PEM bundle of roots (None: the system's); ``cert`` and ``key``
    a client certificate chain and its key, for servers that ask for one;
    ``authority`` the name to expect on the server's certificate when it is
    not the target's host.
    """

    pattern: TargetPattern
    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = None
    authority: str | None = None

    @classmethod
    def parse(cls, text: str) -> TlsRule:
        """``PATTERN[;ca=PATH][;cert=PATH;key=PATH][;authority=NAME]``; files are read now."""
        pattern_text, *options = [part.strip() for part in text.split(";")]
        pattern = TargetPattern.parse(pattern_text)
        values: dict[str, str] = {}
        for option in options:
            name, sep, value = option.partition("=")
            name = name.strip()
            if not sep or name not in {"ca", "cert", "key", "authority"} or not value.strip():
                raise ValueError(
                    f"{text.strip()!r}: {option!r} is not one of ca=PATH, cert=PATH, key=PATH, "
                    "authority=NAME"
                )
            if name in values:
                raise ValueError(f"{text.strip()!r}: {name} is given twice")
            values[name] = value.strip()
        if ("cert" in values) != ("key" in values):
            raise ValueError(f"{text.strip()!r}: a client certificate needs both cert= and key=")
        rule = cls(
            pattern,
            ca=_read(values.get("ca"), text),
            cert=_read(values.get("cert"), text),
            key=_read(values.get("key"), text),
            authority=values.get("authority"),
        )
        _check_usable(rule, values, text)
        return rule


# PKCS#8's header of an encrypted key, and the traditional form's.
_ENCRYPTED_KEY_MARKERS = (b"-----BEGIN ENCRYPTED PRIVATE KEY-----", b"Proc-Type: 4,ENCRYPTED")


def _check_usable(rule: TlsRule, paths: dict[str, str], text: str) -> None:
    """The files as a channel takes them. gRPC reads them only when a call dials,
    and then every call to the target fails as if it could not be reached."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    shown = text.strip()
    if rule.ca is not None:
        try:
            context.load_verify_locations(cadata=rule.ca.decode("latin-1"))
        except (ssl.SSLError, ValueError) as exc:
            raise ValueError(f"{shown!r}: ca= holds no PEM certificate: {exc}") from None
    if rule.key is None:
        return
    if any(marker in rule.key for marker in _ENCRYPTED_KEY_MARKERS):
        raise ValueError(f"{shown!r}: key= is encrypted, and gRPC takes no password for it")
    try:
        context.load_cert_chain(paths["cert"], paths["key"], password="")
    except (ssl.SSLError, OSError) as exc:
        raise ValueError(
            f"{shown!r}: cert= and key= are not a PEM certificate and its key: {exc}"
        ) from None


def _read(path: str | None, text: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{text.strip()!r}: cannot read {path}: {exc.strerror}") from None


def tls_for(rules: Iterable[TlsRule], target: str) -> TlsRule | None:
    """The first rule whose pattern matches ``target``."""
    for rule in rules:
        if rule.pattern.matches(target):
            return rule
    return None


__all__ = ["ALLOW_ALL", "TargetPattern", "TargetPolicy", "TlsRule", "tls_for"]
