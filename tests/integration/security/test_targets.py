"""Step targets outside WFJOBS_STEP_TARGETS are refused before anything is dialled.

A plain TCP listener on 127.0.0.1 stands for whatever a definition's author
would like the worker to reach; it records every connection it accepts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from streams.runtime import Runtime
from streams.settings import Settings, SettingsError
from tests.certificates import make_client_certificate, make_server_certificates
from tests.integration.streams.conftest import serve
from tests.workflows_fixtures import CallLog, TestGrpcServer, envelope
from workflows import (
    Completed,
    FailureKind,
    GrpcChannels,
    HandlerRegistry,
    StepFailure,
    run_segment,
)
from workflows.compiler import compile_definition
from workflows.invokers import TargetRefused
from workflows.steps import CompiledWorkflow
from workflows.targets import ALLOW_ALL, TargetPolicy

pytestmark = pytest.mark.asyncio

# What the listener answers: text that must never reach a job's error.
PEER_TEXT = b"HTTP/1.1 400 Bad Request\r\nServer: secret-admin-console\r\n\r\n"


@pytest.fixture
async def dsn(make_database: Callable[[], str]) -> str:
    url = make_database(migrated=True)
    return url


class Listener:
    def __init__(self) -> None:
        self.connections = 0
        self.accepted = asyncio.Event()
        self.target = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.accepted.set()
        writer.write(PEER_TEXT)
        await writer.drain()
        writer.close()


@pytest.fixture
async def listener() -> AsyncIterator[Listener]:
    found = Listener()
    server = await asyncio.start_server(found.handle, "127.0.0.1", 0)
    found.target = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with server:
        yield found


async def _refusal(response: Any, step: str, target: str) -> None:
    body = await response.json()
    assert response.status == 400, body
    assert body["code"] == "INVALID_ARGUMENT", body
    assert f"steps[0] {step!r}.target" in body["message"], body
    assert f"{target!r} is not an allowed step target" in body["message"], body
    assert "10.9.9.9:443" in body["message"], body  # what is allowed is said


async def test_a_target_off_the_list_is_refused_at_store_and_at_submit(
    dsn: str, listener: Listener
) -> None:
    env = {
        "DATABASE_URL": dsn,
        "WFJOBS_ROLES": "api,worker",
        "WFJOBS_POLL_INTERVAL_S": "0.05",
        "WFJOBS_STEP_TARGETS": "10.9.9.9:443,*.svc.cluster.local:*",
    }
    # No handler serves the methods, so a job that got this far would dial.
    workflow = envelope(name="scan", target=listener.target, review=None)
    async with serve(env) as (client, runtime):
        runtime.registry = HandlerRegistry()
        stored = await client.put("/v1/workflows/scan", json={"workflow": workflow})
        await _refusal(stored, "tokenize", listener.target)
        inline = await client.post(
            "/v1/workflow-runs", json={"workflow": workflow, "input": {"text": "x"}}
        )
        await _refusal(inline, "tokenize", listener.target)
        listed = await client.get("/v1/workflow-runs")
        assert (await listed.json()).get("jobs", []) == []
    assert listener.connections == 0


async def test_the_default_allows_in_process_handlers_only(dsn: str, listener: Listener) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        assert runtime.target_policy.patterns == ()
        local = envelope(name="local-only", target="local")
        assert (
            await client.put("/v1/workflows/local-only", json={"workflow": local})
        ).status == 201
        remote = envelope(name="remote", target=listener.target)
        response = await client.put("/v1/workflows/remote", json={"workflow": remote})
        body = await response.json()
        assert response.status == 400, body
        assert "none: steps run in-process handlers only" in body["message"]
    assert listener.connections == 0


async def test_a_stored_snapshot_off_the_list_fails_at_call_time_without_dialling(
    listener: Listener,
) -> None:
    # A snapshot stored before the list changed reaches the channel cache,
    # which refuses it too.
    workflow = compile_definition(envelope(target=listener.target, review=None))
    channels = GrpcChannels(policy=TargetPolicy.parse(["10.9.9.9:443"]))
    with pytest.raises(StepFailure) as caught:
        await _segment(workflow, channels)
    assert caught.value.kind is FailureKind.NON_RETRYABLE
    assert "is not an allowed step target" in caught.value.message
    assert len(channels) == 0
    assert listener.connections == 0
    await channels.close()


# gRPC reads these hosts as resolver schemes: unix:443 is a socket file named
# "443", unix-abstract:443 an abstract socket; none is a host a pattern can judge.
SCHEME_TARGETS = [
    "unix:443",
    "unix-abstract:443",
    "vsock:443",
    "dns:443",
    "ipv4:443",
    "ipv6:443",
    "xds:443",
    "UNIX:443",
]


@pytest.mark.parametrize("target", SCHEME_TARGETS)
async def test_a_resolver_scheme_is_not_a_host_even_under_a_star_pattern(
    dsn: str, target: str
) -> None:
    env = {"DATABASE_URL": dsn, "WFJOBS_STEP_TARGETS": "*:*"}
    workflow = envelope(name="sockets", target=target, review=None)
    async with serve(env) as (client, runtime):
        runtime.registry = HandlerRegistry()
        stored = await client.put("/v1/workflows/sockets", json={"workflow": workflow})
        inline = await client.post(
            "/v1/workflow-runs", json={"workflow": workflow, "input": {"text": "x"}}
        )
        for response in (stored, inline):
            body = await response.json()
            assert response.status == 400, body
            assert body["code"] == "INVALID_ARGUMENT", body
            assert f"steps[0] 'tokenize'.target: {target!r}" in body["message"], body
            assert "resolver scheme" in body["message"], body


async def test_a_local_socket_is_not_dialled_at_call_time(tmp_path: Any) -> None:
    # A snapshot compiled before such targets were refused still reaches the
    # channel cache, which refuses it whatever its patterns allow.
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([_Recorder()])
    abstract = f"unix-abstract:{10000 + secrets.randbelow(55000)}"
    server.add_insecure_port(abstract)
    await server.start()
    compiled = compile_definition(envelope(target="127.0.0.1:1", review=None))
    steps = tuple(dataclasses.replace(step, target=abstract) for step in compiled.steps)
    workflow = dataclasses.replace(compiled, steps=steps)
    channels = GrpcChannels(policy=TargetPolicy.parse(["*:*"]))
    try:
        with pytest.raises(StepFailure) as caught:
            await _segment(workflow, channels)
        assert caught.value.kind is FailureKind.NON_RETRYABLE
        assert "resolver scheme" in caught.value.message
        assert len(channels) == 0 and _Recorder.calls == 0
        with pytest.raises(TargetRefused):
            GrpcChannels(policy=ALLOW_ALL).unary(abstract, "/a.B/C")
    finally:
        await channels.close()
        await server.stop(0)
    assert _Recorder.calls == 0


class _Recorder(grpc.GenericRpcHandler):
    calls = 0

    def service(self, handler_call_details: Any) -> None:
        type(self).calls += 1
        return None


async def test_a_transport_error_keeps_the_status_and_not_the_peers_text(
    listener: Listener,
) -> None:
    workflow = compile_definition(envelope(target=listener.target, review=None))
    channels = GrpcChannels(policy=ALLOW_ALL)
    with pytest.raises(StepFailure) as caught:
        await _segment(workflow, channels)
    await channels.close()
    assert listener.connections >= 1  # it was dialled: allowed this time
    message = caught.value.message
    prefix = f"gRPC UNAVAILABLE from {listener.target}: "
    assert message.startswith(prefix), message
    # Only the text after the target is judged: the port itself may contain "400".
    detail = message.removeprefix(prefix)
    for leak in ("secret-admin-console", "400", "http", "Socket", "connect"):
        assert leak not in detail, message


async def _ignore(entry: dict[str, Any]) -> None:
    return None


async def _segment(workflow: CompiledWorkflow, channels: GrpcChannels, text: str = "x") -> Any:
    """A first segment of ``workflow`` whose remote steps go through ``channels``."""
    return await run_segment(
        workflow,
        {"text": text},
        [],
        job_id="j",
        attempt=1,
        on_checkpoint=_ignore,
        registry=HandlerRegistry(),
        channels=channels,
    )


async def _run(runtime: Runtime, target: str) -> Any:
    """A segment of the test workflow against ``target``, over the runtime's channels."""
    workflow = compile_definition(envelope(target=target, review=None))
    return await _segment(workflow, runtime.channels, "a b")


