"""HTTP hygiene on the server a deployment runs: media types, U+0000, depth, limits, errors."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import re
import uuid
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psycopg
import pytest

from store.tokens import create_token
from streams.http_errors import MAX_HEADER_BYTES, MAX_JSON_DEPTH, MAX_URL_BYTES, REQUEST_ID_HEADER
from streams.jobs import Jobs
from streams.openapi import OPENAPI_PATH, openapi_document
from streams.tracing import TRACEPARENT, TRACESTATE
from streams.web import (
    LIST_JOBS_PARAMETERS,
    LIST_OUTBOX_PARAMETERS,
    LIST_REQUESTS_DLQ_PARAMETERS,
    LIST_WORKFLOWS_PARAMETERS,
    WATCH_JOB_PARAMETERS,
)
from tests.integration.http.conftest import LiveApi, parked_job
from tests.integration.streams.conftest import WEB_WORKFLOW

pytestmark = pytest.mark.asyncio


async def _call(
    api: LiveApi,
    method: str,
    path: str,
    *,
    body: Any = None,
    data: bytes | None = None,
    content_type: str | None = "application/json",
    token: bool = True,
) -> tuple[int, Mapping[str, str], Any]:
    headers: dict[str, str] = dict(api.auth) if token else {}
    if body is not None:
        data = json.dumps(body).encode()
    if data is not None and content_type is not None:
        headers["Content-Type"] = content_type
    async with api.session.request(
        method, api.url + path, data=data, headers=headers, skip_auto_headers={"Content-Type"}
    ) as response:
        assert response.content_type == "application/json", await response.text()
        assert response.headers.get(REQUEST_ID_HEADER), dict(response.headers)
        return response.status, response.headers, await response.json()


async def _error(api: LiveApi, method: str, path: str, status: int, code: str, **kw: Any) -> str:
    got, _, body = await _call(api, method, path, **kw)
    assert (got, body.get("code")) == (status, code), body
    assert set(body) == {"code", "message"}, body
    message: str = body["message"]
    return message


async def test_faust_endpoints_are_off_and_unknown_routes_answer_json(live_api: LiveApi) -> None:
    for path in ("/router", "/router/", "/table", "/table/", "/table/x/", "/table/x/k/", "/graph"):
        await _error(live_api, "GET", path, 404, "NOT_FOUND")
    for path in ("/stats/", "/performance/", "/assignment/", "/v1/nothing-here"):
        await _error(live_api, "GET", path, 404, "NOT_FOUND")
    message = await _error(live_api, "DELETE", "/v1/workflows", 405, "METHOD_NOT_ALLOWED")
    assert "allowed: GET" in message
    await _error(live_api, "POST", "/healthz", 405, "METHOD_NOT_ALLOWED", body={})


async def test_a_405_names_the_methods_the_resource_takes_in_allow(live_api: LiveApi) -> None:
    for method, path, allowed in (
        ("DELETE", "/v1/workflows", "GET, HEAD"),
        ("POST", "/healthz", "GET, HEAD"),
        ("POST", "/dashboard/", "GET, HEAD"),
        ("PUT", "/dashboard/app.js", "GET, HEAD"),
    ):
        status, headers, body = await _call(live_api, method, path, body={})
        assert (status, body["code"]) == (405, "METHOD_NOT_ALLOWED"), (method, path, body)
        assert headers.get("Allow") == allowed, (method, path, dict(headers))
        assert body["message"].endswith(f"allowed: {allowed}"), body


async def test_head_is_served_exactly_where_get_is(live_api: LiveApi) -> None:
    _, _, document = await _call(live_api, "GET", OPENAPI_PATH, token=False)
    await _call(live_api, "PUT", "/v1/workflows/web-review", body={"workflow": WEB_WORKFLOW})
    job_id = await parked_job(live_api)
    mismatched = []
    for path, item in document["paths"].items():
        target = path.format(job_id=job_id, step_name="review", name="web-review")
        if path == "/v1/requests-dlq":
            continue  # it reads a broker, which this server has none of
        expected = 200 if "get" in item else 405
        async with live_api.session.head(live_api.url + target, headers=live_api.auth) as head:
            allowed = set(head.headers.get("Allow", "").replace(" ", "").split(","))
            if head.status != expected or (expected == 405 and "HEAD" in allowed):
                mismatched.append((path, head.status, sorted(allowed)))
        if "get" not in item:
            method = next(iter(item)).upper()
            message = await _error(live_api, "GET", target, 405, "METHOD_NOT_ALLOWED")
            assert message.endswith(f"allowed: {method}"), message
    assert mismatched == []


async def test_bodies_must_be_declared_json(live_api: LiveApi) -> None:
    body = {"workflow_name": "missing", "input": {}}
    for content_type in (
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/json; charset=latin-1",
        None,
    ):
        message = await _error(
            live_api,
            "POST",
            "/v1/workflow-runs",
            415,
            "UNSUPPORTED_MEDIA_TYPE",
            body=body,
            content_type=content_type,
        )
        assert "application/json" in message
    # A body-less POST is refused the same way, before anything else is read.
    await _error(
        live_api,
        "POST",
        "/v1/outbox:redrive",
        415,
        "UNSUPPORTED_MEDIA_TYPE",
        content_type=None,
    )
    for content_type in ("application/json", "application/json; charset=UTF-8"):
        await _error(
            live_api,
            "POST",
            "/v1/workflow-runs",
            404,
            "NOT_FOUND",
            body=body,
            content_type=content_type,
        )
    # Compressed bodies are refused whole, before anything inflates them: a few
    # hundred kilobytes of gzip can hold gigabytes.
    raw = json.dumps(body).encode()
    for encoding, data in (
        ("gzip", gzip.compress(raw)),
        ("deflate", zlib.compress(raw)),
        ("gzip", b"not gzip at all"),
        ("br", raw),
        ("x-unheard-of", raw),
    ):
        headers = {
            **live_api.auth,
            "Content-Type": "application/json",
            "Content-Encoding": encoding,
        }
        async with live_api.session.post(
            live_api.url + "/v1/workflow-runs", data=data, headers=headers
        ) as response:
            assert response.content_type == "application/json", await response.text()
            answer = await response.json()
            assert (response.status, answer["code"]) == (415, "UNSUPPORTED_MEDIA_TYPE"), answer
            assert f"Content-Encoding {encoding}" in answer["message"], answer
    headers = {**live_api.auth, "Content-Type": "application/json", "Content-Encoding": "identity"}
    async with live_api.session.post(
        live_api.url + "/v1/workflow-runs", data=json.dumps(body), headers=headers
    ) as response:
        assert response.status == 404, await response.text()
    # Who is calling is checked first: nothing is said about the body to a stranger.
    await _error(
        live_api,
        "POST",
        "/v1/workflow-runs",
        401,
        "UNAUTHENTICATED",
        body=body,
        content_type="text/plain",
        token=False,
    )


async def test_nul_in_any_input_is_refused_naming_the_field(live_api: LiveApi) -> None:
    job = str(uuid.uuid4())
    message = await _error(
        live_api,
        "POST",
        "/v1/workflow-runs",
        400,
        "INVALID_ARGUMENT",
        body={"workflow_name": "x", "input": {"a": {"b": ["ok", "no\u0000"]}}},
    )
    assert message == "input.a.b[1] contains U+0000 (NUL), which is not accepted"
    message = await _error(
        live_api,
        "POST",
        "/v1/workflow-runs",
        400,
        "INVALID_ARGUMENT",
        body={"workflow_name": "x", "input": {"k\u0000": 1}},
    )
    assert message.startswith("a field name in input contains U+0000")
    message = await _error(
        live_api, "GET", "/v1/workflow-runs?workflow_name=a%00b", 400, "INVALID_ARGUMENT"
    )
    assert message.startswith("query parameter workflow_name contains U+0000")
    message = await _error(live_api, "GET", "/v1/workflow-runs?a%00=1", 400, "INVALID_ARGUMENT")
    assert message.startswith("a query parameter name contains U+0000")
    message = await _error(
        live_api, "GET", f"/v1/workflow-runs/{job}?a=%00", 400, "INVALID_ARGUMENT"
    )
    assert message.startswith("query parameter a contains U+0000")
    message = await _error(
        live_api,
        "POST",
        f"/v1/workflow-runs/{job}/steps/re%00view:complete",
        400,
        "INVALID_ARGUMENT",
        body={"response": {}},
    )
    assert message.startswith("path parameter step_name contains U+0000")
    message = await _error(live_api, "GET", "/v1/workflow-runs/%00", 400, "INVALID_ARGUMENT")
    assert "job_id" in message
    message = await _error(live_api, "GET", "/v1/workflows/a%00b", 400, "INVALID_ARGUMENT")
    assert "workflow name" in message


async def test_nul_in_a_complete_step_response_is_a_400_not_a_500(live_api: LiveApi) -> None:
    status, _, stored = await _call(
        live_api, "PUT", "/v1/workflows/web-review", body={"workflow": WEB_WORKFLOW}
    )
    assert status == 201, stored
    job_id = await parked_job(live_api)
    path = f"/v1/workflow-runs/{job_id}/steps/review:complete"
    message = await _error(
        live_api,
        "POST",
        path,
        400,
        "INVALID_ARGUMENT",
        body={"response": {"approved": True, "note": "a\u0000b"}},
    )
    assert message.startswith("response.note contains U+0000")
    # The job still waits for a good answer.
    status, _, done = await _call(
        live_api, "POST", path, body={"response": {"approved": True, "note": "fine"}}
    )
    assert (status, done["outcome"]) == (200, "COMPLETED"), done


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for level in range(depth):
        value = {"a": value} if level % 2 else [value]
    return value


async def test_json_nesting_is_capped_before_parsing(live_api: LiveApi) -> None:
    # The body object itself is one level: input nested MAX_JSON_DEPTH - 1 deep fits.
    deepest = {"workflow_name": "missing", "input": {"x": _nested(MAX_JSON_DEPTH - 2)}}
    await _error(live_api, "POST", "/v1/workflow-runs", 404, "NOT_FOUND", body=deepest)
    too_deep = {"workflow_name": "missing", "input": {"x": _nested(MAX_JSON_DEPTH - 1)}}
    message = await _error(
        live_api, "POST", "/v1/workflow-runs", 400, "INVALID_ARGUMENT", body=too_deep
    )
    assert message == f"the JSON body is nested more than {MAX_JSON_DEPTH} levels deep (the limit)"
    # Thousands deep is refused by the scan alone, without a parser's recursion.
    bomb = b'{"input":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    await _error(live_api, "POST", "/v1/workflow-runs", 400, "INVALID_ARGUMENT", data=bomb)
    # Brackets inside strings are text, not nesting.
    brackets = {"workflow_name": "missing", "input": {"text": "[{" * 500 + '\\"]'}}
    await _error(live_api, "POST", "/v1/workflow-runs", 404, "NOT_FOUND", body=brackets)


async def test_a_bug_answers_500_with_a_request_id_and_logs_the_traceback(
    live_api: LiveApi, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(self: Jobs, **_: Any) -> Any:
        raise RuntimeError("secret internals at /srv/app/db.py line 12")

    monkeypatch.setattr(Jobs, "list_workflows", broken)
    with caplog.at_level(logging.ERROR, logger="streams.http_errors"):
        status, headers, body = await _call(live_api, "GET", "/v1/workflows")
    request_id = headers[REQUEST_ID_HEADER]
    assert status == 500
    assert body == {
        "code": "INTERNAL",
        "message": f"internal error; the service log has request id {request_id}",
    }
    [record] = [r for r in caplog.records if request_id in r.getMessage()]
    assert record.exc_info is not None
    assert "secret internals" in str(record.exc_info[1])


async def _raw(api: LiveApi, request: bytes) -> tuple[int, dict[str, str], dict[str, Any]]:
    """Send bytes on a fresh connection; the status, headers and JSON body of the answer."""
    reader, writer = await asyncio.open_connection(api.host, api.port)
    try:
        writer.write(request)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), timeout=10)
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, json.loads(body)


async def test_the_parser_refusals_answer_json(live_api: LiveApi) -> None:
    long_url = b"/v1/workflows?x=" + b"a" * MAX_URL_BYTES
    status, headers, body = await _raw(
        live_api, b"GET " + long_url + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    assert (status, body["code"]) == (414, "URI_TOO_LONG"), body
    assert headers["content-type"].startswith("application/json")
    assert headers[REQUEST_ID_HEADER.lower()]
    assert str(MAX_URL_BYTES) in body["message"]

    big_header = b"X-Big: " + b"b" * (MAX_HEADER_BYTES + 10) + b"\r\n"
    status, _, body = await _raw(
        live_api, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + big_header + b"\r\n"
    )
    assert (status, body["code"]) == (431, "HEADERS_TOO_LARGE"), body

    many = b"".join(b"X-H%d: v\r\n" % n for n in range(200))
    status, _, body = await _raw(live_api, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n")
    assert (status, body["code"]) == (431, "HEADERS_TOO_LARGE"), body

    status, _, body = await _raw(live_api, b"NOT HTTP AT ALL\r\n\r\n")
    assert (status, body["code"]) == (400, "INVALID_ARGUMENT"), body
    assert set(body) == {"code", "message"}


@pytest.mark.parametrize(
    "line",
    [
        b"Authorization: Bearer wfj_0123456789ab_" + b"S" * 43 + b"\x01",
        b"Authorization Bearer wfj_0123456789ab_" + b"S" * 43,
    ],
    ids=["control character", "no colon"],
)
async def test_a_malformed_header_is_refused_without_quoting_it(
    live_api: LiveApi, line: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    # The parser quotes the line it refused: a token in it would reach the log.
    with caplog.at_level(logging.INFO, logger="streams.http_errors"):
        status, _, body = await _raw(
            live_api, b"GET /v1/workflow-runs HTTP/1.1\r\nHost: x\r\n" + line + b"\r\n\r\n"
        )
    assert (status, body["code"]) == (400, "INVALID_ARGUMENT"), body
    assert "header" in body["message"], body
    assert "SSSS" not in body["message"]
    assert not [r for r in caplog.records if "SSSS" in r.getMessage()]


async def test_the_openapi_document_describes_every_route_served(live_api: LiveApi) -> None:
    status, _, document = await _call(live_api, "GET", OPENAPI_PATH, token=False)
    assert status == 200
    assert document["openapi"].startswith("3.")
    described = {
        (path, method.upper()) for path, item in document["paths"].items() for method in item
    }
    served = {
        (route.resource.canonical, route.method)
        for route in live_api.web_app.router.routes()
        if route.resource is not None
        and route.method not in ("HEAD", "OPTIONS", "*")
        # Faust's production index: {"status": "OK"}, nothing of ours.
        and route.resource.canonical != "/"
        # The dashboard's page and files: for browsers, not an API.
        and not route.resource.canonical.startswith("/dashboard")
    }
    assert described == served
    for path, item in document["paths"].items():
        for method, operation in item.items():
            for status_code in ("404", "405", "500"):
                assert status_code in operation["responses"], (path, method)
            if "requestBody" in operation:
                assert "415" in operation["responses"], (path, method)
                schema = operation["requestBody"]["content"]["application/json"]["schema"]
                assert schema, (path, method)


def _readme_api_rows() -> dict[tuple[str, str], set[str]]:
    """``(path, method) -> query parameters`` of every route the README's API table names."""
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    start = readme.index("## The HTTP API")
    table = readme[start : readme.index("\n## ", start + 1)]
    rows: dict[tuple[str, str], set[str]] = {}
    for line in table.splitlines():
        if not line.startswith("| ") or line.startswith("| verb"):
            continue
        named = re.findall(r"`(GET|POST|PUT|DELETE) (/[^`\s]*)`", line)
        # A row's other parameters are written `?name=` in its text.
        extra = set(re.findall(r"`\?(\w+)=`", line))
        for method, target in named:
            path, _, query = target.partition("?")
            parameters = {pair.split("=")[0] for pair in query.split("&") if pair} | extra
            rows[(path, method)] = parameters
    return rows


