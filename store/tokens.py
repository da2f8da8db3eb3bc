"""API tokens: issued, listed, revoked and looked up, stored hashed.

A token reads ``wfj_<id>_<secret>``: ``id`` is 12 hex digits, not secret (it
names the token in ``wfjobs tokens list`` and in logs), and ``secret`` is 32
random bytes in URL-safe base64. The store keeps the SHA-256 of the secret,
never the secret: it is printed once, when the token is made. A high-entropy
secret needs no slow hash; a plain one cannot be reversed by guessing.

What a principal may do with a token (its scopes) is the service's business
(``streams.auth``); here a scope is only a name that is stored.

``create_token``, ``list_tokens`` and ``revoke_token`` open their own short
connection, for the command line and the embedded stack, which have no pool:
an operator with the database in reach can always make the first token.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import TupleRow

from schemas.errors import InvalidArgument, NotFound
from store.pool import Pool, connection_kwargs

TOKEN_PREFIX = "wfj"
_TOKEN = re.compile(r"wfj_(?P<id>[0-9a-f]{12})_(?P<secret>[A-Za-z0-9_-]{43})")
_ID = re.compile(r"[0-9a-f]{12}")
PRINCIPAL_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:-]{0,199}")

_TOKEN_COLUMNS = "id, principal, scopes, created_at, revoked_at"

INSERT_TOKEN_SQL = f"""
INSERT INTO api_token (id, secret_hash, principal, scopes)
VALUES (%(id)s, %(secret_hash)s, %(principal)s, %(scopes)s)
RETURNING {_TOKEN_COLUMNS}
"""
LIST_TOKENS_SQL = f"""
SELECT {_TOKEN_COLUMNS} FROM api_token ORDER BY created_at, id
"""
# Revoking twice keeps the first revocation's time.
REVOKE_TOKEN_SQL = f"""
UPDATE api_token SET revoked_at = coalesce(revoked_at, now())
 WHERE id = %(id)s
RETURNING {_TOKEN_COLUMNS}
"""
# Only live tokens are found: a revoked one is as good as unknown.
SELECT_LIVE_TOKEN_SQL = f"""
SELECT {_TOKEN_COLUMNS}, secret_hash FROM api_token WHERE id = %(id)s AND revoked_at IS NULL
"""


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """What is known of a token, its secret excepted."""

    id: str
    principal: str
    scopes: tuple[str, ...]
    created_at: datetime
    revoked_at: datetime | None


@dataclass(frozen=True, slots=True)
class IssuedToken:
    """A token just made: ``token`` is the one copy of its secret there will ever be."""

    token: str
    record: TokenRecord


def _record(row: Sequence[Any]) -> TokenRecord:
    token_id, principal, scopes, created_at, revoked_at = row[:5]
    return TokenRecord(token_id, principal, tuple(scopes), created_at, revoked_at)


def _secret_hash(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("ascii")).digest()


def _matching(row: Sequence[Any] | None, secret: str) -> TokenRecord | None:
    """The token ``row`` holds, if ``secret`` is its secret (compared in constant time)."""
    if row is None or not hmac.compare_digest(bytes(row[5]), _secret_hash(secret)):
        return None
    return _record(row)


def split_token(token: str) -> tuple[str, str] | None:
    """``(id, secret)`` of a well-formed token, else None."""
    match = _TOKEN.fullmatch(token)
    return (match["id"], match["secret"]) if match else None


def validate_principal(principal: str) -> str:
    if not isinstance(principal, str) or not PRINCIPAL_PATTERN.fullmatch(principal):
        raise InvalidArgument(
            f"principal {principal!r} is malformed: use 1 to 200 characters from letters, "
            "digits, '.', '_', '@', ':' and '-', starting with a letter or digit"
        )
    return principal


def malformed_principal(principal: str) -> str | None:
    """Why ``principal``, sent in a message's ``principal`` field, cannot own a
    job (one no token could name would be out of every HTTP caller's reach);
    None when it can."""
    try:
        validate_principal(principal)
    except InvalidArgument as exc:
        return f"principal: {exc.message}"
    return None


def validate_token_id(token_id: str) -> str:
    if not _ID.fullmatch(token_id):
        raise InvalidArgument(
            f"token id {token_id!r} is malformed: it is the 12 hex digits after 'wfj_'"
        )
    return token_id


class TokenStore:
    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    async def verify(self, token: str) -> TokenRecord | None:
        """The live token ``token`` is, or None (malformed, unknown, revoked, wrong secret)."""
        parts = split_token(token)
        if parts is None:
            return None
        token_id, secret = parts
        async with self._pool.connection() as conn:
            row = await (await conn.execute(SELECT_LIVE_TOKEN_SQL, {"id": token_id})).fetchone()
        return _matching(row, secret)


async def _issue(
    conn: AsyncConnection[TupleRow], principal: str, scopes: Iterable[str]
) -> IssuedToken:
    principal = validate_principal(principal)
    # In the order given, once each.
    wanted = list(dict.fromkeys(scopes))
    token_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    cursor = await conn.execute(
        INSERT_TOKEN_SQL,
        {
            "id": token_id,
            "secret_hash": _secret_hash(secret),
            "principal": principal,
            "scopes": wanted,
        },
    )
    row = await cursor.fetchone()
    assert row is not None
    return IssuedToken(f"{TOKEN_PREFIX}_{token_id}_{secret}", _record(row))


async def _connect(dsn: str) -> AsyncConnection[TupleRow]:
    return await psycopg.AsyncConnection.connect(dsn, **connection_kwargs("workflow-jobs tokens"))


async def create_token(dsn: str, principal: str, scopes: Iterable[str]) -> IssuedToken:
    """A new token for ``principal`` with ``scopes``, written to the database at ``dsn``."""
    async with await _connect(dsn) as conn:
        return await _issue(conn, principal, scopes)


async def list_tokens(dsn: str) -> list[TokenRecord]:
    """Every token, revoked ones included, oldest first."""
    async with await _connect(dsn) as conn:
        rows = await (await conn.execute(LIST_TOKENS_SQL)).fetchall()
    return [_record(row) for row in rows]


async def revoke_token(dsn: str, token_id: str) -> TokenRecord:
    """Revoke the token ``token_id`` names; NotFound when there is none."""
    validate_token_id(token_id)
    async with await _connect(dsn) as conn:
        row = await (await conn.execute(REVOKE_TOKEN_SQL, {"id": token_id})).fetchone()
    if row is None:
        raise NotFound(f"no token with id {token_id!r}")
    return _record(row)


async def live_token(dsn: str, token: str) -> TokenRecord | None:
    """The live token ``token`` is in the database at ``dsn``, else None."""
    parts = split_token(token)
    if parts is None:
        return None
    async with await _connect(dsn) as conn:
        row = await (await conn.execute(SELECT_LIVE_TOKEN_SQL, {"id": parts[0]})).fetchone()
    return _matching(row, parts[1])


__all__ = [
    "IssuedToken",
    "TokenRecord",
    "TokenStore",
    "create_token",
    "list_tokens",
    "live_token",
    "revoke_token",
    "split_token",
    "validate_principal",
    "validate_token_id",
]
