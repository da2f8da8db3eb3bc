"""Stored workflow definitions, addressed by name."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from schemas.errors import InvalidArgument, NotFound
from store.pool import Pool

WORKFLOW_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")

PUT_DEFINITION_SQL = """
INSERT INTO workflow_definition (name, definition)
VALUES (%(name)s, %(definition)s)
ON CONFLICT (name) DO UPDATE SET definition = EXCLUDED.definition, updated_at = now()
RETURNING name, definition, created_at, updated_at
"""
GET_DEFINITION_SQL = """
SELECT name, definition, created_at, updated_at FROM workflow_definition WHERE name = %(name)s
"""
LIST_DEFINITIONS_SQL = """
SELECT name, definition, created_at, updated_at FROM workflow_definition ORDER BY name
"""


@dataclass(frozen=True, slots=True)
class StoredDefinition:
    name: str
    definition: dict[str, Any]
    created_at: datetime
    updated_at: datetime


def validate_workflow_name(name: str) -> str:
    """A workflow name is 1-200 letters, digits, '.', '_' or '-', starting alphanumeric."""
    if not isinstance(name, str) or not WORKFLOW_NAME_PATTERN.fullmatch(name):
        raise InvalidArgument(
            f"workflow name {name!r} is malformed: use 1 to 200 characters from "
            "letters, digits, '.', '_' and '-', starting with a letter or digit"
        )
    return name


class DefinitionStore:
    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    async def put(self, name: str, definition: dict[str, Any]) -> StoredDefinition:
        """Create or replace; jobs already submitted keep the snapshot they took."""
        validate_workflow_name(name)
        if not isinstance(definition, dict):
            raise InvalidArgument(
                f"a workflow definition is a JSON object, got {type(definition).__name__}"
            )
        async with self._pool.connection() as conn:
            cursor = await conn.execute(
                PUT_DEFINITION_SQL, {"name": name, "definition": Jsonb(definition)}
            )
            row = await cursor.fetchone()
        assert row is not None
        return StoredDefinition(*row)

    async def get(self, name: str) -> StoredDefinition:
        validate_workflow_name(name)
        async with self._pool.connection() as conn:
            cursor = await conn.execute(GET_DEFINITION_SQL, {"name": name})
            row = await cursor.fetchone()
        if row is None:
            raise NotFound(f"no stored workflow named {name!r}")
        return StoredDefinition(*row)

    async def list(self) -> list[StoredDefinition]:
        """Every stored definition, by name."""
        async with self._pool.connection() as conn:
            cursor = await conn.execute(LIST_DEFINITIONS_SQL)
            rows = await cursor.fetchall()
        return [StoredDefinition(*row) for row in rows]