async def test_the_readme_api_table_and_the_openapi_document_agree_with_the_server(
    live_api: LiveApi,
) -> None:
    _, _, document = await _call(live_api, "GET", OPENAPI_PATH, token=False)
    described = {
        (path, method.upper()): {
            parameter["name"]
            for parameter in operation.get("parameters", [])
            if parameter["in"] == "query"
        }
        for path, item in document["paths"].items()
        for method, operation in item.items()
    }
    assert _readme_api_rows() == described
    # What each verb accepts is what is documented for it, and nothing more.
    accepted = {
        ("/v1/workflow-runs", "GET"): set(LIST_JOBS_PARAMETERS),
        ("/v1/workflows", "GET"): set(LIST_WORKFLOWS_PARAMETERS),
        ("/v1/outbox", "GET"): set(LIST_OUTBOX_PARAMETERS),
        ("/v1/requests-dlq", "GET"): set(LIST_REQUESTS_DLQ_PARAMETERS),
        ("/v1/workflow-runs/{job_id}/events", "GET"): set(WATCH_JOB_PARAMETERS),
    }
    assert {route: names for route, names in described.items() if names} == accepted


_JSON_TYPES: Mapping[str, type | tuple[type, ...]] = {
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "object": dict,
    "array": list,
    "null": type(None),
}


