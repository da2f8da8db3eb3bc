"""Stored workflow definitions, addressed by name, each write bumping its version.

Writes are optimistic: a write may name the version it replaces (``if_version``,
the HTTP ``If-Match``) and then lands only on that version, or ask to create
only (``create_only``, ``If-None-Match: *``); a plain write replaces whatever
is stored.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from schemas.errors import InvalidArgument, NotFound, VersionMismatch
from schemas.names import WORKFLOW_NAME_FORM, WORKFLOW_NAME_PATTERN
from store.pool import Pool

_COLUMNS = "name, definition, created_at, updated_at, version"

PUT_DEFINITION_SQL = f"""
INSERT INTO workflow_definition (name, definition)
VALUES (%(name)s, %(definition)s)
ON CONFLICT (name) DO UPDATE
   SET definition = EXCLUDED.definition, updated_at = now(),
       version = workflow_definition.version + 1
RETURNING {_COLUMNS}
"""
CREATE_DEFINITION_SQL = f"""
INSERT INTO workflow_definition (name, definition)
VALUES (%(name)s, %(definition)s)
ON CONFLICT (name) DO NOTHING
RETURNING {_COLUMNS}
"""
REPLACE_DEFINITION_VERSION_SQL = f"""
UPDATE workflow_definition
   SET definition = %(definition)s, updated_at = now(), version = version + 1
 WHERE name = %(name)s AND version = %(version)s
RETURNING {_COLUMNS}
"""
GET_DEFINITION_SQL = f"""
SELECT {_COLUMNS} FROM workflow_definition WHERE name = %(name)s
"""
LIST_DEFINITIONS_SQL = f"""
SELECT {_COLUMNS} FROM workflow_definition
 WHERE name > %(after)s
 ORDER BY name
 LIMIT %(limit)s
"""

DEFAULT_LIST_LIMIT = 50
MAX_LIST_LIMIT = 500


@dataclass(frozen=True, slots=True)
class StoredDefinition:
    name: str
    definition: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    # 1 when first stored, one more with every write.
    version: int


@dataclass(frozen=True, slots=True)
class DefinitionPage:
    definitions: tuple[StoredDefinition, ...]
    # Empty when there is no further page.
    next_page_token: str


def encode_page_token(last_name: str) -> str:
    return base64.urlsafe_b64encode(last_name.encode()).decode("ascii")


def decode_page_token(token: str) -> str:
    """The name a page of the listing ended at; the next page starts after it."""
    try:
        name = base64.b64decode(token.encode("ascii"), altchars=b"-_", validate=True).decode()
        return validate_workflow_name(name)
    except (ValueError, UnicodeError, binascii.Error, InvalidArgument):
        raise InvalidArgument(
            f"page_token {token!r} is malformed; pass the next_page_token of a previous answer"
        ) from None


def validate_workflow_name(name: str) -> str:
    """A workflow name is 1-200 letters, digits, '.', '_' or '-', starting alphanumeric."""
    if not isinstance(name, str) or not WORKFLOW_NAME_PATTERN.fullmatch(name):
        raise InvalidArgument(f"workflow name {name!r} is malformed: use {WORKFLOW_NAME_FORM}")
    return name


class DefinitionStore:
    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    async def put(
        self,
        name: str,
        definition: dict[str, Any],
        *,
        if_version: int | None = None,
        create_only: bool = False,
    ) -> StoredDefinition:
        """Create or replace; jobs already submitted keep the snapshot they took.

        ``if_version`` replaces only that version; ``create_only`` only creates.
        Either refused raises ``VersionMismatch`` naming what is stored.
        """
        validate_workflow_name(name)
        if not isinstance(definition, dict):
            raise InvalidArgument(
                f"a workflow definition is a JSON object, got {type(definition).__name__}"
            )
        if if_version is not None and create_only:
            raise InvalidArgument("a write either names the version it replaces or creates")
        params: dict[str, Any] = {"name": name, "definition": Jsonb(definition)}
        statement = PUT_DEFINITION_SQL
        if create_only:
            statement = CREATE_DEFINITION_SQL
        elif if_version is not None:
            statement, params["version"] = REPLACE_DEFINITION_VERSION_SQL, if_version
        async with self._pool.connection() as conn:
            row = await (await conn.execute(statement, params)).fetchone()
            if row is None:
                current = await (await conn.execute(GET_DEFINITION_SQL, params)).fetchone()
        if row is not None:
            return StoredDefinition(*row)
        stored = f"version {current[4]} is stored" if current else "none is stored"
        wanted = "only to create it" if create_only else f"to replace version {if_version}"
        raise VersionMismatch(
            f"workflow {name!r} was not written: the write asked {wanted}, but {stored}"
        )

    async def get(self, name: str) -> StoredDefinition:
        validate_workflow_name(name)
        async with self._pool.connection() as conn:
            cursor = await conn.execute(GET_DEFINITION_SQL, {"name": name})
            row = await cursor.fetchone()
        if row is None:
            raise NotFound(f"no stored workflow named {name!r}")
        return StoredDefinition(*row)

    async def list(self, *, limit: int = 0, page_token: str = "") -> DefinitionPage:
        """Stored definitions by name; ``limit`` 0 means 50, above 500 is clamped.

        A definition may be as large as a request body: unpaged, a listing of
        them all would be as large as all of them together.
        """
        if limit < 0:
            raise InvalidArgument(f"limit must not be negative, got {limit}")
        limit = DEFAULT_LIST_LIMIT if limit == 0 else min(limit, MAX_LIST_LIMIT)
        # Every name sorts after the empty string.
        after = decode_page_token(page_token) if page_token else ""
        async with self._pool.connection() as conn:
            cursor = await conn.execute(LIST_DEFINITIONS_SQL, {"after": after, "limit": limit + 1})
            rows = await cursor.fetchall()
        definitions = tuple(StoredDefinition(*row) for row in rows[:limit])
        token = encode_page_token(definitions[-1].name) if len(rows) > limit else ""
        return DefinitionPage(definitions, token)
