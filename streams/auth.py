"""Who is calling, and what they may do: bearer tokens, scopes and owners.

Every HTTP verb but ``/healthz`` and ``/readyz`` needs ``Authorization: Bearer
wfj_<id>_<secret>``, a token made with ``wfjobs tokens create`` (``store.tokens``).
A token carries a principal and scopes:

=================  ==========================================================
scope              lets the token
=================  ==========================================================
``submit``         submit jobs; each job records the principal as its owner
``read``           get and list jobs; get and list stored definitions
``complete``       answer a job's parked external step
``cancel``         cancel a job, one or by filter
``admin``          store definitions; the operator verbs (outbox and
                   dead-letter listings and redrives)
``define-inline``  submit a job with an inline definition instead of a
                   stored one (on top of ``submit``)
``fleet``          reach every owner's jobs with the verbs the other scopes
                   grant; grants no verb by itself
=================  ==========================================================

The one rule for owners: a token without ``fleet`` sees only the jobs its
principal owns. Someone else's job is answered as if it did not exist (404;
absent from lists), for every verb, operator verbs included. Jobs recorded
before owners existed have none and are reached only with ``fleet``; so are the
requests dead-letter topic's messages, which belong to nobody.

No token: 401 ``UNAUTHENTICATED``. A token without the verb's scope: 403
``PERMISSION_DENIED`` naming the scope. A revoked token is refused within
``VERIFIED_FOR_S``: a verified token is trusted that long, no longer.

``WFJOBS_AUTH=off`` turns all of this off: every caller is ``anonymous`` with
every scope. The worker says so loudly at start, and answers only requests
addressed to this machine by name (``localhost``, a loopback address) and sent
by no page or one of this machine: a web page served under a name its owner
resolves to 127.0.0.1 (DNS rebinding) is the browser's own origin, so only the
``Host`` header tells its requests from a local caller's, and a page elsewhere
may send some requests (a POST without a body) to 127.0.0.1 itself, which only
its ``Origin`` header tells.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from schemas.errors import InvalidArgument, PermissionDenied, Unauthenticated
from store.tokens import TokenRecord, TokenStore

SUBMIT = "submit"
READ = "read"
COMPLETE = "complete"
CANCEL = "cancel"
ADMIN = "admin"
DEFINE_INLINE = "define-inline"
FLEET = "fleet"
SCOPES = (SUBMIT, READ, COMPLETE, CANCEL, ADMIN, DEFINE_INLINE, FLEET)

# Who a caller is while auth is off, and the principal that owns what it submits.
ANONYMOUS = "anonymous"

# How long a verified token is trusted before it is looked up again: the most
# a revocation waits to take effect.
VERIFIED_FOR_S = 0.5
# Verified tokens remembered at most; past it the memory starts over.
_CACHE_ENTRIES = 1024


def parse_scopes(values: Iterable[str]) -> tuple[str, ...]:
    """Scopes named one by one or comma-separated; unknown names are refused."""
    found: set[str] = set()
    for value in values:
        found.update(part.strip() for part in value.split(",") if part.strip())
    unknown = sorted(found - set(SCOPES))
    if unknown:
        raise InvalidArgument(
            f"unknown scope(s) {', '.join(unknown)}; the scopes are {', '.join(SCOPES)}"
        )
    if not found:
        raise InvalidArgument(f"name at least one scope of {', '.join(SCOPES)}")
    return tuple(scope for scope in SCOPES if scope in found)


@dataclass(frozen=True, slots=True)
class Caller:
    """The principal behind a request and what its token lets it do."""

    principal: str
    scopes: frozenset[str]
    # The token's id; empty when auth is off.
    token_id: str = ""

    @property
    def fleet_wide(self) -> bool:
        return FLEET in self.scopes

    @property
    def visible_owner(self) -> str | None:
        """Whose jobs this caller reaches: its own, or (None) everyone's."""
        return None if self.fleet_wide else self.principal

    def require(self, scope: str) -> None:
        """``PermissionDenied`` unless the token carries ``scope``."""
        if scope not in self.scopes:
            raise PermissionDenied(
                f"this verb needs the {scope!r} scope; the token of {self.principal!r} "
                f"carries {', '.join(sorted(self.scopes)) or 'none'}"
            )

    def require_fleet(self, what: str) -> None:
        """``PermissionDenied`` unless the token reaches every owner's data."""
        if not self.fleet_wide:
            raise PermissionDenied(
                f"{what} belong to no owner: only a token with the {FLEET!r} scope reaches them"
            )


