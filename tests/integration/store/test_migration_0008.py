"""Migration 0008 moves each job's definition copy into one snapshot per hash.

A database is brought to 0007 with the real files, given rows the way the
previous release wrote them, then migrated the rest of the way: every row
reads back the definition it was submitted with.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from store.migrate import migrate
from store.pool import open_pool
from store.runs import RunStore
from tests.conftest import MigrationsBefore

FIRST_NEW = "0008"


def definition(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "steps": [{"name": "tokenize", "method": "t.T/Tokenize"}], **extra}


OLD_ROW = """
INSERT INTO workflow_run (job_id, workflow_name, workflow_definition, definition_hash,
                          input, status, max_attempts)
VALUES (%s, %s, %s, %s, '{}', %s, 3)
"""


async def test_existing_rows_stay_readable_after_0008(
    make_database: Callable[[], str], migrations_before: MigrationsBefore
) -> None:
    dsn = make_database()
    before_0008 = migrations_before(FIRST_NEW)
    applied = await migrate(dsn, package=before_0008)
    assert applied and all(name < FIRST_NEW for name in applied)

    shared, unkeyed = definition("shared"), definition("unkeyed")
    # Two rows claiming one hash for two different definitions.
    clash_one, clash_two = definition("clash", v=1), definition("clash", v=2)
    rows = {
        "queued": ("shared", shared, "h-shared", "QUEUED"),
        "done": ("shared", shared, "h-shared", "COMPLETED"),
        "unkeyed": ("unkeyed", unkeyed, "", "COMPLETED"),
        "clash-1": ("clash", clash_one, "h-clash", "COMPLETED"),
        "clash-2": ("clash", clash_two, "h-clash", "COMPLETED"),
        "refused": ("missing", None, "", "FAILED"),
    }
    ids = {key: uuid.uuid4() for key in rows}
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for key, (name, snapshot, digest, status) in rows.items():
            value = Jsonb(snapshot) if snapshot is not None else None
            await conn.execute(OLD_ROW, (ids[key], name, value, digest, status))

    assert FIRST_NEW + "_definition_snapshots.sql" in await migrate(dsn)

    pool = await open_pool(dsn, min_size=1, max_size=2)
    try:
        store = RunStore(pool)
        for key, (_, snapshot, _, _) in rows.items():
            assert (await store.get(ids[key])).definition == snapshot, key
        claimed = await store.claim("w1")
        assert claimed is not None and claimed.job_id == ids["queued"]
        assert claimed.definition == shared
        assert claimed.job.definition_hash == "h-shared"
        async with pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT hash FROM workflow_definition_snapshot ORDER BY hash"
            )
            hashes = [row[0] for row in await cursor.fetchall()]
            cursor = await conn.execute(
                "SELECT count(*) FROM information_schema.columns"
                " WHERE table_name = 'workflow_run' AND column_name = 'workflow_definition'"
            )
            assert await cursor.fetchone() == (0,)
        # One snapshot per distinct definition: the shared one under its own
        # hash, the unkeyed and clashing ones under their content's.
        assert len(hashes) == 4
        assert "h-shared" in hashes and "h-clash" not in hashes
        assert sum(digest.startswith("jsonb-sha256:") for digest in hashes) == 3
        unkeyed_hash = (await store.get(ids["unkeyed"])).definition_hash
        assert unkeyed_hash.startswith("jsonb-sha256:")
        assert (await store.get(ids["refused"])).definition_hash == ""
    finally:
        await pool.close()
