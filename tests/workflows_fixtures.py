"""The test proto, its descriptor set, handlers, a gRPC server and envelopes.

Shared by the engine's tests and the service's end-to-end tests, so both run
the same workflow: tokenize -> embed -> review (external by default).

* :func:`descriptor_set` compiles ``tests/protos/jobs_test.proto`` with
  ``grpc_tools.protoc --include_imports`` (once per process).
* :func:`envelope` builds the definition; ``target`` is ``"local"`` for the
  in-process handlers or the ``host:port`` of :class:`TestGrpcServer`.
* :func:`with_a_step` adds a step whose method takes and answers given types.
* :func:`make_registry` returns a registry with the three handlers, counting
  calls in a :class:`CallLog`.

Faults: ``Text.fail`` (tokenizer) and ``Text.embed_fail`` (embedder) take a
gRPC status name (raised as a real ``AioRpcError`` by the handlers, answered
by the server), or ``RETRYABLE`` / ``NON_RETRYABLE`` / ``CRASH`` (handlers
only). ``"NAME@N"`` fails attempts 1..N only. A review of a text containing
"reject" is not approved, which breaks the review step's ``validate`` rule.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import socket
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import grpc_tools
from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, message_factory, wrappers_pb2
from google.protobuf.message import Message
from grpc_tools import protoc

from schemas.gen.buf.validate import validate_pb2
from workflows import HandlerRegistry, NonRetryableError, RetryableError, StepContext

PROTO_DIR = Path(__file__).resolve().parent / "protos"
PROTO_FILE = "jobs_test.proto"

TOKENIZE = "jobs.test.Tokenizer/Tokenize"
EMBED = "jobs.test.Embedder/Embed"
REVIEW = "jobs.test.ReviewDesk/Review"
DIMENSIONS = 4


@functools.cache
def descriptor_set() -> bytes:
    """The test proto as a serialized FileDescriptorSet, imports included."""
    well_known = Path(grpc_tools.__file__).resolve().parent / "_proto"
    validate_set = descriptor_pb2.FileDescriptorSet()
    validate_pb2.DESCRIPTOR.CopyToProto(validate_set.file.add())
    with tempfile.TemporaryDirectory() as tmp:
        given = Path(tmp) / "validate.binpb"
        given.write_bytes(validate_set.SerializeToString())
        out = Path(tmp) / "jobs_test.binpb"
        status = protoc.main(
            [
                "protoc",
                f"--descriptor_set_in={given}",
                f"-I{PROTO_DIR}",
                f"-I{well_known}",
                "--include_imports",
                f"--descriptor_set_out={out}",
                PROTO_FILE,
            ]
        )
        if status != 0:
            raise RuntimeError(f"protoc failed on {PROTO_DIR / PROTO_FILE}")
        return out.read_bytes()


@functools.cache
def descriptor_set_base64() -> str:
    return base64.b64encode(descriptor_set()).decode("ascii")


@functools.cache
def _pool() -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_pb2.FileDescriptorSet.FromString(descriptor_set()).file:
        pool.Add(file)
    return pool


def message_class(full_name: str) -> type[Message]:
    """A class for a test message, from a pool of its own (not the engine's)."""
    cls: type[Message] = message_factory.GetMessageClass(_pool().FindMessageTypeByName(full_name))
    return cls


def tokenize_ids(text: str) -> list[int]:
    return [sum(map(ord, word)) % 50_000 for word in text.split()]


def embed_vector(ids: Sequence[int]) -> list[float]:
    # Eighths are exact in float32, so JSON round trips compare equal.
    total = sum(ids)
    return [((total + k) % 8) / 8 for k in range(DIMENSIONS)]


def review_verdict(text: str) -> bool:
    return "reject" not in text


def envelope(
    *,
    target: str | None = "local",
    review: str | None = "external",
    name: str = "embed-text",
    deadline_ms: int | None = None,
    output: list[str] | None = None,
) -> dict[str, Any]:
    """The test workflow: tokenize -> embed [-> review].

    ``review``: ``"external"`` parks on it, ``"invoke"`` calls it like the
    others, None leaves it out. ``output`` None picks a mapping over every step.
    """
    steps: list[dict[str, Any]] = [
        {
            "name": "tokenize",
            "method": TOKENIZE,
            "rules": ["text = input.text", "fail = input.fail", "delay_ms = input.delay_ms"],
        },
        {
            "name": "embed",
            "method": EMBED,
            "rules": ["ids = tokenize.ids", "fail = input.embed_fail"],
        },
    ]
    if review is not None:
        step: dict[str, Any] = {
            "name": "review",
            "method": REVIEW,
            "rules": ["text = input.text", "dimensions = embed.dimensions"],
            "validate": ["response.approved"],
        }
        if review == "external":
            step["completion"] = "external"
        steps.append(step)
    if target is not None:
        for step in steps:
            if step.get("completion") != "external":
                step["target"] = target
    if output is None:
        output = ["ids = tokenize.ids", "vector = embed.vector"]
        if review is not None:
            output += ["approved = review.approved", "reviewer = review.reviewer"]
    definition: dict[str, Any] = {
        "name": name,
        "schema": {"descriptorSetBase64": descriptor_set_base64()},
        "inputType": "jobs.test.Text",
        "steps": steps,
    }
    if output:
        definition["output"] = output
    if deadline_ms is not None:
        definition["deadlineMs"] = deadline_ms
    return definition


# Checking ``large_envelope`` at a submit takes about half a second alone and
# several on a machine busy with the rest of the suite: past the default limit.
LARGE_DEFINITION_ENV = {"WFJOBS_COMPILE_TIMEOUT_S": "30"}


def large_envelope() -> dict[str, Any]:
    """The test workflow behind 61 more steps near the rule-length cap: compiling
    it takes about half a second, which the event loop must not wait for."""
    workflow = envelope(name="large-review")
    workflow["steps"][:0] = [
        {
            "name": f"copy{index}",
            "method": TOKENIZE,
            "rules": [
                "text = " + " + ".join(["input.text"] * 70),
                "fail = " + " + ".join(["input.fail"] * 75),
                "delay_ms = " + " + ".join(["input.delay_ms"] * 55),
                "embed_fail = " + " + ".join(["input.embed_fail"] * 50),
                "meta.lang = " + " + ".join(["input.text"] * 70),
            ],
        }
        for index in range(61)
    ]
    return workflow


@dataclass
class CallLog:
    """Calls per method, and the idempotency keys they carried."""

    counts: Counter[str] = field(default_factory=Counter)
    keys: list[str] = field(default_factory=list)
    attempts: list[int] = field(default_factory=list)

    def record(self, method: str, key: str, attempt: int) -> None:
        self.counts[method] += 1
        self.keys.append(key)
        self.attempts.append(attempt)

    def __getitem__(self, method: str) -> int:
        return self.counts[method]


def active_fault(spec: str, attempt: int) -> str | None:
    """The fault ``spec`` asks for on ``attempt`` ("NAME" always, "NAME@N" up to N)."""
    if not spec:
        return None
    name, _, limit = spec.partition("@")
    if limit and attempt > int(limit):
        return None
    return name


def _raise_handler_fault(name: str) -> None:
    if name == "RETRYABLE":
        raise RetryableError("test fault RETRYABLE")
    if name == "NON_RETRYABLE":
        raise NonRetryableError("test fault NON_RETRYABLE")
    if name == "CRASH":
        raise RuntimeError("test fault CRASH")
    code = getattr(grpc.StatusCode, name)
    raise grpc.aio.AioRpcError(
        code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=f"test fault {name}"
    )


def make_registry(calls: CallLog | None = None) -> HandlerRegistry:
    """A registry with the three test handlers; ``calls`` counts what they serve."""
    log = calls if calls is not None else CallLog()
    registry = HandlerRegistry()

    async def enter(method: str, request: Any, ctx: StepContext) -> None:
        # What every counted handler does first: count, linger, inject its fault.
        log.record(method, ctx.idempotency_key, ctx.attempt)
        if request.delay_ms:
            # Lingers in quarters, telling watchers how far it has got.
            for quarter in range(1, 5):
                await asyncio.sleep(request.delay_ms / 4000)
                ctx.progress(quarter / 4, f"{quarter} of 4")
        fault = active_fault(request.fail, ctx.attempt)
        if fault:
            _raise_handler_fault(fault)

    @registry.handler(TOKENIZE)
    async def tokenize(request: Any, ctx: StepContext) -> Message:
        await enter(TOKENIZE, request, ctx)
        ids = tokenize_ids(request.text)
        return ctx.response_type(ids=ids, count=len(ids))

    @registry.handler(EMBED)
    async def embed(request: Any, ctx: StepContext) -> Message:
        await enter(EMBED, request, ctx)
        vector = embed_vector(list(request.ids))
        return ctx.response_type(vector=vector, dimensions=len(vector))

    @registry.handler(REVIEW)
    async def review(request: Any, ctx: StepContext) -> dict[str, Any]:
        log.record(REVIEW, ctx.idempotency_key, ctx.attempt)
        return {"approved": review_verdict(request.text), "reviewer": "auto"}

    return registry


class TestGrpcServer:
    """The three test services on a real ``grpc.aio`` server at 127.0.0.1:<free port>."""

    __test__ = False  # not a test class, whatever pytest thinks of the name

    def __init__(self) -> None:
        self.calls = CallLog()
        self.metadata: list[dict[str, str]] = []
        # Per call, the seconds left before the caller's deadline (None: no deadline).
        self.time_left: list[float | None] = []
        self.target = ""
        self._server: grpc.aio.Server | None = None

    async def start(self, credentials: grpc.ServerCredentials | None = None) -> str:
        """Serve over plaintext, or over TLS with ``credentials``."""
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(self._handlers())
        if credentials is None:
            port = server.add_insecure_port("127.0.0.1:0")
        else:
            port = server.add_secure_port("127.0.0.1:0", credentials)
        await server.start()
        self._server = server
        self.target = f"127.0.0.1:{port}"
        return self.target

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None

    async def __aenter__(self) -> TestGrpcServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _handlers(self) -> tuple[grpc.GenericRpcHandler, ...]:
        text_cls = message_class("jobs.test.Text")
        tokens_cls = message_class("jobs.test.Tokens")
        embed_request_cls = message_class("jobs.test.EmbedRequest")
        embedding_cls = message_class("jobs.test.Embedding")
        review_request_cls = message_class("jobs.test.ReviewRequest")
        review_cls = message_class("jobs.test.ReviewResult")

        async def serve(
            method: str, fail: str, delay_ms: int, context: grpc.aio.ServicerContext[Any, Any]
        ) -> None:
            meta = {key: str(value) for key, value in context.invocation_metadata() or ()}
            self.metadata.append(meta)
            self.time_left.append(context.time_remaining())
            attempt = int(meta.get("x-attempt", "1"))
            self.calls.record(method, meta.get("x-idempotency-key", ""), attempt)
            if delay_ms:
                # A slow remote step says how far it has got in its headers.
                await context.send_initial_metadata(
                    (("wfjobs-progress", "0.5"), ("wfjobs-progress-message", "halfway"))
                )
                await asyncio.sleep(delay_ms / 1000)
            fault = active_fault(fail, attempt)
            if fault:
                await context.abort(getattr(grpc.StatusCode, fault), f"test fault {fault}")

        async def tokenize(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Message:
            await serve(TOKENIZE, request.fail, request.delay_ms, context)
            ids = tokenize_ids(request.text)
            return tokens_cls(ids=ids, count=len(ids))

        async def embed(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Message:
            await serve(EMBED, request.fail, request.delay_ms, context)
            vector = embed_vector(list(request.ids))
            return embedding_cls(vector=vector, dimensions=len(vector))

        async def review(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Message:
            await serve(REVIEW, "", 0, context)
            return review_cls(approved=review_verdict(request.text), reviewer="grpc")

        def unary(function: Any, request_cls: type[Message], response_cls: type[Message]) -> Any:
            return grpc.unary_unary_rpc_method_handler(
                function,
                request_deserializer=request_cls.FromString,
                response_serializer=response_cls.SerializeToString,
            )

        return (
            grpc.method_handlers_generic_handler(
                "jobs.test.Tokenizer", {"Tokenize": unary(tokenize, text_cls, tokens_cls)}
            ),
            grpc.method_handlers_generic_handler(
                "jobs.test.Embedder", {"Embed": unary(embed, embed_request_cls, embedding_cls)}
            ),
            grpc.method_handlers_generic_handler(
                "jobs.test.ReviewDesk", {"Review": unary(review, review_request_cls, review_cls)}
            ),
        )


def unused_target() -> str:
    """A 127.0.0.1 address nothing listens on (connecting fails: UNAVAILABLE)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"127.0.0.1:{port}"


def with_a_step(
    *, takes: str = "jobs.test.Text", answers: str = "jobs.test.Text", external: bool = False
) -> dict[str, Any]:
    """The test workflow, without review, with one step more: ``answer``.

    Its method, ``answers.Answers/Answer``, takes ``takes`` and answers ``answers``.
    """
    files = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set())
    present = {file.name for file in files.file}
    for module in (any_pb2, wrappers_pb2):
        if module.DESCRIPTOR.name not in present:
            module.DESCRIPTOR.CopyToProto(files.file.add())
    extra = files.file.add(
        name="answers.proto",
        package="answers",
        syntax="proto3",
        dependency=["jobs_test.proto"]
        + [f.name for f in files.file if f.name.startswith("google/protobuf/")],
    )
    service = extra.service.add(name="Answers")
    service.method.add(name="Answer", input_type=f".{takes}", output_type=f".{answers}")
    definition = envelope(review=None, output=[])
    definition["schema"]["descriptorSetBase64"] = base64.b64encode(
        files.SerializeToString()
    ).decode()
    step: dict[str, Any] = {"name": "answer", "method": "answers.Answers/Answer"}
    if external:
        step["completion"] = "external"
    definition["steps"].append(step)
    return definition


__all__ = [
    "DIMENSIONS",
    "EMBED",
    "REVIEW",
    "TOKENIZE",
    "CallLog",
    "TestGrpcServer",
    "active_fault",
    "descriptor_set",
    "descriptor_set_base64",
    "embed_vector",
    "envelope",
    "make_registry",
    "message_class",
    "review_verdict",
    "tokenize_ids",
    "unused_target",
    "with_a_step",
]
