"""The workflow engine: definitions, CEL rules, step invokers, the runner, failures.

No I/O of its own beyond calling steps: no SQL, no Kafka, no Faust. The service
compiles definitions through a :class:`DefinitionCache`, runs segments with
:func:`run_segment` and sorts failures by :class:`FailureKind`.

Handler authors need :class:`HandlerRegistry`, :class:`StepContext`,
:class:`RetryableError` and :class:`NonRetryableError`.
"""

from workflows.cache import DefinitionCache, default_cache
from workflows.compiler import compile_definition
from workflows.envelope import DEFAULT_DEADLINE_MS, DefinitionError, definition_hash
from workflows.failures import (
    FailureKind,
    NonRetryableError,
    RetryableError,
    SegmentDeadlineExceeded,
    StepFailure,
    classify,
)
from workflows.invokers import (
    GrpcChannels,
    HandlerRegistry,
    StepContext,
    default_channels,
    default_registry,
    handler,
    load_handler_modules,
)
from workflows.runner import (
    CheckpointObserver,
    Completed,
    Parked,
    SegmentOutcome,
    SynchronousRunRefused,
    run_segment,
    run_workflow,
)
from workflows.steps import CompiledWorkflow, InputError, ResponseError, Step

__all__ = [
    "DEFAULT_DEADLINE_MS",
    "CheckpointObserver",
    "CompiledWorkflow",
    "Completed",
    "DefinitionCache",
    "DefinitionError",
    "FailureKind",
    "GrpcChannels",
    "HandlerRegistry",
    "InputError",
    "NonRetryableError",
    "Parked",
    "ResponseError",
    "RetryableError",
    "SegmentDeadlineExceeded",
    "SegmentOutcome",
    "Step",
    "StepContext",
    "StepFailure",
    "SynchronousRunRefused",
    "classify",
    "compile_definition",
    "default_cache",
    "default_channels",
    "default_registry",
    "definition_hash",
    "handler",
    "load_handler_modules",
    "run_segment",
    "run_workflow",
]
