"""Stored workflow definitions: put (create or replace), get, list; names validated."""

from __future__ import annotations

import pytest

from schemas.errors import InvalidArgument, NotFound
from store.definitions import DefinitionStore
from store.runs import RunStore
from tests.integration.store.helpers import DEFINITION, submit


async def test_put_get_list(definitions: DefinitionStore) -> None:
    created = await definitions.put("embed-text", DEFINITION)
    assert created.name == "embed-text"
    assert created.definition == DEFINITION
    assert created.created_at == created.updated_at

    replaced = await definitions.put("embed-text", {**DEFINITION, "deadlineMs": 5000})
    assert replaced.definition["deadlineMs"] == 5000
    assert replaced.created_at == created.created_at
    assert replaced.updated_at >= created.updated_at

    assert await definitions.get("embed-text") == replaced
    await definitions.put("a.first_one", {"name": "a.first_one"})
    listed = await definitions.list()
    assert [stored.name for stored in listed.definitions] == ["a.first_one", "embed-text"]


async def test_a_live_job_keeps_its_snapshot(definitions: DefinitionStore, store: RunStore) -> None:
    await definitions.put("embed-text", DEFINITION)
    job = (await submit(store)).job
    await definitions.put("embed-text", {"name": "embed-text", "steps": []})
    assert (await store.get(job.job_id)).definition == DEFINITION


async def test_bad_names_and_missing_definitions(definitions: DefinitionStore) -> None:
    for name in ("", "-leading-dash", "has space", "slash/name", "x" * 201, "ünïcode"):
        with pytest.raises(InvalidArgument, match="starting with a letter or digit"):
            await definitions.put(name, DEFINITION)
    with pytest.raises(InvalidArgument, match="malformed"):
        await definitions.get("no such")
    with pytest.raises(NotFound, match="no stored workflow named 'missing'"):
        await definitions.get("missing")
    with pytest.raises(InvalidArgument, match="JSON object"):
        await definitions.put("ok", ["not", "an", "object"])  # type: ignore[arg-type]
    assert (await definitions.list()).definitions == ()
    await definitions.put("x" * 200, {})
