"""The error hierarchy every layer raises and the API answers with.

Each error carries a stable ``code``; the HTTP layer maps codes to statuses in
one table, and the CLI prints the code with the message.
"""

from __future__ import annotations


class WorkflowJobsError(Exception):
    """Base of every error the product raises on purpose."""

    code = "INTERNAL"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(WorkflowJobsError):
    """The caller sent something malformed; retrying the same input cannot help."""

    code = "INVALID_ARGUMENT"


class UnstorableValue(InvalidArgument):
    """The database refuses a value on every try (e.g. U+0000 in a JSON string).

    Not an outage: requeueing the job would meet the same refusal forever.
    """


class EventTooLarge(UnstorableValue):
    """An event (or the request that submits a job) would exceed the event size limit.

    The broker refuses such a message on every try, so like any unstorable value
    it is refused before anything is committed, and a job that produced it fails.
    """

    code = "PAYLOAD_TOO_LARGE"


class NotFound(WorkflowJobsError):
    code = "NOT_FOUND"


class AlreadyExists(WorkflowJobsError):
    """The caller named something (a job id) that is taken, by someone it cannot see."""

    code = "ALREADY_EXISTS"


class FailedPrecondition(WorkflowJobsError):
    """The target exists but is in a state that does not allow the operation."""

    code = "FAILED_PRECONDITION"


class PayloadTooLarge(WorkflowJobsError):
    code = "PAYLOAD_TOO_LARGE"


class UnsupportedMediaType(WorkflowJobsError):
    """A request body of a type the API does not take (it takes application/json only)."""

    code = "UNSUPPORTED_MEDIA_TYPE"


class WrongState(WorkflowJobsError):
    """complete-step on a job that is not WAITING on that step."""

    code = "WRONG_STATE"


class ResourceExhausted(WorkflowJobsError):
    code = "RESOURCE_EXHAUSTED"


class Unauthenticated(WorkflowJobsError):
    """No token, or one that is malformed, unknown or revoked."""

    code = "UNAUTHENTICATED"


class PermissionDenied(WorkflowJobsError):
    """The token is good but lacks the scope the verb needs."""

    code = "PERMISSION_DENIED"


class VersionMismatch(WorkflowJobsError):
    """A conditional write (``If-Match``) named a version that is no longer current."""

    code = "VERSION_MISMATCH"


class Unavailable(WorkflowJobsError):
    """A dependency (the store, the broker) is not configured or not reachable."""

    code = "UNAVAILABLE"


class WorkerIdTaken(FailedPrecondition):
    """Another live process runs under this process's worker id (``WFJOBS_WORKER_ID``).

    Both would hold, renew and settle jobs as the same ``lease_owner``; the
    process that finds the id taken must not run.
    """


class LeaseLost(WorkflowJobsError):
    """A fenced write found that this worker no longer holds the job's lease.

    Nothing was changed and nothing was published; the worker must drop the job.
    """

    code = "FAILED_PRECONDITION"


class ContractViolation(WorkflowJobsError):
    """A message broke the CEL rules of its schema: a bug, raised loudly."""

    code = "INTERNAL"
