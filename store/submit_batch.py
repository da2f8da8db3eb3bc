"""Every submit's write: one statement and one commit, for one job or many.

The rows are the ones ``RunStore.submit_params`` and
``RunStore.submit_failed_params`` build (a QUEUED job with its ACCEPTED event,
or a refused request with its FAILED event); a single submit is a batch of one.
The batch is one round trip and one commit, however many rows it carries.

Each row is inserted unless its job_id exists; the answer lists, in the order
given, the job each row names and whether the batch created it. A concurrent
submit of the same id in another transaction can hide a row from both branches
of the statement; those rows are simply asked again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any
from uuid import UUID

from store.binary_arrays import binary_array
from store.errors import refused_value
from store.pool import Pool
from store.records import SubmitResult, job_from_row
from store.submit_batch_sql import SUBMIT_BATCH_SQL, SUBMIT_ONE_SQL

# Every row's parameter names, in the arrays the statement unnests, and their types.
_ROW_KEYS = (
    ("job_id", "uuid"),
    ("workflow_name", "text"),
    ("definition_hash", "text"),
    ("status", "text"),
    ("max_attempts", "int"),
    ("error", "text"),
    ("owner", "text"),
    ("deadline_ms", "bigint"),
    ("event_type", "text"),
    ("payload", "bytea"),
    ("traceparent", "text"),
    ("tracestate", "text"),
)
_TRIES = 3


def batch_params(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The statement's arrays: one element per row, each distinct definition once."""
    params: dict[str, Any] = {
        key: binary_array(sql_type, [row[key] for row in rows]) for key, sql_type in _ROW_KEYS
    }
    params["input"] = binary_array("text", [_json(row["input"].obj) for row in rows])
    snapshots: dict[str, str] = {}
    for row in rows:
        definition = row["definition"]
        if definition is not None and row["definition_hash"] not in snapshots:
            snapshots[row["definition_hash"]] = _json(definition.obj)
    params["snapshot_hash"] = binary_array("text", snapshots)
    params["snapshot"] = binary_array("text", snapshots.values())
    return params


async def submit_rows(pool: Pool, rows: Sequence[Mapping[str, Any]]) -> list[SubmitResult]:
    """Insert every row unless its job_id exists, in one statement; answers in ``rows`` order.

    The job ids must be distinct: which of two rows naming one job would win is
    for the caller to decide.
    """
    ids = [row["job_id"] for row in rows]
    if len(set(ids)) != len(ids):
        raise ValueError("a submit batch names the same job_id twice")
    found: dict[UUID, SubmitResult] = {}
    pending = list(rows)
    async with pool.connection() as conn:
        for _ in range(_TRIES):
            if not pending:
                break
            try:
                # Prepared from the first use on each connection: every submit
                # runs one of these two, so parsing and planning them again on
                # each new connection's first executions buys nothing.
                if len(pending) == 1:
                    cursor = await conn.execute(SUBMIT_ONE_SQL, dict(pending[0]), prepare=True)
                else:
                    cursor = await conn.execute(
                        SUBMIT_BATCH_SQL, batch_params(pending), prepare=True
                    )
            except Exception as exc:
                refused = refused_value(exc, f"store a batch of {len(pending)} jobs")
                if refused is None:
                    raise
                raise refused from exc
            for answer in await cursor.fetchall():
                job, created = job_from_row(answer[1:]), bool(answer[0])
                found[job.job_id] = SubmitResult(job=job, created=created)
            pending = [row for row in pending if row["job_id"] not in found]
    if pending:  # pragma: no cover
        raise RuntimeError(f"job {pending[0]['job_id']} neither inserted nor found")
    results = []
    for row in rows:
        result = found[row["job_id"]]
        if result.created and row["definition"] is not None:
            # Not read back from the server: it is the one just sent.
            result = replace(result, job=replace(result.job, definition=row["definition"].obj))
        results.append(result)
    return results


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


__all__ = ["batch_params", "submit_rows"]