def _mismatches(
    document: Mapping[str, Any], schema: Mapping[str, Any], value: Any, at: str
) -> list[str]:
    """Where ``value`` strays from ``schema``: its types, enums and field names."""
    if "$ref" in schema:
        schema = document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    if "type" in schema:
        types = [schema["type"]] if isinstance(schema["type"], str) else schema["type"]
        if (isinstance(value, bool) and "boolean" not in types) or not any(
            isinstance(value, _JSON_TYPES[name]) for name in types
        ):
            return [f"{at}: {value!r} is not {' or '.join(types)}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{at}: {value!r} is none of {schema['enum']}"]
    found: list[str] = []
    if isinstance(value, dict):
        found += [
            f"{at}: required {key!r} is missing"
            for key in schema.get("required", ())
            if key not in value
        ]
        properties = schema.get("properties")
        values = schema.get("additionalProperties")
        for key, item in value.items():
            if properties is not None and key in properties:
                found += _mismatches(document, properties[key], item, f"{at}.{key}")
            elif isinstance(values, dict):
                found += _mismatches(document, values, item, f"{at}.{key}")
            elif properties is not None:
                found.append(f"{at}: {key!r} is not a documented field")
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            found += _mismatches(document, schema["items"], item, f"{at}[{index}]")
    return found


