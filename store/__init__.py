"""Everything that speaks SQL: pool, migrations, run store, outbox, stored definitions."""

from store.channels import JOBS_QUEUED_CHANNEL, OUTBOX_CHANNEL
from store.definitions import DefinitionStore, StoredDefinition, validate_workflow_name
from store.migrate import MigrationError, migrate
from store.outbox import (
    Backlog,
    DeadLetter,
    Outbox,
    OutboxRecord,
    OutboxRow,
    Publisher,
    PublishFailure,
    RelayResult,
)
from store.pool import Pool, create_pool, open_pool
from store.records import (
    ClaimedJob,
    CompleteStepResult,
    Job,
    JobPage,
    JobSummary,
    Lease,
    RetryOutcome,
    SegmentProgress,
    StepOutcome,
    StepVerifier,
    SubmitResult,
    SweepResult,
)
from store.runs import RunStore
from store.states import STATUSES, TERMINAL, TRANSITIONS, Status

__all__ = [
    "JOBS_QUEUED_CHANNEL",
    "OUTBOX_CHANNEL",
    "STATUSES",
    "TERMINAL",
    "TRANSITIONS",
    "Backlog",
    "ClaimedJob",
    "CompleteStepResult",
    "DeadLetter",
    "DefinitionStore",
    "Job",
    "JobPage",
    "JobSummary",
    "Lease",
    "MigrationError",
    "Outbox",
    "OutboxRecord",
    "OutboxRow",
    "Pool",
    "PublishFailure",
    "Publisher",
    "RelayResult",
    "RetryOutcome",
    "RunStore",
    "SegmentProgress",
    "Status",
    "StepOutcome",
    "StepVerifier",
    "StoredDefinition",
    "SubmitResult",
    "SweepResult",
    "create_pool",
    "migrate",
    "open_pool",
    "validate_workflow_name",
]
