"""Whole databases on a server: create, drop, probe, and name them in a DSN.

Synchronous on purpose: the embedded stack and the test services manage
databases before any event loop exists, and each call is one short statement.
``admin_dsn`` is a DSN of any database on the server other than the one acted on.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import pq, sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from schemas.errors import InvalidArgument

__all__ = [
    "DatabaseError",
    "check_connects",
    "check_dsn",
    "connects",
    "create_database",
    "database_name",
    "drop_database",
    "dsn_with_database",
    "ensure_database",
]

# What every call here raises when the server refuses or is unreachable.
DatabaseError = psycopg.Error

PROBE = "select 1"
DATABASE_EXISTS = "SELECT 1 FROM pg_database WHERE datname = %s"
CREATE_DATABASE = sql.SQL("CREATE DATABASE {}")
# FORCE disconnects the database's clients instead of failing while any remain.
DROP_DATABASE_DISCONNECTING_CLIENTS = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")


def dsn_with_database(dsn: str, dbname: str) -> str:
    """``dsn`` pointing at another database, in the same style (URL or key=value)."""
    if dsn.startswith(("postgresql://", "postgres://")):
        parts = urlsplit(dsn)
        return urlunsplit(parts._replace(path=f"/{dbname}"))
    return make_conninfo(dsn, dbname=dbname)


def check_dsn(dsn: str) -> None:
    """Refuse a DSN libpq cannot read, with libpq's reason, before anything connects.

    Neither the DSN nor the parts of it libpq quotes are echoed: the part it
    cannot read is often the password (a bare ``%`` in it, a space).
    """
    try:
        conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        reason = _QUOTED.sub(_unless_libpqs_own, str(exc).strip())
        raise InvalidArgument(f"the database URL does not parse: {reason}") from None


_QUOTED = re.compile(r'"([^"]*)"')


def _unless_libpqs_own(quoted: re.Match[str]) -> str:
    # libpq's own words (its option names, the "=" or "]" it looked for) say
    # what is wrong; anything else it quotes came from the DSN.
    own = {"=", "]"} | {option.keyword.decode() for option in pq.Conninfo.get_defaults()}
    return quoted[0] if quoted[1] in own else '"..."'


def database_name(dsn_or_name: str) -> str:
    """The database a DSN names; a bare name is returned as it is."""
    if "=" not in dsn_or_name and "/" not in dsn_or_name:
        return dsn_or_name
    name = conninfo_to_dict(dsn_or_name).get("dbname")
    if not isinstance(name, str) or not name:
        raise ValueError(f"no database name in {dsn_or_name!r}")
    return name


def create_database(admin_dsn: str, name: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(CREATE_DATABASE.format(sql.Identifier(name)))


def ensure_database(admin_dsn: str, name: str) -> None:
    """Create database ``name`` unless it exists."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        found = conn.execute(DATABASE_EXISTS, (name,))
        if found.fetchone() is None:
            conn.execute(CREATE_DATABASE.format(sql.Identifier(name)))


def drop_database(admin_dsn: str, name: str) -> None:
    """Drop database ``name`` if it exists, disconnecting its clients."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(DROP_DATABASE_DISCONNECTING_CLIENTS.format(sql.Identifier(name)))


def check_connects(dsn: str, timeout_s: float) -> None:
    """Connect and run a query; raises :data:`DatabaseError` saying why it could not."""
    with psycopg.connect(dsn, connect_timeout=max(1, int(timeout_s))) as conn:
        conn.execute(PROBE)


def connects(dsn: str, timeout_s: float = 2.0) -> bool:
    """Whether the server accepts a connection and a query now (a starting one does not)."""
    try:
        check_connects(dsn, timeout_s)
    except psycopg.OperationalError:
        return False
    return True
