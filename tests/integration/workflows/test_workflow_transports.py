"""The engine end to end over both transports: in-process handlers and a real gRPC server.

The server is a ``grpc.aio`` server on 127.0.0.1, its services built from the
test descriptor set, started and stopped here.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
import pytest
import pytest_asyncio
from google.protobuf import descriptor_pb2, json_format

from tests.workflows_fixtures import (
    EMBED,
    REVIEW,
    TOKENIZE,
    CallLog,
    TestGrpcServer,
    embed_vector,
    envelope,
    make_registry,
    message_class,
    tokenize_ids,
    unused_target,
)
from workflows import (
    Completed,
    FailureKind,
    GrpcChannels,
    HandlerRegistry,
    Parked,
    StepFailure,
    SynchronousRunRefused,
    compile_definition,
    run_segment,
    run_workflow,
)

TEXT = "the quick brown fox"


@dataclass
class Transport:
    name: str
    target: str
    registry: HandlerRegistry
    calls: CallLog
    channels: GrpcChannels

    def envelope(self, **options: Any) -> dict[str, Any]:
        return envelope(target=self.target, **options)

    async def run(
        self,
        definition: dict[str, Any],
        input: dict[str, Any],
        checkpoints: list[dict[str, Any]] | None = None,
        *,
        attempt: int = 1,
        job_id: str = "job-t",
        **hooks: Any,
    ) -> tuple[Any, list[dict[str, Any]]]:
        workflow = compile_definition(definition)
        entries: list[dict[str, Any]] = []

        async def observe(entry: dict[str, Any]) -> None:
            entries.append(entry)

        outcome = await run_segment(
            workflow,
            workflow.validate_input(input),
            checkpoints or [],
            job_id=job_id,
            attempt=attempt,
            on_checkpoint=observe,
            registry=self.registry,
            channels=self.channels,
            **hooks,
        )
        return outcome, entries


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def grpc_server() -> AsyncIterator[TestGrpcServer]:
    async with TestGrpcServer() as server:
        yield server


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def channels() -> AsyncIterator[GrpcChannels]:
    pool = GrpcChannels()
    yield pool
    await pool.close()


@pytest.fixture(params=["python", "grpc"])
def transport(
    request: pytest.FixtureRequest, grpc_server: TestGrpcServer, channels: GrpcChannels
) -> Transport:
    if request.param == "python":
        calls = CallLog()
        return Transport("python", "local", make_registry(calls), calls, channels)
    grpc_server.calls = CallLog()
    grpc_server.metadata.clear()
    return Transport("grpc", grpc_server.target, HandlerRegistry(), grpc_server.calls, channels)


async def test_three_steps_checkpoint_proto3_json(transport: Transport) -> None:
    outcome, entries = await transport.run(transport.envelope(review="invoke"), {"text": TEXT})
    assert isinstance(outcome, Completed)
    assert outcome.verdict == "completed 3 steps: tokenize, embed, review"
    ids = tokenize_ids(TEXT)
    assert [entry["name"] for entry in entries] == ["tokenize", "embed", "review"]
    types = ["jobs.test.Tokens", "jobs.test.Embedding", "jobs.test.ReviewResult"]
    for entry, type_name in zip(entries, types, strict=True):
        json_format.ParseDict(entry["response"], message_class(type_name)())
    assert entries[0]["response"] == {"ids": ids, "count": len(ids)}
    assert entries[1]["response"] == {"vector": embed_vector(ids), "dimensions": 4}
    assert entries[2]["response"]["approved"] is True
    assert transport.calls.counts == {TOKENIZE: 1, EMBED: 1, REVIEW: 1}
    assert transport.calls.keys == ["job-t:tokenize", "job-t:embed", "job-t:review"]


async def test_resume_does_not_call_the_first_step_again(transport: Transport) -> None:
    definition = transport.envelope(review="invoke")
    _, entries = await transport.run(definition, {"text": TEXT})
    assert transport.calls[TOKENIZE] == 1

    outcome, more = await transport.run(definition, {"text": TEXT}, entries[:1], attempt=2)
    assert isinstance(outcome, Completed)
    assert transport.calls[TOKENIZE] == 1
    assert transport.calls[EMBED] == 2 and transport.calls[REVIEW] == 2
    assert [entry["name"] for entry in more] == ["embed", "review"]
    assert transport.calls.attempts[-2:] == [2, 2]


async def test_a_changed_definition_under_a_live_job_fails_loudly(transport: Transport) -> None:
    definition = transport.envelope(review="invoke")
    renamed = [{"name": "tokens", "skipped": False, "response": {"ids": [1], "count": 1}}]
    with pytest.raises(StepFailure) as caught:
        await transport.run(definition, {"text": TEXT}, renamed)
    assert caught.value.kind is FailureKind.NON_RETRYABLE
    assert "checkpoint 0 names step 'tokens'" in caught.value.message
    assert "the definition changed under a live job" in caught.value.message

    reshaped = [{"name": "tokenize", "skipped": False, "response": {"vector": [0.5]}}]
    with pytest.raises(StepFailure) as caught:
        await transport.run(definition, {"text": TEXT}, reshaped)
    assert caught.value.kind is FailureKind.NON_RETRYABLE
    assert "no longer parses as jobs.test.Tokens" in caught.value.message
    assert "the definition changed under a live job" in caught.value.message
    assert sum(transport.calls.counts.values()) == 0


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        ("UNAVAILABLE", FailureKind.RETRYABLE),
        ("DEADLINE_EXCEEDED", FailureKind.RETRYABLE),
        ("RESOURCE_EXHAUSTED", FailureKind.RETRYABLE),
        ("INVALID_ARGUMENT", FailureKind.NON_RETRYABLE),
        ("PERMISSION_DENIED", FailureKind.NON_RETRYABLE),
        ("INTERNAL", FailureKind.NON_RETRYABLE),
    ],
)
async def test_grpc_statuses_are_classified(
    transport: Transport, status: str, kind: FailureKind
) -> None:
    with pytest.raises(StepFailure) as caught:
        await transport.run(transport.envelope(review="invoke"), {"text": TEXT, "fail": status})
    assert caught.value.kind is kind
    assert caught.value.step_name == "tokenize"
    if transport.name == "grpc":
        # The peer's own text stays out of the job: the code and a fixed message.
        assert caught.value.message.startswith(f"gRPC {status} from {transport.target}: ")
        assert "test fault" not in caught.value.message
    else:
        assert caught.value.message == f"gRPC {status}: test fault {status}"


async def test_a_failed_validate_rule_is_a_verdict(transport: Transport) -> None:
    with pytest.raises(StepFailure) as caught:
        await transport.run(transport.envelope(review="invoke"), {"text": "reject it"})
    assert caught.value.kind is FailureKind.VERDICT
    assert caught.value.violations == ("validate rule `response.approved` is false",)
    assert caught.value.response is not None
    assert caught.value.response["approved"] is False


async def test_an_external_step_parks_without_being_invoked(transport: Transport) -> None:
    outcome, entries = await transport.run(transport.envelope(review="external"), {"text": TEXT})
    assert isinstance(outcome, Parked)
    assert outcome.step_name == "review"
    assert outcome.request == {"text": TEXT, "dimensions": 4}
    assert [entry["name"] for entry in entries] == ["tokenize", "embed"]
    assert transport.calls[REVIEW] == 0


async def test_a_segment_over_its_deadline_is_retryable(transport: Transport) -> None:
    definition = transport.envelope(review="invoke", deadline_ms=150)
    started = time.monotonic()
    with pytest.raises(StepFailure) as caught:
        await transport.run(definition, {"text": TEXT, "delay_ms": 3000})
    assert time.monotonic() - started < 2
    assert caught.value.kind is FailureKind.RETRYABLE
    assert caught.value.step_name == "tokenize"


async def test_synchronous_mode_runs_and_refuses_external(transport: Transport) -> None:
    result = await run_workflow(
        transport.envelope(review="invoke"),
        {"text": TEXT},
        registry=transport.registry,
        channels=transport.channels,
    )
    assert result["ids"] == tokenize_ids(TEXT)
    with pytest.raises(SynchronousRunRefused, match=r"submit-workflow"):
        await run_workflow(
            transport.envelope(review="external"), {"text": TEXT}, registry=transport.registry
        )


async def test_grpc_calls_carry_the_job_in_metadata(
    grpc_server: TestGrpcServer, channels: GrpcChannels
) -> None:
    grpc_server.metadata.clear()
    transport = Transport("grpc", grpc_server.target, HandlerRegistry(), CallLog(), channels)
    await transport.run(transport.envelope(review=None), {"text": TEXT}, job_id="job-m", attempt=4)
    first = grpc_server.metadata[0]
    assert first["x-job-id"] == "job-m"
    assert first["x-step-name"] == "tokenize"
    assert first["x-attempt"] == "4"
    assert first["x-idempotency-key"] == "job-m:tokenize"


async def test_grpc_calls_time_out_with_what_is_left_of_the_segment(
    grpc_server: TestGrpcServer, channels: GrpcChannels
) -> None:
    grpc_server.time_left.clear()
    transport = Transport("grpc", grpc_server.target, HandlerRegistry(), CallLog(), channels)
    definition = transport.envelope(review=None, deadline_ms=5000)
    await transport.run(definition, {"text": TEXT, "delay_ms": 300})
    tokenize, embed = grpc_server.time_left
    assert tokenize is not None and embed is not None
    # Bounded by the segment's 5 s (gRPC rounds a timeout up to its wire units,
    # hence the hair over), never by a default of its own. A slow machine only
    # ever makes the time left smaller.
    assert 0 < tokenize < 5.05
    # The embedder starts after the tokenizer's 300 ms, so at most 4.7 s are left.
    assert 0 < embed < 4.75


async def test_a_target_nobody_listens_on_is_unavailable(channels: GrpcChannels) -> None:
    transport = Transport("grpc", unused_target(), HandlerRegistry(), CallLog(), channels)
    with pytest.raises(StepFailure) as caught:
        await transport.run(transport.envelope(review=None, deadline_ms=5000), {"text": TEXT})
    assert caught.value.kind is FailureKind.RETRYABLE
    assert caught.value.message.startswith("gRPC UNAVAILABLE")


async def test_a_registered_handler_wins_over_the_target(grpc_server: TestGrpcServer) -> None:
    grpc_server.calls = CallLog()
    calls = CallLog()
    result = await run_workflow(
        envelope(target=grpc_server.target, review="invoke"),
        {"text": TEXT},
        registry=make_registry(calls),
    )
    assert result["reviewer"] == "auto"
    assert calls[TOKENIZE] == 1
    assert sum(grpc_server.calls.counts.values()) == 0


async def test_the_next_version_of_a_workflow_reads_a_remote_answer_with_its_own_types(
    grpc_server: TestGrpcServer, channels: GrpcChannels
) -> None:
    # Version 2 renames Tokens.count (field 2) to total. The same method on
    # the same target must answer each version in that version's own type.
    remote = Transport("grpc", grpc_server.target, HandlerRegistry(), CallLog(), channels)
    grpc_server.calls = remote.calls
    first, _ = await remote.run(remote.envelope(review=None), {"text": TEXT})
    assert isinstance(first, Completed)

    second = remote.envelope(review=None, output=["total = tokenize.total"])
    files = descriptor_pb2.FileDescriptorSet.FromString(
        base64.b64decode(second["schema"]["descriptorSetBase64"])
    )
    test_file = next(file for file in files.file if file.name == "jobs_test.proto")
    tokens = next(message for message in test_file.message_type if message.name == "Tokens")
    next(field for field in tokens.field if field.name == "count").name = "total"
    second["schema"]["descriptorSetBase64"] = base64.b64encode(files.SerializeToString()).decode()
    outcome, entries = await remote.run(second, {"text": TEXT})
    assert isinstance(outcome, Completed)
    assert outcome.result == {"total": len(TEXT.split())}
    assert entries[0]["response"]["total"] == len(TEXT.split())


async def _tokenize_answered_by(
    answer: Callable[[bytes, Any], Awaitable[bytes]], channels: GrpcChannels
) -> tuple[str, pytest.ExceptionInfo[StepFailure]]:
    """The step failure of a one-step workflow whose Tokenize server answers ``answer``'s bytes."""
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "jobs.test.Tokenizer", {"Tokenize": grpc.unary_unary_rpc_method_handler(answer)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    target = f"127.0.0.1:{port}"
    remote = Transport("grpc", target, HandlerRegistry(), CallLog(), channels)
    try:
        with pytest.raises(StepFailure) as caught:
            await remote.run(remote.envelope(review=None), {"text": TEXT})
    finally:
        await server.stop(None)
    return target, caught


async def test_a_remote_answer_that_is_not_the_response_type_fails_the_step_non_retryably(
    channels: GrpcChannels,
) -> None:
    async def garbled(request: bytes, context: Any) -> bytes:
        return b"\xff\xff\xff"  # a truncated varint: no message parses from it

    target, caught = await _tokenize_answered_by(garbled, channels)
    assert caught.value.kind is FailureKind.NON_RETRYABLE
    assert caught.value.step_name == "tokenize"
    assert caught.value.message == (
        f"{target} answered bytes that do not parse as jobs.test.Tokens"
    )


async def test_a_remote_answer_over_grpcs_size_limit_fails_at_once_not_as_out_of_capacity(
    channels: GrpcChannels,
) -> None:
    async def huge(request: bytes, context: Any) -> bytes:
        return message_class("jobs.test.Tokens")(ids=[2**30] * 1_000_000).SerializeToString()

    target, caught = await _tokenize_answered_by(huge, channels)
    # Sent again, the same answer is refused again: no attempt is worth spending.
    assert caught.value.kind is FailureKind.NON_RETRYABLE
    assert caught.value.message == (
        f"gRPC RESOURCE_EXHAUSTED from {target}: the answer is larger than gRPC accepts here"
    )


async def test_a_slow_step_reports_its_progress_over_either_transport(transport: Transport) -> None:
    reports: list[tuple[str, float, str]] = []
    outcome, _ = await transport.run(
        transport.envelope(review=None),
        {"text": TEXT, "delay_ms": 200},
        progress=lambda step, fraction, message: reports.append((step, fraction, message)),
    )
    assert isinstance(outcome, Completed)
    if transport.name == "python":
        # The handler calls ctx.progress after each quarter.
        assert reports == [("tokenize", q / 4, f"{q} of 4") for q in range(1, 5)]
    else:
        # A remote step has its initial metadata to say it in, once.
        assert reports == [("tokenize", 0.5, "halfway")]


async def test_a_remote_step_call_carries_its_span_in_the_traceparent_header(
    grpc_server: TestGrpcServer, channels: GrpcChannels
) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from streams.tracing import Tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    grpc_server.metadata.clear()
    remote = Transport("grpc", grpc_server.target, HandlerRegistry(), CallLog(), channels)
    grpc_server.calls = remote.calls
    outcome, _ = await remote.run(
        remote.envelope(review=None),
        {"text": TEXT},
        observe_step=Tracing(provider, worker_id="w").step,
    )
    assert isinstance(outcome, Completed)
    spans = {span.name: span for span in exporter.get_finished_spans()}
    for meta, name in zip(grpc_server.metadata, ("step tokenize", "step embed"), strict=True):
        context = spans[name].get_span_context()
        _, trace_id, span_id, _ = meta["traceparent"].split("-")
        assert (int(trace_id, 16), int(span_id, 16)) == (context.trace_id, context.span_id)


async def test_a_call_cut_off_by_its_channel_closing_is_retryable(
    grpc_server: TestGrpcServer,
) -> None:
    # One channel at most: opening a second retires the first, whose calls get
    # their grace and are then cancelled locally, which grpc.aio raises as a
    # CancelledError though nobody cancelled the segment.
    channels = GrpcChannels(max_channels=1, close_grace_s=0.05)
    transport = Transport("grpc", grpc_server.target, HandlerRegistry(), CallLog(), channels)
    port = grpc_server.target.rsplit(":", 1)[1]

    async def open_another_channel() -> None:
        await asyncio.sleep(0.2)
        channels.unary(f"localhost:{port}", "/jobs.test.Tokenizer/Tokenize")

    try:
        opener = asyncio.create_task(open_another_channel())
        with pytest.raises(StepFailure) as caught:
            await transport.run(transport.envelope(review=None), {"text": TEXT, "delay_ms": 2000})
        await opener
    finally:
        await channels.close()
    assert caught.value.kind is FailureKind.RETRYABLE
    assert caught.value.step_name == "tokenize"
    assert caught.value.message == (
        f"gRPC CANCELLED from {grpc_server.target}: the call was cut off when its channel closed"
    )
