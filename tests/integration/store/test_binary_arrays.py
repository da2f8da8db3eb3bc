"""Array parameters written in binary form read back on the server as the values sent."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

from store.binary_arrays import binary_array
from store.pool import Pool

EXAMPLES: list[tuple[str, list[Any]]] = [
    ("uuid", [uuid.UUID(int=0), uuid.uuid4(), None]),
    ("text", ["", "worker-1", "naïve ☃ 𝄞", None, "x" * 5000]),
    ("int", [0, 1, -1, 2**31 - 1, -(2**31), None]),
    ("bigint", [0, 2**63 - 1, -(2**63), None, 1_764_633_600_000_000]),
    ("bytea", [b"", b"\x00\xff" * 40, None]),
    (
        "timestamptz",
        [
            datetime(2026, 12, 2, 10, 30, 0, 123456, tzinfo=UTC),
            datetime(1999, 12, 31, 23, 59, 59, tzinfo=timezone(timedelta(hours=-5))),
            None,
        ],
    ),
]


@pytest.mark.parametrize(("sql_type", "values"), EXAMPLES, ids=[e[0] for e in EXAMPLES])
async def test_an_array_reads_back_element_for_element(
    pool: Pool, sql_type: str, values: list[Any]
) -> None:
    async with pool.connection() as conn:
        cursor = await conn.execute(
            f"SELECT %(full)b::{sql_type}[], %(empty)b::{sql_type}[],"
            f" cardinality(%(full)b::{sql_type}[]), array_lower(%(full)b::{sql_type}[], 1)",
            {"full": binary_array(sql_type, values), "empty": binary_array(sql_type, [])},
        )
        row = await cursor.fetchone()
    assert row is not None
    assert row[0] == values
    assert row[1] == []
    assert (row[2], row[3]) == (len(values), 1)


async def test_jsonb_elements_read_back_as_the_objects_wrapped(pool: Pool) -> None:
    from psycopg.types.json import Jsonb

    objects = [{"name": "tokenize", "response": {"n": [1, 2.5, None]}}, [], "ünï", None]
    async with pool.connection() as conn:
        cursor = await conn.execute(
            "SELECT %(values)b::jsonb[]",
            {"values": binary_array("jsonb", [None if o is None else Jsonb(o) for o in objects])},
        )
        row = await cursor.fetchone()
    assert row is not None and row[0] == objects


@pytest.mark.parametrize(
    ("sql_type", "value", "error"),
    [
        ("text", "a\x00b", psycopg.DataError),
        ("int", 2**31, psycopg.DataError),
        ("bigint", -(2**63) - 1, psycopg.DataError),
        ("timestamptz", datetime(2026, 12, 2), psycopg.DataError),
        ("int", True, TypeError),
        ("uuid", "not-a-uuid-object", TypeError),
    ],
)
def test_an_element_psycopg_would_refuse_is_refused_before_anything_is_sent(
    sql_type: str, value: Any, error: type[Exception]
) -> None:
    with pytest.raises(error):
        binary_array(sql_type, ["fine" if sql_type == "text" else None, value])
