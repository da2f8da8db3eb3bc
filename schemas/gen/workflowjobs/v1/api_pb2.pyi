import datetime

from schemas.gen.buf.validate import validate_pb2 as _validate_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Checkpoint(_message.Message):
    __slots__ = ("name", "skipped", "response")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    name: str
    skipped: bool
    response: _struct_pb2.Struct
    def __init__(self, name: _Optional[str] = ..., skipped: _Optional[bool] = ..., response: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("job_id", "workflow_name", "status", "attempt", "max_attempts", "run_after", "outstanding_step", "checkpoints", "input", "result", "verdict", "error", "lease_owner", "lease_until", "created_at", "updated_at", "owner", "resumed_from", "resumed_by", "deadline", "review_request", "step_deadline", "cancel_requested_at", "history")
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATUS_UNSPECIFIED: _ClassVar[Job.Status]
        QUEUED: _ClassVar[Job.Status]
        RUNNING: _ClassVar[Job.Status]
        WAITING: _ClassVar[Job.Status]
        COMPLETED: _ClassVar[Job.Status]
        FAILED: _ClassVar[Job.Status]
        DEAD: _ClassVar[Job.Status]
        CANCELLED: _ClassVar[Job.Status]
    STATUS_UNSPECIFIED: Job.Status
    QUEUED: Job.Status
    RUNNING: Job.Status
    WAITING: Job.Status
    COMPLETED: Job.Status
    FAILED: Job.Status
    DEAD: Job.Status
    CANCELLED: Job.Status
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_NAME_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    RUN_AFTER_FIELD_NUMBER: _ClassVar[int]
    OUTSTANDING_STEP_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LEASE_OWNER_FIELD_NUMBER: _ClassVar[int]
    LEASE_UNTIL_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FROM_FIELD_NUMBER: _ClassVar[int]
    RESUMED_BY_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    REVIEW_REQUEST_FIELD_NUMBER: _ClassVar[int]
    STEP_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REQUESTED_AT_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    workflow_name: str
    status: Job.Status
    attempt: int
    max_attempts: int
    run_after: _timestamp_pb2.Timestamp
    outstanding_step: str
    checkpoints: _containers.RepeatedCompositeFieldContainer[Checkpoint]
    input: _struct_pb2.Struct
    result: _struct_pb2.Struct
    verdict: str
    error: str
    lease_owner: str
    lease_until: _timestamp_pb2.Timestamp
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    owner: str
    resumed_from: str
    resumed_by: str
    deadline: _timestamp_pb2.Timestamp
    review_request: _struct_pb2.Struct
    step_deadline: _timestamp_pb2.Timestamp
    cancel_requested_at: _timestamp_pb2.Timestamp
    history: _containers.RepeatedCompositeFieldContainer[Attempt]
    def __init__(self, job_id: _Optional[str] = ..., workflow_name: _Optional[str] = ..., status: _Optional[_Union[Job.Status, str]] = ..., attempt: _Optional[int] = ..., max_attempts: _Optional[int] = ..., run_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., outstanding_step: _Optional[str] = ..., checkpoints: _Optional[_Iterable[_Union[Checkpoint, _Mapping]]] = ..., input: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., result: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., verdict: _Optional[str] = ..., error: _Optional[str] = ..., lease_owner: _Optional[str] = ..., lease_until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., owner: _Optional[str] = ..., resumed_from: _Optional[str] = ..., resumed_by: _Optional[str] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., review_request: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., step_deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cancel_requested_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., history: _Optional[_Iterable[_Union[Attempt, _Mapping]]] = ...) -> None: ...

class Attempt(_message.Message):
    __slots__ = ("attempt", "worker", "claimed_at", "ended_at", "outcome", "steps", "error", "error_class", "next_run_at")
    class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        OUTCOME_UNSPECIFIED: _ClassVar[Attempt.Outcome]
        COMPLETED: _ClassVar[Attempt.Outcome]
        FAILED: _ClassVar[Attempt.Outcome]
        PARKED: _ClassVar[Attempt.Outcome]
        RETRY_SCHEDULED: _ClassVar[Attempt.Outcome]
        DEAD: _ClassVar[Attempt.Outcome]
        SWEPT: _ClassVar[Attempt.Outcome]
        HANDED_BACK: _ClassVar[Attempt.Outcome]
        CANCELLED: _ClassVar[Attempt.Outcome]
        DEADLINE_PASSED: _ClassVar[Attempt.Outcome]
    OUTCOME_UNSPECIFIED: Attempt.Outcome
    COMPLETED: Attempt.Outcome
    FAILED: Attempt.Outcome
    PARKED: Attempt.Outcome
    RETRY_SCHEDULED: Attempt.Outcome
    DEAD: Attempt.Outcome
    SWEPT: Attempt.Outcome
    HANDED_BACK: Attempt.Outcome
    CANCELLED: Attempt.Outcome
    DEADLINE_PASSED: Attempt.Outcome
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_AT_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ERROR_CLASS_FIELD_NUMBER: _ClassVar[int]
    NEXT_RUN_AT_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    worker: str
    claimed_at: _timestamp_pb2.Timestamp
    ended_at: _timestamp_pb2.Timestamp
    outcome: Attempt.Outcome
    steps: _containers.RepeatedScalarFieldContainer[str]
    error: str
    error_class: str
    next_run_at: _timestamp_pb2.Timestamp
    def __init__(self, attempt: _Optional[int] = ..., worker: _Optional[str] = ..., claimed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., ended_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., outcome: _Optional[_Union[Attempt.Outcome, str]] = ..., steps: _Optional[_Iterable[str]] = ..., error: _Optional[str] = ..., error_class: _Optional[str] = ..., next_run_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class SubmitWorkflowRequest(_message.Message):
    __slots__ = ("job_id", "workflow", "workflow_name", "input", "max_attempts", "deadline_ms")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_NAME_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    workflow: _struct_pb2.Struct
    workflow_name: str
    input: _struct_pb2.Struct
    max_attempts: int
    deadline_ms: int
    def __init__(self, job_id: _Optional[str] = ..., workflow: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., workflow_name: _Optional[str] = ..., input: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., max_attempts: _Optional[int] = ..., deadline_ms: _Optional[int] = ...) -> None: ...

class SubmitWorkflowResponse(_message.Message):
    __slots__ = ("job", "created")
    JOB_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    job: Job
    created: bool
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class GetJobResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: Job
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ...) -> None: ...

class ExplainJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class Finding(_message.Message):
    __slots__ = ("sentence", "evidence")
    class EvidenceEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SENTENCE_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    sentence: str
    evidence: _containers.ScalarMap[str, str]
    def __init__(self, sentence: _Optional[str] = ..., evidence: _Optional[_Mapping[str, str]] = ...) -> None: ...

class OperatorAction(_message.Message):
    __slots__ = ("description", "command", "http")
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    HTTP_FIELD_NUMBER: _ClassVar[int]
    description: str
    command: str
    http: str
    def __init__(self, description: _Optional[str] = ..., command: _Optional[str] = ..., http: _Optional[str] = ...) -> None: ...

class OutboxState(_message.Message):
    __slots__ = ("pending", "failed", "published", "oldest_unsent_at", "last_error")
    PENDING_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    OLDEST_UNSENT_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    pending: int
    failed: int
    published: int
    oldest_unsent_at: _timestamp_pb2.Timestamp
    last_error: str
    def __init__(self, pending: _Optional[int] = ..., failed: _Optional[int] = ..., published: _Optional[int] = ..., oldest_unsent_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_error: _Optional[str] = ...) -> None: ...

class ExplainJobResponse(_message.Message):
    __slots__ = ("job_id", "status", "why", "next", "actions", "outbox", "delivery", "history", "as_of")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    WHY_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    OUTBOX_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    AS_OF_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    status: Job.Status
    why: _containers.RepeatedCompositeFieldContainer[Finding]
    next: _containers.RepeatedCompositeFieldContainer[Finding]
    actions: _containers.RepeatedCompositeFieldContainer[OperatorAction]
    outbox: OutboxState
    delivery: Finding
    history: _containers.RepeatedCompositeFieldContainer[Attempt]
    as_of: _timestamp_pb2.Timestamp
    def __init__(self, job_id: _Optional[str] = ..., status: _Optional[_Union[Job.Status, str]] = ..., why: _Optional[_Iterable[_Union[Finding, _Mapping]]] = ..., next: _Optional[_Iterable[_Union[Finding, _Mapping]]] = ..., actions: _Optional[_Iterable[_Union[OperatorAction, _Mapping]]] = ..., outbox: _Optional[_Union[OutboxState, _Mapping]] = ..., delivery: _Optional[_Union[Finding, _Mapping]] = ..., history: _Optional[_Iterable[_Union[Attempt, _Mapping]]] = ..., as_of: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("status", "workflow_name", "limit", "page_token")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_NAME_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    status: Job.Status
    workflow_name: str
    limit: int
    page_token: str
    def __init__(self, status: _Optional[_Union[Job.Status, str]] = ..., workflow_name: _Optional[str] = ..., limit: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "next_page_token")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    next_page_token: str
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CompleteStepRequest(_message.Message):
    __slots__ = ("job_id", "step_name", "response")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_NAME_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    step_name: str
    response: _struct_pb2.Struct
    def __init__(self, job_id: _Optional[str] = ..., step_name: _Optional[str] = ..., response: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class CompleteStepResponse(_message.Message):
    __slots__ = ("outcome", "job", "message")
    class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        OUTCOME_UNSPECIFIED: _ClassVar[CompleteStepResponse.Outcome]
        COMPLETED: _ClassVar[CompleteStepResponse.Outcome]
        ALREADY_DONE: _ClassVar[CompleteStepResponse.Outcome]
        WRONG_STATE: _ClassVar[CompleteStepResponse.Outcome]
        REJECTED: _ClassVar[CompleteStepResponse.Outcome]
    OUTCOME_UNSPECIFIED: CompleteStepResponse.Outcome
    COMPLETED: CompleteStepResponse.Outcome
    ALREADY_DONE: CompleteStepResponse.Outcome
    WRONG_STATE: CompleteStepResponse.Outcome
    REJECTED: CompleteStepResponse.Outcome
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    outcome: CompleteStepResponse.Outcome
    job: Job
    message: str
    def __init__(self, outcome: _Optional[_Union[CompleteStepResponse.Outcome, str]] = ..., job: _Optional[_Union[Job, _Mapping]] = ..., message: _Optional[str] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    reason: str
    def __init__(self, job_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelJobResponse(_message.Message):
    __slots__ = ("outcome", "job", "message")
    class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        OUTCOME_UNSPECIFIED: _ClassVar[CancelJobResponse.Outcome]
        CANCELLED: _ClassVar[CancelJobResponse.Outcome]
        CANCEL_REQUESTED: _ClassVar[CancelJobResponse.Outcome]
        ALREADY_CANCELLED: _ClassVar[CancelJobResponse.Outcome]
        ALREADY_FINISHED: _ClassVar[CancelJobResponse.Outcome]
    OUTCOME_UNSPECIFIED: CancelJobResponse.Outcome
    CANCELLED: CancelJobResponse.Outcome
    CANCEL_REQUESTED: CancelJobResponse.Outcome
    ALREADY_CANCELLED: CancelJobResponse.Outcome
    ALREADY_FINISHED: CancelJobResponse.Outcome
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    outcome: CancelJobResponse.Outcome
    job: Job
    message: str
    def __init__(self, outcome: _Optional[_Union[CancelJobResponse.Outcome, str]] = ..., job: _Optional[_Union[Job, _Mapping]] = ..., message: _Optional[str] = ...) -> None: ...

class CancelJobsRequest(_message.Message):
    __slots__ = ("status", "workflow_name", "owner", "created_before", "reason")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_NAME_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    CREATED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    status: Job.Status
    workflow_name: str
    owner: str
    created_before: _timestamp_pb2.Timestamp
    reason: str
    def __init__(self, status: _Optional[_Union[Job.Status, str]] = ..., workflow_name: _Optional[str] = ..., owner: _Optional[str] = ..., created_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelJobsResponse(_message.Message):
    __slots__ = ("cancelled", "cancel_requested")
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    cancelled: _containers.RepeatedScalarFieldContainer[str]
    cancel_requested: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, cancelled: _Optional[_Iterable[str]] = ..., cancel_requested: _Optional[_Iterable[str]] = ...) -> None: ...

class ResumeJobRequest(_message.Message):
    __slots__ = ("job_id", "from_step", "use_current_definition", "request_key", "max_attempts")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_STEP_FIELD_NUMBER: _ClassVar[int]
    USE_CURRENT_DEFINITION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_KEY_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    from_step: str
    use_current_definition: bool
    request_key: str
    max_attempts: int
    def __init__(self, job_id: _Optional[str] = ..., from_step: _Optional[str] = ..., use_current_definition: _Optional[bool] = ..., request_key: _Optional[str] = ..., max_attempts: _Optional[int] = ...) -> None: ...

class ResumeJobResponse(_message.Message):
    __slots__ = ("job", "created")
    JOB_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    job: Job
    created: bool
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class ResumeJobsRequest(_message.Message):
    __slots__ = ("statuses", "workflow_name", "owner", "created_before", "use_current_definition", "request_key", "limit")
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_NAME_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    CREATED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    USE_CURRENT_DEFINITION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_KEY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    statuses: _containers.RepeatedScalarFieldContainer[Job.Status]
    workflow_name: str
    owner: str
    created_before: _timestamp_pb2.Timestamp
    use_current_definition: bool
    request_key: str
    limit: int
    def __init__(self, statuses: _Optional[_Iterable[_Union[Job.Status, str]]] = ..., workflow_name: _Optional[str] = ..., owner: _Optional[str] = ..., created_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., use_current_definition: _Optional[bool] = ..., request_key: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ResumeJobsResponse(_message.Message):
    __slots__ = ("resumed", "refused")
    class Refusal(_message.Message):
        __slots__ = ("job_id", "code", "message")
        JOB_ID_FIELD_NUMBER: _ClassVar[int]
        CODE_FIELD_NUMBER: _ClassVar[int]
        MESSAGE_FIELD_NUMBER: _ClassVar[int]
        job_id: str
        code: str
        message: str
        def __init__(self, job_id: _Optional[str] = ..., code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    resumed: _containers.RepeatedCompositeFieldContainer[Job]
    refused: _containers.RepeatedCompositeFieldContainer[ResumeJobsResponse.Refusal]
    def __init__(self, resumed: _Optional[_Iterable[_Union[Job, _Mapping]]] = ..., refused: _Optional[_Iterable[_Union[ResumeJobsResponse.Refusal, _Mapping]]] = ...) -> None: ...

class StoredWorkflow(_message.Message):
    __slots__ = ("name", "definition", "created_at", "updated_at", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    definition: _struct_pb2.Struct
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    version: int
    def __init__(self, name: _Optional[str] = ..., definition: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., version: _Optional[int] = ...) -> None: ...

class PutWorkflowRequest(_message.Message):
    __slots__ = ("workflow",)
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    workflow: _struct_pb2.Struct
    def __init__(self, workflow: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class PutWorkflowResponse(_message.Message):
    __slots__ = ("workflow",)
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    workflow: StoredWorkflow
    def __init__(self, workflow: _Optional[_Union[StoredWorkflow, _Mapping]] = ...) -> None: ...

class GetWorkflowRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetWorkflowResponse(_message.Message):
    __slots__ = ("workflow",)
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    workflow: StoredWorkflow
    def __init__(self, workflow: _Optional[_Union[StoredWorkflow, _Mapping]] = ...) -> None: ...

class ListWorkflowsRequest(_message.Message):
    __slots__ = ("limit", "page_token")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    limit: int
    page_token: str
    def __init__(self, limit: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListWorkflowsResponse(_message.Message):
    __slots__ = ("workflows", "next_page_token")
    WORKFLOWS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    workflows: _containers.RepeatedCompositeFieldContainer[StoredWorkflow]
    next_page_token: str
    def __init__(self, workflows: _Optional[_Iterable[_Union[StoredWorkflow, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ErrorBody(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...