async def test_every_answer_has_the_shape_the_openapi_document_gives_it(
    live_api: LiveApi,
) -> None:
    _, _, document = await _call(live_api, "GET", OPENAPI_PATH, token=False)
    operations = {
        operation["operationId"]: operation
        for item in document["paths"].values()
        for operation in item.values()
    }
    await _call(live_api, "PUT", "/v1/workflows/web-review", body={"workflow": WEB_WORKFLOW})
    job_id = await parked_job(live_api)
    async with await psycopg.AsyncConnection.connect(
        live_api.runtime.settings.database_url, autocommit=True
    ) as conn:
        await conn.execute(
            "UPDATE workflow_run_events_outbox SET status = 'FAILED', attempts = 1, "
            "last_error = 'refused by the test'"
        )
    calls: list[tuple[str, str, Any, str]] = [
        ("GET", "/v1/workflow-runs?limit=1", None, "listJobs"),
        ("GET", f"/v1/workflow-runs/{job_id}", None, "getJob"),
        # Explained with FAILED rows, so its delivery has evidence to show.
        ("GET", f"/v1/workflow-runs/{job_id}:explain", None, "explainJob"),
        ("GET", f"/v1/workflow-runs/{job_id}/steps/review:form", None, "stepForm"),
        ("GET", "/v1/fleet", None, "fleetOverview"),
        ("GET", "/v1/workflows", None, "listWorkflows"),
        ("GET", "/v1/workflows/web-review", None, "getWorkflow"),
        ("GET", "/v1/outbox?limit=1", None, "listFailedEvents"),
        ("POST", "/v1/outbox:redrive", {"all": True}, "redriveEvents"),
        ("POST", f"/v1/workflow-runs/{job_id}:cancel", {}, "cancelJob"),
        ("POST", "/v1/workflow-runs:resume", {"statuses": ["CANCELLED"]}, "resumeJobs"),
        ("GET", "/healthz", None, "liveness"),
        ("GET", "/readyz", None, "readiness"),
    ]
    problems: list[str] = []
    for method, path, body, operation_id in calls:
        status, _, answer = await _call(live_api, method, path, body=body)
        documented = operations[operation_id]["responses"].get(str(status), {})
        assert "content" in documented, (operation_id, status, answer)
        schema = documented["content"]["application/json"]["schema"]
        problems += _mismatches(document, schema, answer, operation_id)
    assert problems == []


