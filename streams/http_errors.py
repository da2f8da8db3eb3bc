"""HTTP hygiene: every answer is an ``ErrorBody`` or a verb's JSON, every input is checked.

What a caller on the network can send that no verb should ever see (the views
of ``streams.web`` run these checks once the caller's token is verified, so a
stranger learns nothing about what it sent):

* a body that is not ``application/json`` (UTF-8), or that is compressed: 415
  ``UNSUPPORTED_MEDIA_TYPE``.
  A web page may POST ``text/plain`` to any address without a CORS preflight;
  refusing every other type means such a request never reaches a verb;
* U+0000 in a path parameter, a query parameter or any string (or key) of a
  JSON body, at any depth: 400 naming the field. Postgres refuses it in text
  and JSONB, so it would otherwise fail deep inside a verb;
* a JSON body nested deeper than ``MAX_JSON_DEPTH``: 400 naming the limit,
  found by a scan of the bytes before anything is parsed (the protobuf and
  protovalidate layers refuse deep messages with errors that are not the
  caller's to read);
* an over-long URL (414 ``URI_TOO_LONG``), an over-long header or too many
  headers (431 ``HEADERS_TOO_LARGE``), or anything else aiohttp's parser
  refuses (400): those are answered before any middleware runs, by the
  connection's request handler, so ``JsonErrorRunner`` serves the app with one
  that answers them as ``ErrorBody`` too.

Unknown paths (404 ``NOT_FOUND``) and methods (405 ``METHOD_NOT_ALLOWED``) answer
an ``ErrorBody``. A bug (any exception that is not a ``WorkflowJobsError``)
answers 500 ``INTERNAL`` with a request id and nothing else; the log has the
request id with the traceback. Every answer carries its ``X-Request-Id``.
"""

from __future__ import annotations

import json
import logging
import math
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, HttpProcessingError, LineTooLong
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_server import Server

from schemas.contract import api_pb2, to_json
from schemas.errors import InvalidArgument, UnsupportedMediaType, WorkflowJobsError
from streams.convert import nul_field, nul_refusal

if TYPE_CHECKING:
    import faust

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Request-Id"
# Where the middleware leaves a request's id for the answer's headers.
_REQUEST_ID = web.RequestKey("request_id", str)
JSON_MEDIA_TYPE = "application/json"
# Deeper than any definition, input or step response needs, and shallow enough
# that the protobuf and protovalidate layers (which refuse a message a few levels
# deeper) never see one they cannot take.
MAX_JSON_DEPTH = 32
# The parser's limits. The URL limit differs from the header limit on purpose:
# the parser raises the same error for both, with the limit it hit.
MAX_URL_BYTES = 4096
MAX_HEADER_BYTES = 8190
MAX_HEADERS = 100
HANDLER_ARGS: Mapping[str, int | bool] = {
    "max_line_size": MAX_URL_BYTES,
    "max_field_size": MAX_HEADER_BYTES,
    "max_headers": MAX_HEADERS,
    # aiohttp would inflate a gzip or deflate body as it arrives, on the event
    # loop and past the body limit (which counts what is read, not what was
    # sent), and answer a coding it cannot read with a 500 or plain text.
    # Bodies are refused unless sent as they are (``require_json``).
    "auto_decompress": False,
}

# Codes only the HTTP layer answers with (``streams.web.HTTP_STATUS`` maps them).
METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
URI_TOO_LONG = "URI_TOO_LONG"
HEADERS_TOO_LARGE = "HEADERS_TOO_LARGE"

# Statuses aiohttp raises itself (routing, its body limit), as codes.
_CODE_OF_STATUS: Mapping[int, str] = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: METHOD_NOT_ALLOWED,
    409: "FAILED_PRECONDITION",
    413: "PAYLOAD_TOO_LARGE",
    414: URI_TOO_LONG,
    415: UnsupportedMediaType.code,
    429: "RESOURCE_EXHAUSTED",
    431: HEADERS_TOO_LARGE,
    503: "UNAVAILABLE",
}

_NUL = "\x00"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def new_request_id() -> str:
    return uuid.uuid4().hex


def error_response(code: str, message: str, request_id: str, *, status: int) -> web.Response:
    body = to_json(api_pb2.ErrorBody(code=code, message=message))
    return web.json_response(body, status=status, headers={REQUEST_ID_HEADER: request_id})


def internal_error(request_id: str) -> web.Response:
    message = f"internal error; the service log has request id {request_id}"
    return error_response("INTERNAL", message, request_id, status=500)