def require_inline_definitions(caller: Caller) -> None:
    """Refuse an inline definition unless the token carries ``define-inline``."""
    caller.require(DEFINE_INLINE)


ANONYMOUS_CALLER = Caller(ANONYMOUS, frozenset(SCOPES))


def require_local_caller(host: str, origin: str | None) -> None:
    """``PermissionDenied`` unless the request was sent to this machine by name
    (``Host``) and, when a browser says which page sent it (``Origin``), from
    a page of this machine: a page elsewhere may POST to 127.0.0.1 without a
    body, which no media type check stops."""
    if not _names_this_machine(host):
        raise PermissionDenied(
            "WFJOBS_AUTH=off: this worker answers only requests addressed to localhost, "
            f"127.0.0.1 or [::1], not to {host[:200]!r}"
        )
    if origin is not None and not _is_local_origin(origin):
        raise PermissionDenied(
            "WFJOBS_AUTH=off: this worker answers only pages served from localhost, "
            f"127.0.0.1 or [::1], not one from {origin[:200]!r}"
        )


def _is_local_origin(origin: str) -> bool:
    try:
        parts = urllib.parse.urlsplit(origin)
    except ValueError:
        return False
    return parts.scheme in {"http", "https"} and _names_this_machine(parts.netloc)


def _names_this_machine(host: str) -> bool:
    if host.startswith("["):
        name, bracket, _ = host[1:].partition("]")
        if not bracket:
            return False
    else:
        name = host.rpartition(":")[0] if ":" in host else host
    name = name.lower().removesuffix(".")
    # Browsers resolve localhost and its subdomains to loopback themselves (RFC 6761).
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


class Authenticator:
    """``Authorization`` header in, ``Caller`` out, or the 401 that says why not.

    ``tokens`` answers the token store, or raises ``Unavailable`` while there
    is none (no ``DATABASE_URL``, or the store still starting): with nothing to
    check a token against, every verb answers 503 as it would without auth.
    """

    def __init__(
        self,
        tokens: Callable[[], TokenStore],
        *,
        enabled: bool = True,
        verified_for_s: float = VERIFIED_FOR_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._tokens = tokens
        self.enabled = enabled
        self._verified_for_s = verified_for_s
        self._clock = clock
        # sha256(token) -> (trusted until, the token's record).
        self._verified: dict[bytes, tuple[float, TokenRecord]] = {}
        # sha256(token) -> the lookup under way: a burst of requests with one
        # token waits for one query rather than taking a connection each.
        self._looking_up: dict[bytes, asyncio.Task[TokenRecord | None]] = {}

    async def authenticate(self, authorization: str | None) -> Caller:
        if not self.enabled:
            return ANONYMOUS_CALLER
        tokens = self._tokens()
        scheme, _, token = (authorization or "").strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated(
                "this verb needs a token: send 'Authorization: Bearer <token>' "
                "(make one with `wfjobs tokens create`)"
            )
        record = await self._verify(token, tokens.verify)
        if record is None:
            raise Unauthenticated("the token is unknown or revoked")
        return Caller(record.principal, frozenset(record.scopes), record.id)

    async def _verify(
        self, token: str, lookup: Callable[[str], Awaitable[TokenRecord | None]]
    ) -> TokenRecord | None:
        key = hashlib.sha256(token.encode("utf-8", "replace")).digest()
        now = self._clock()
        cached = self._verified.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        pending = self._looking_up.get(key)
        if pending is None:
            pending = asyncio.ensure_future(lookup(token))
            self._looking_up[key] = pending
            pending.add_done_callback(lambda _: self._looking_up.pop(key, None))
        # Shielded: one caller that goes away must not cancel the others' lookup.
        record = await asyncio.shield(pending)
        if record is None:
            # Unknown tokens are not remembered: a stream of made-up ones
            # must not fill the memory.
            self._verified.pop(key, None)
            return None
        if len(self._verified) >= _CACHE_ENTRIES:
            self._verified.clear()
        self._verified[key] = (now + self._verified_for_s, record)
        return record


__all__ = [
    "ADMIN",
    "ANONYMOUS",
    "ANONYMOUS_CALLER",
    "CANCEL",
    "COMPLETE",
    "DEFINE_INLINE",
    "FLEET",
    "READ",
    "SCOPES",
    "SUBMIT",
    "VERIFIED_FOR_S",
    "Authenticator",
    "Caller",
    "parse_scopes",
    "require_inline_definitions",
    "require_local_caller",
]