async def test_an_answer_that_lists_nothing_still_carries_its_lists(live_api: LiveApi) -> None:
    _, _, document = await _call(live_api, "GET", OPENAPI_PATH, token=False)
    operations = {
        operation["operationId"]: operation
        for item in document["paths"].values()
        for operation in item.values()
    }
    calls: list[tuple[str, str, Any, str, dict[str, Any]]] = [
        ("GET", "/v1/workflow-runs", None, "listJobs", {"jobs": [], "next_page_token": ""}),
        (
            "GET",
            "/v1/workflows",
            None,
            "listWorkflows",
            {"workflows": [], "next_page_token": ""},
        ),
        (
            "POST",
            "/v1/workflow-runs:cancel",
            {"status": "QUEUED"},
            "cancelJobs",
            {"cancelled": [], "cancel_requested": []},
        ),
        ("POST", "/v1/workflow-runs:resume", {}, "resumeJobs", {"resumed": [], "refused": []}),
        ("GET", "/v1/outbox", None, "listFailedEvents", {"events": [], "next_page_token": ""}),
    ]
    problems: list[str] = []
    for method, path, body, operation_id, expected in calls:
        status, _, answer = await _call(live_api, method, path, body=body)
        assert (status, answer) == (200, expected), operation_id
        schema = operations[operation_id]["responses"]["200"]["content"]["application/json"]
        problems += _mismatches(document, schema["schema"], answer, operation_id)
    assert problems == []


