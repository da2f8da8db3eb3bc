"""Malformed requests thrown at every route the OpenAPI document names.

Whatever arrives (any method, path parameters and query parameters of any text,
U+0000 included, bodies that are JSON of any shape and depth (NaN and Infinity
included, which Python's parser takes) or not JSON at all,
any declared media type, a good token, a bad one or none), the answer is never
a 5xx, always JSON (but for ``/metrics``, whose page is Prometheus's text
format), and every error is an ``ErrorBody``. A request without a good token never
gets past 401 on a route that needs one.
"""

from __future__ import annotations

import json
import urllib.parse
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streams.http_errors import REQUEST_ID_HEADER
from streams.openapi import openapi_document
from tests.integration.http.conftest import LiveApi

pytestmark = [pytest.mark.asyncio, pytest.mark.kafka]

DOCUMENT = openapi_document()
OPERATIONS = sorted(
    (path, method.upper(), operation)
    for path, item in DOCUMENT["paths"].items()
    for method, operation in item.items()
)
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
CONTENT_TYPES = (
    "application/json",
    "application/json; charset=utf-8",
    "application/json; charset=latin-1",
    "text/plain",
    "application/x-www-form-urlencoded",
    "application/octet-stream",
    None,
)

texts = st.text(max_size=24)
# NaN and the infinities included: json.dumps writes them, Python's parser reads them back.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=12,
)


def _property_names(operation: dict[str, Any]) -> list[str]:
    """The body's own field names, so bodies look like the real thing often enough."""
    body = operation.get("requestBody")
    if body is None:
        return []
    schema = body["content"]["application/json"]["schema"]
    if "$ref" in schema:
        schema = DOCUMENT["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    names: set[str] = set(schema.get("properties", {}))
    for choice in schema.get("oneOf", []):
        names.update(choice.get("properties", {}))
    return sorted(names)


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    path, method, operation = draw(st.sampled_from(OPERATIONS))
    parameters = operation.get("parameters", [])
    for parameter in parameters:
        if parameter["in"] == "path":
            value = draw(st.one_of(st.just(str(uuid.uuid4())), texts))
            path = path.replace("{" + parameter["name"] + "}", urllib.parse.quote(value, safe=""))
    names = [p["name"] for p in parameters if p["in"] == "query"]
    query = draw(
        st.dictionaries(st.sampled_from(names) | texts if names else texts, texts, max_size=3)
    )
    fields = _property_names(operation)
    body = draw(
        st.one_of(
            st.none(),
            json_values.map(lambda value: json.dumps(value).encode()),
            st.dictionaries(
                st.sampled_from(fields) if fields else texts, json_values, max_size=4
            ).map(lambda value: json.dumps(value).encode()),
            st.binary(max_size=64),
            st.integers(1, 200).map(lambda depth: b"[" * depth + b"]" * depth),
        )
    )
    return {
        "method": draw(st.sampled_from(METHODS)) if draw(st.booleans()) else method,
        "path": path,
        "query": query,
        "body": body,
        "content_type": draw(st.sampled_from(CONTENT_TYPES)),
        "token": draw(st.sampled_from(("good", "good", "none", "bad"))),
        "needs_token": operation.get("security") != [],
    }


async def _send(api: LiveApi, request: dict[str, Any]) -> None:
    headers: dict[str, str] = {}
    if request["token"] == "good":
        headers.update(api.auth)
    elif request["token"] == "bad":
        headers["Authorization"] = "Bearer wfj_000000000000_not-a-real-secret"
    if request["body"] is not None and request["content_type"] is not None:
        headers["Content-Type"] = request["content_type"]
    url = api.url + request["path"]
    if request["query"]:
        url += "?" + urllib.parse.urlencode(request["query"])
    async with api.session.request(
        request["method"],
        url,
        data=request["body"],
        headers=headers,
        skip_auto_headers={"Content-Type"},
    ) as response:
        raw = await response.read()
        what = f"{request['method']} {url} -> {response.status} {raw[:300]!r}"
        assert response.headers.get(REQUEST_ID_HEADER), what
        if response.status == 200 and request["path"] == "/metrics":
            # The one answer that is not JSON: Prometheus's text format.
            assert response.content_type == "text/plain", what
            return
        assert response.content_type == "application/json", what
        body = json.loads(raw)
        if response.status >= 400:
            assert isinstance(body, dict) and set(body) == {"code", "message"}, what
            assert isinstance(body["code"], str) and isinstance(body["message"], str), what
        assert response.status < 500, what
        if request["token"] != "good" and request["needs_token"]:
            # Routing answers first (the method or the path may match no route).
            assert response.status in (401, 404, 405), what


@settings(
    max_examples=500,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(request=requests())
async def test_malformed_requests_get_json_errors_and_never_a_5xx(
    live_api_with_kafka: LiveApi, request: dict[str, Any]
) -> None:
    await _send(live_api_with_kafka, request)