# ---------------------------------------------------------------------- JSON bodies

# A JSON string (escapes included), so brackets inside strings are not counted.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_A_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_OPENERS = frozenset(b"[{")


def check_json_depth(body: bytes, limit: int = MAX_JSON_DEPTH) -> None:
    """Refuse ``body`` if its arrays and objects nest deeper than ``limit``, unparsed."""
    brackets = _JSON_STRING.sub(b"", body).translate(None, _NOT_A_BRACKET)
    if brackets.count(b"[") + brackets.count(b"{") <= limit:
        return
    depth = 0
    for byte in brackets:
        if byte in _OPENERS:
            depth += 1
            if depth > limit:
                raise InvalidArgument(
                    f"the JSON body is nested more than {limit} levels deep (the limit)"
                )
        else:
            depth -= 1


def _json_int(text: str) -> int | float:
    # Every number a body carries lands in a Struct, a double: an integer past a
    # double's range becomes infinity here, which the Struct's reader refuses
    # naming where it is, as it does 1e400. float() reads any length of digits;
    # int() refuses past 4300 of them, and only a finite one reaches it.
    number = float(text)
    return int(text) if math.isfinite(number) else number


def load_json(body: bytes, what: str) -> Any:
    """A request body as JSON: depth checked before parsing, U+0000 refused after."""
    check_json_depth(body)
    try:
        value = json.loads(body, parse_int=_json_int)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidArgument(f"the body of {what} is not valid JSON: {exc}") from None
    where = nul_field(value)
    if where is not None:
        raise nul_refusal(where)
    return value


def json_type(value: Any) -> str:
    """What a parsed JSON value is, in JSON's own words: a caller sent JSON, not Python."""
    if value is None:
        return "null"
    # bool before number: True is an int to Python.
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


# ---------------------------------------------------------------------- middlewares


def error_bodies(statuses: Mapping[str, int]) -> Any:
    """The outermost middleware: whatever happens inside answers JSON with a request id.

    ``statuses`` is the one table from codes to HTTP statuses (``streams.web``).
    """

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        request_id = new_request_id()
        request[_REQUEST_ID] = request_id
        try:
            response = await handler(request)
        except WorkflowJobsError as exc:
            status = statuses.get(exc.code, 500)
            return error_response(exc.code, exc.message, request_id, status=status)
        except web.HTTPException as exc:
            response = _framework_error(request, exc, request_id)
        except Exception:
            log.exception(
                "internal error serving %s %s (request id %s)",
                request.method,
                request.path,
                request_id,
            )
            return internal_error(request_id)
        return response

    return middleware


async def _stamp_request_id(request: web.Request, response: web.StreamResponse) -> None:
    # On prepare, not in the middleware: a stream (a watch) sends its headers
    # before its handler returns.
    request_id = request.get(_REQUEST_ID)
    if request_id is not None:
        response.headers.setdefault(REQUEST_ID_HEADER, request_id)


def _framework_error(
    request: web.Request, exc: web.HTTPException, request_id: str
) -> web.StreamResponse:
    if exc.status < 400:
        # Redirects and the like are answers, not errors.
        return exc
    if exc.content_type == JSON_MEDIA_TYPE:
        return exc
    if exc.status == 404:
        message = f"no such resource: {request.method} {_shown(request.path)}"
    elif isinstance(exc, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(exc.allowed_methods))
        message = (
            f"method {request.method} is not allowed on {_shown(request.path)}; allowed: {allowed}"
        )
    else:
        message = exc.reason
    code = _CODE_OF_STATUS.get(exc.status, "INTERNAL" if exc.status >= 500 else "INVALID_ARGUMENT")
    response = error_response(code, message, request_id, status=exc.status)
    if isinstance(exc, web.HTTPMethodNotAllowed):
        # A 405 names what the resource does take (RFC 9110, 15.5.6).
        response.headers["Allow"] = ", ".join(sorted(exc.allowed_methods))
    return response


def _shown(text: str) -> str:
    return text if len(text) <= 200 else text[:200] + "..."


def refuse_nul(where: str, value: str) -> None:
    """Refuse a path or query parameter that holds U+0000, naming it."""
    if _NUL in value:
        raise nul_refusal(where)


def check_query(query: Mapping[str, str]) -> None:
    """Refuse a query whose names or values hold U+0000."""
    for key, value in query.items():
        if _NUL in key:
            raise nul_refusal("a query parameter name")
        refuse_nul(f"query parameter {_shown(key)}", value)