async def test_a_body_without_a_field_the_openapi_document_requires_is_refused(
    live_api: LiveApi,
) -> None:
    _, _, document = await _call(live_api, "GET", OPENAPI_PATH, token=False)
    checked = []
    for path, item in document["paths"].items():
        target = path.format(job_id=uuid.uuid4(), step_name="review", name="web-review")
        for method, operation in item.items():
            body = operation.get("requestBody", {}).get("content", {}).get("application/json")
            ref = (body or {}).get("schema", {}).get("$ref", "")
            schema = document["components"]["schemas"].get(ref.rsplit("/", 1)[-1], {})
            for name in schema.get("required", ()):
                message = await _error(
                    live_api, method.upper(), target, 400, "INVALID_ARGUMENT", body={}
                )
                assert name in message, (path, method, message)
                checked.append((path, method, name))
    assert sorted(checked) == [
        ("/v1/workflow-runs/{job_id}/steps/{step_name}:complete", "post", "response"),
        ("/v1/workflows/{name}", "put", "workflow"),
    ]


async def test_a_keyless_dead_letter_has_the_shape_the_openapi_document_gives_it() -> None:
    from streams.requests_dlq import DeadLetteredRequest, Position

    document = openapi_document()
    listing = document["paths"]["/v1/requests-dlq"]["get"]["responses"]["200"]
    schema = listing["content"]["application/json"]["schema"]
    # A request produced without a key, by a broker that stamps no time.
    keyless = DeadLetteredRequest(Position(0, 7), None, "DECODE: bad magic byte", None, 3, "", "")
    answer = {
        "topic": "requests.dlq",
        "total": 1,
        "messages": [keyless.to_json()],
        "next_page_token": "",
    }
    assert _mismatches(document, schema, answer, "listDeadLetteredRequests") == []


