from schemas.gen.buf.validate import validate_pb2 as _validate_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkflowRunRequest(_message.Message):
    __slots__ = ("job_id", "workflow_name", "input", "principal", "deadline_ms")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_NAME_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    workflow_name: str
    input: _struct_pb2.Struct
    principal: str
    deadline_ms: int
    def __init__(self, job_id: _Optional[str] = ..., workflow_name: _Optional[str] = ..., input: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., principal: _Optional[str] = ..., deadline_ms: _Optional[int] = ...) -> None: ...

class StepCompletion(_message.Message):
    __slots__ = ("job_id", "step_name", "response", "principal", "request_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_NAME_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    step_name: str
    response: _struct_pb2.Struct
    principal: str
    request_id: str
    def __init__(self, job_id: _Optional[str] = ..., step_name: _Optional[str] = ..., response: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., principal: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class StepCompletionResult(_message.Message):
    __slots__ = ("job_id", "step_name", "request_id", "outcome", "message")
    class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        OUTCOME_UNSPECIFIED: _ClassVar[StepCompletionResult.Outcome]
        COMPLETED: _ClassVar[StepCompletionResult.Outcome]
        ALREADY_DONE: _ClassVar[StepCompletionResult.Outcome]
        WRONG_STATE: _ClassVar[StepCompletionResult.Outcome]
        REJECTED: _ClassVar[StepCompletionResult.Outcome]
        NOT_FOUND: _ClassVar[StepCompletionResult.Outcome]
        INVALID: _ClassVar[StepCompletionResult.Outcome]
    OUTCOME_UNSPECIFIED: StepCompletionResult.Outcome
    COMPLETED: StepCompletionResult.Outcome
    ALREADY_DONE: StepCompletionResult.Outcome
    WRONG_STATE: StepCompletionResult.Outcome
    REJECTED: StepCompletionResult.Outcome
    NOT_FOUND: StepCompletionResult.Outcome
    INVALID: StepCompletionResult.Outcome
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_NAME_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    step_name: str
    request_id: str
    outcome: StepCompletionResult.Outcome
    message: str
    def __init__(self, job_id: _Optional[str] = ..., step_name: _Optional[str] = ..., request_id: _Optional[str] = ..., outcome: _Optional[_Union[StepCompletionResult.Outcome, str]] = ..., message: _Optional[str] = ...) -> None: ...
