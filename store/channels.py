"""LISTEN/NOTIFY channels the migrations' triggers signal on.

A notification only shortens a wait; polling remains the contract, so a
listener that misses one (or was not connected) loses nothing.
"""

from __future__ import annotations

# A row became claimable now: submitted, resumed, handed back or swept back.
JOBS_QUEUED_CHANNEL = "workflow_run_queued"

# An outbox row was written that someone is waiting for: ACCEPTED, WAITING or a
# terminal event. Step checkpoints do not notify, to keep NOTIFY's commit
# serialization off the hot path; the relay's next pass or poll takes them.
OUTBOX_CHANNEL = "workflow_run_outbox"
