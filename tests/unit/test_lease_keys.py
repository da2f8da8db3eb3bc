"""A lease keys the claim loops' books: equal leases are one key, different claims two."""

from __future__ import annotations

import uuid
from dataclasses import replace

from store.records import Lease


def test_a_lease_is_one_key_and_another_claim_of_the_job_another() -> None:
    lease = Lease(job_id=uuid.uuid4(), worker_id="w-1", attempt=1, workflow_name="w", token=7)
    same = replace(lease)
    reclaimed = replace(lease, attempt=2, token=8)
    # The same token under another holder cannot happen in the store, but the
    # books must still keep the two apart: equality compares every field.
    other_holder = replace(lease, worker_id="w-2")
    books = {lease: "first"}
    books[same] = "again"
    assert books == {lease: "again"}
    assert {lease, reclaimed, other_holder} == {lease, reclaimed, other_holder}
    assert len({lease, same, reclaimed, other_holder}) == 3
