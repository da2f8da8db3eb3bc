import datetime

from schemas.gen.buf.validate import validate_pb2 as _validate_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkflowRunEvent(_message.Message):
    __slots__ = ("event_id", "job_id", "type", "workflow_name", "attempt", "step_name", "response", "skipped", "verdict", "error", "result", "occurred_at", "next_run_at", "resumed_from", "resumed_by", "review_request", "deadline", "reason")
    class Type(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        TYPE_UNSPECIFIED: _ClassVar[WorkflowRunEvent.Type]
        TYPE_ACCEPTED: _ClassVar[WorkflowRunEvent.Type]
        TYPE_STEP_CHECKPOINT: _ClassVar[WorkflowRunEvent.Type]
        TYPE_WAITING: _ClassVar[WorkflowRunEvent.Type]
        TYPE_COMPLETED: _ClassVar[WorkflowRunEvent.Type]
        TYPE_FAILED: _ClassVar[WorkflowRunEvent.Type]
        TYPE_DEAD: _ClassVar[WorkflowRunEvent.Type]
        TYPE_CANCELLED: _ClassVar[WorkflowRunEvent.Type]
        TYPE_RETRY_SCHEDULED: _ClassVar[WorkflowRunEvent.Type]
        TYPE_RESUMED: _ClassVar[WorkflowRunEvent.Type]
    TYPE_UNSPECIFIED: WorkflowRunEvent.Type
    TYPE_ACCEPTED: WorkflowRunEvent.Type
    TYPE_STEP_CHECKPOINT: WorkflowRunEvent.Type
    TYPE_WAITING: WorkflowRunEvent.Type
    TYPE_COMPLETED: WorkflowRunEvent.Type
    TYPE_FAILED: WorkflowRunEvent.Type
    TYPE_DEAD: WorkflowRunEvent.Type
    TYPE_CANCELLED: WorkflowRunEvent.Type
    TYPE_RETRY_SCHEDULED: WorkflowRunEvent.Type
    TYPE_RESUMED: WorkflowRunEvent.Type
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_NAME_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STEP_NAME_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    OCCURRED_AT_FIELD_NUMBER: _ClassVar[int]
    NEXT_RUN_AT_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FROM_FIELD_NUMBER: _ClassVar[int]
    RESUMED_BY_FIELD_NUMBER: _ClassVar[int]
    REVIEW_REQUEST_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    event_id: int
    job_id: str
    type: WorkflowRunEvent.Type
    workflow_name: str
    attempt: int
    step_name: str
    response: _struct_pb2.Struct
    skipped: bool
    verdict: str
    error: str
    result: _struct_pb2.Struct
    occurred_at: _timestamp_pb2.Timestamp
    next_run_at: _timestamp_pb2.Timestamp
    resumed_from: str
    resumed_by: str
    review_request: _struct_pb2.Struct
    deadline: str
    reason: str
    def __init__(self, event_id: _Optional[int] = ..., job_id: _Optional[str] = ..., type: _Optional[_Union[WorkflowRunEvent.Type, str]] = ..., workflow_name: _Optional[str] = ..., attempt: _Optional[int] = ..., step_name: _Optional[str] = ..., response: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., skipped: _Optional[bool] = ..., verdict: _Optional[str] = ..., error: _Optional[str] = ..., result: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., occurred_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., next_run_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., resumed_from: _Optional[str] = ..., resumed_by: _Optional[str] = ..., review_request: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., deadline: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...