async def test_every_value_the_openapi_document_offers_a_query_parameter_is_accepted(
    live_api: LiveApi,
) -> None:
    _, _, document = await _call(live_api, "GET", OPENAPI_PATH, token=False)
    refused = []
    for path, item in document["paths"].items():
        for method, operation in item.items():
            for parameter in operation.get("parameters", []):
                if parameter["in"] != "query" or "enum" not in parameter["schema"]:
                    continue
                for value in parameter["schema"]["enum"]:
                    target = f"{path}?{parameter['name']}={value}"
                    status, _, body = await _call(live_api, method.upper(), target)
                    if status != 200:
                        refused.append((target, status, body))
    assert refused == []


async def test_every_route_documents_the_parser_refusing_a_malformed_request(
    live_api: LiveApi,
) -> None:
    _, _, document = await _call(live_api, "GET", OPENAPI_PATH, token=False)
    undocumented = []
    for path, item in document["paths"].items():
        # Path parameters filled in, so the request reaches the route.
        target = path.format(job_id=uuid.uuid4(), step_name="review", name="web-review")
        for method in item:
            request = f"{method.upper()} {target} HTTP/1.1\r\nHost: x\r\nNo colon\r\n\r\n"
            status, _, body = await _raw(live_api, request.encode())
            assert (status, body["code"]) == (400, "INVALID_ARGUMENT"), body
            if "400" not in item[method]["responses"]:
                undocumented.append(f"{method.upper()} {path}")
    assert undocumented == []


async def test_a_token_with_the_scopes_the_openapi_document_names_is_let_through(
    live_api_with_kafka: LiveApi,
) -> None:
    live_api = live_api_with_kafka
    _, _, document = await _call(live_api, "GET", OPENAPI_PATH, token=False)
    await _call(live_api, "PUT", "/v1/workflows/web-review", body={"workflow": WEB_WORKFLOW})
    database_url = live_api.runtime.settings.database_url
    refused = []
    for path, item in document["paths"].items():
        target = path.format(job_id=uuid.uuid4(), step_name="review", name="web-review")
        for method, operation in item.items():
            if operation.get("security") == []:
                continue
            # "Needs a token with the `a` (and `b`) scope(s)."
            needs = operation["description"].split(".")[0]
            scopes = re.findall(r"`([a-z-]+)`", needs)
            assert needs.startswith("Needs a token with") and scopes, (path, method)
            issued = await create_token(database_url, "scoped-tester", tuple(scopes))
            headers = {"Authorization": f"Bearer {issued.token}"}
            body = {"workflow_name": "web-review", "input": {"text": "a"}}
            async with live_api.session.request(
                method,
                live_api.url + target,
                json=body if method != "get" else None,
                headers=headers,
            ) as response:
                if response.status in (401, 403):
                    refused.append((method, path, scopes, await response.json()))
    assert refused == []


async def test_a_listed_job_carries_every_field_get_job_does_but_its_payloads(
    live_api: LiveApi,
) -> None:
    await _call(live_api, "PUT", "/v1/workflows/web-review", body={"workflow": WEB_WORKFLOW})
    submit = {"workflow_name": "web-review", "input": {"text": "a"}, "deadline_ms": 600000}
    _, _, submitted = await _call(live_api, "POST", "/v1/workflow-runs", body=submit)
    job_id = submitted["job"]["job_id"]
    await _call(live_api, "POST", f"/v1/workflow-runs/{job_id}:cancel", body={"reason": "r"})
    _, _, resumed = await _call(live_api, "POST", f"/v1/workflow-runs/{job_id}:resume", body={})
    _, _, listed = await _call(live_api, "GET", "/v1/workflow-runs")
    assert len(listed["jobs"]) == 2
    payloads = {"checkpoints", "input", "result", "review_request", "history"}
    for summary in listed["jobs"]:
        _, _, got = await _call(live_api, "GET", f"/v1/workflow-runs/{summary['job_id']}")
        whole = {key: value for key, value in got["job"].items() if key not in payloads}
        assert summary == whole
    assert {job["job_id"]: job.get("resumed_by") for job in listed["jobs"]}[job_id] == (
        resumed["job"]["job_id"]
    )