def _runtime(**env: str) -> Runtime:
    settings = Settings.from_env(
        {"WFJOBS_ROLES": "api", "WFJOBS_STEP_TARGETS": "127.0.0.1:*", **env}
    )
    return Runtime(settings, registry=HandlerRegistry())


async def test_step_targets_are_called_over_the_tls_their_pattern_gives(tmp_path: Path) -> None:
    # The server's certificate names "steps.internal", not the address dialled,
    # and it admits only clients with a certificate from the same CA.
    certs = make_server_certificates(tmp_path / "ca", host="steps.internal")
    client = make_client_certificate(certs, tmp_path / "client", common_name="worker")
    secure = TestGrpcServer()
    await secure.start(
        grpc.ssl_server_credentials(
            [(certs.key_file.read_bytes(), certs.certificate_file.read_bytes())],
            root_certificates=certs.ca_file.read_bytes(),
            require_client_auth=True,
        )
    )
    plain = TestGrpcServer()
    await plain.start()
    port = secure.target.rsplit(":", 1)[1]
    mutual = f"ca={certs.ca_file};cert={client.certificate_file};key={client.key_file}"
    try:
        # The first pattern that matches decides; the plaintext server's target matches none.
        runtime = _runtime(
            WFJOBS_STEP_TARGET_TLS=(
                f"127.0.0.1:{port};{mutual};authority=steps.internal,"
                f"127.0.0.1:{port};ca={certs.ca_file}"
            )
        )
        secure.calls, plain.calls = CallLog(), CallLog()
        assert isinstance(await _run(runtime, secure.target), Completed)
        assert isinstance(await _run(runtime, plain.target), Completed)
        assert len(secure.calls.keys) == 2 and len(plain.calls.keys) == 2
        await runtime.channels.close()

        # Without the client certificate, or without the name to expect, the
        # server is not reached: the TLS of each came from the setting.
        for tls in (
            f"127.0.0.1:{port};ca={certs.ca_file};authority=steps.internal",
            f"127.0.0.1:{port};{mutual}",
            "",
        ):
            runtime = _runtime(WFJOBS_STEP_TARGET_TLS=tls)
            with pytest.raises(StepFailure, match="gRPC UNAVAILABLE"):
                await _run(runtime, secure.target)
            await runtime.channels.close()
    finally:
        await secure.stop()
        await plain.stop()


async def test_tls_files_no_channel_could_use_stop_the_process_at_start(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.pem"
    bogus.write_text("not a certificate")
    with pytest.raises(SettingsError, match=r"WFJOBS_STEP_TARGET_TLS: .*ca= holds no PEM"):
        _runtime(WFJOBS_STEP_TARGET_TLS=f"127.0.0.1:*;ca={bogus}")


async def test_at_most_the_settings_channels_stay_open(tmp_path: Path) -> None:
    servers = [TestGrpcServer() for _ in range(3)]
    for server in servers:
        await server.start()
    runtime = _runtime(WFJOBS_STEP_CHANNELS_MAX="2")
    try:
        for server in servers:
            assert isinstance(await _run(runtime, server.target), Completed)
        # The least recently used, the first server's, was closed for the third.
        assert list(runtime.channels._channels) == [servers[1].target, servers[2].target]
        assert isinstance(await _run(runtime, servers[0].target), Completed)
        assert list(runtime.channels._channels) == [servers[2].target, servers[0].target]
    finally:
        await runtime.channels.close()
        for server in servers:
            await server.stop()