def require_json(request: web.Request) -> None:
    """Refuse a body that is not declared ``application/json`` (UTF-8), or is
    compressed, with 415."""
    charset = (request.charset or "utf-8").lower()
    if request.content_type != JSON_MEDIA_TYPE or charset not in ("utf-8", "utf8"):
        given = request.headers.get("Content-Type", "").strip()
        raise UnsupportedMediaType(
            f"{request.method} bodies must be {JSON_MEDIA_TYPE} (UTF-8); "
            f"got {_shown(given) if given else 'no Content-Type'}"
        )
    coding = request.headers.get("Content-Encoding", "").strip()
    if coding and coding.lower() != "identity":
        raise UnsupportedMediaType(
            f"{request.method} bodies must be sent uncompressed; "
            f"got Content-Encoding {_shown(coding)}"
        )


# ---------------------------------------------------------------------- parser errors


class _JsonErrorRequestHandler(RequestHandler):
    """A connection handler whose own answers (parse errors, escaped bugs) are JSON."""

    # No new attributes: instances are made by aiohttp's Server and given this class.
    __slots__ = ()

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:
            # Part of an answer is on the wire: the connection is all we can end.
            raise ConnectionError("an answer was partly sent; cannot send an error after it")
        request_id = new_request_id()
        code, status, text = self._classify(status, exc)
        if status >= 500:
            log.error("internal error serving a request (request id %s)", request_id, exc_info=exc)
            response = internal_error(request_id)
        else:
            log.info("refused a malformed HTTP request from %s: %s", request.remote, text)
            response = error_response(code, text, request_id, status=status)
        response.force_close()
        return response

    def _classify(self, status: int, exc: BaseException | None) -> tuple[str, int, str]:
        if isinstance(exc, LineTooLong):
            limit = exc.args[1] if len(exc.args) > 1 else None
            if limit == self.max_line_size and limit != self.max_field_size:
                return URI_TOO_LONG, 414, f"the URL is longer than {limit} bytes (the limit)"
            return HEADERS_TOO_LARGE, 431, f"a header is longer than {limit} bytes (the limit)"
        if isinstance(exc, BadHttpMessage) and "Too many headers" in exc.message:
            text = f"the request has more than {self.max_headers} headers (the limit)"
            return HEADERS_TOO_LARGE, 431, text
        if 400 <= status < 500:
            reason = _parser_reason(exc.message) if isinstance(exc, HttpProcessingError) else ""
            text = "the request is not well-formed HTTP"
            return "INVALID_ARGUMENT", 400, f"{text}: {_shown(reason)}" if reason else text
        return "INTERNAL", 500, ""


# The bytes a parser refusal quotes (b'...' to the end of its line).
_QUOTED_BYTES = re.compile(r"""\s*b['"].*$""")


def _parser_reason(message: str) -> str:
    """What the parser found wrong, without the bytes it quotes: a refused
    header line may hold the caller's token, and this text is logged."""
    lines = message.strip().splitlines()
    return _QUOTED_BYTES.sub("", lines[0]).rstrip(": ") if lines else ""


class _JsonErrorServer(Server):
    def __call__(self) -> RequestHandler:
        handler = super().__call__()
        handler.__class__ = _JsonErrorRequestHandler
        return handler


class JsonErrorRunner(web.AppRunner):
    """Aiohttp's runner, serving connections with ``_JsonErrorRequestHandler``."""

    async def _make_server(self) -> Server:
        server = await super()._make_server()
        server.__class__ = _JsonErrorServer
        return server


def install(app: faust.App, statuses: Mapping[str, int]) -> None:
    """Serve ``app``'s web server with JSON errors, whatever raises them."""
    faust_web: Any = app.web
    # Outermost, so it also answers for any middleware added after it.
    faust_web.web_app.middlewares.insert(0, error_bodies(statuses))
    faust_web.web_app.on_response_prepare.append(_stamp_request_id)
    # Faust's aiohttp driver makes its runner when the web service is made and
    # starts the server with it; replacing it before the start is the one way
    # to choose the connection handler of the server Faust runs.
    faust_web._runner = JsonErrorRunner(faust_web.web_app, access_log=None)


__all__ = [
    "HANDLER_ARGS",
    "MAX_JSON_DEPTH",
    "REQUEST_ID_HEADER",
    "JsonErrorRunner",
    "check_json_depth",
    "check_query",
    "error_bodies",
    "error_response",
    "install",
    "json_type",
    "load_json",
    "refuse_nul",
    "require_json",
]