async def test_the_request_headers_the_verbs_read_are_documented(live_api: LiveApi) -> None:
    _, _, document = await _call(live_api, "GET", OPENAPI_PATH, token=False)
    documented = {
        (path, method): {p["name"] for p in operation.get("parameters", []) if p["in"] == "header"}
        for path, item in document["paths"].items()
        for method, operation in item.items()
    }
    # What streams.web reads besides Authorization (the security scheme's).
    read = {
        ("/v1/workflow-runs", "post"): {TRACEPARENT, TRACESTATE},
        ("/v1/workflow-runs/{job_id}/events", "get"): {"Last-Event-ID"},
        ("/v1/workflows/{name}", "put"): {"If-Match", "If-None-Match"},
    }
    assert {route: names for route, names in documented.items() if names} == read


async def test_a_stored_workflows_etag_is_documented_where_it_is_answered(
    live_api: LiveApi,
) -> None:
    _, _, document = await _call(live_api, "GET", OPENAPI_PATH, token=False)
    item = document["paths"]["/v1/workflows/{name}"]
    put = ("put", {"workflow": WEB_WORKFLOW})
    # Created, then replaced, then read.
    for (method, body), expected in ((put, 201), (put, 200), (("get", None), 200)):
        status, headers, answer = await _call(
            live_api, method.upper(), "/v1/workflows/web-review", body=body
        )
        assert status == expected and headers["ETag"] == f'"{answer["workflow"]["version"]}"'
        assert "ETag" in item[method]["responses"][str(status)].get("headers", {}), method


async def test_every_timestamp_in_an_answer_is_written_one_way(live_api: LiveApi) -> None:
    # The proto3 JSON of a Timestamp, which the messages' own fields carry.
    rfc3339_utc = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")
    await _call(live_api, "PUT", "/v1/workflows/web-review", body={"workflow": WEB_WORKFLOW})
    body = {"workflow_name": "web-review", "input": {"text": "look"}}
    _, _, submitted = await _call(live_api, "POST", "/v1/workflow-runs", body=body)
    # Held by a worker, so the fleet lists its leases.
    assert await live_api.runtime.require_runs().claim("http-test") is not None
    async with await psycopg.AsyncConnection.connect(
        live_api.runtime.settings.database_url, autocommit=True
    ) as conn:
        await conn.execute("UPDATE workflow_run_events_outbox SET status = 'FAILED', attempts = 1")
    _, _, fleet = await _call(live_api, "GET", "/v1/fleet")
    _, _, outbox = await _call(live_api, "GET", "/v1/outbox")
    (worker,) = fleet["workers"]
    stamps = {
        "job.created_at": submitted["job"]["created_at"],
        "fleet.as_of": fleet["as_of"],
        "first_lease_until": worker["first_lease_until"],
        "last_lease_until": worker["last_lease_until"],
        "outbox created_at": outbox["events"][0]["created_at"],
    }
    assert {
        where: stamp for where, stamp in stamps.items() if not rfc3339_utc.fullmatch(stamp)
    } == {}


async def test_a_body_that_is_no_object_is_refused_naming_its_json_type(
    live_api: LiveApi,
) -> None:
    for sent, named in (
        (b"null", "null"),
        (b"[1]", "an array"),
        (b'"x"', "a string"),
        (b"7", "a number"),
        (b"true", "a boolean"),
    ):
        message = await _error(
            live_api, "POST", "/v1/workflow-runs", 400, "INVALID_ARGUMENT", data=sent
        )
        assert message == f"the body of submit-workflow must be a JSON object, got {named}"
