"""The worker's HTTP API as the command line calls it: JSON in, JSON out.

Every call carries the token ``find_token`` finds: ``WFJOBS_TOKEN``, else the
file ``WFJOBS_TOKEN_FILE`` names, else the development token ``wfjobs dev``
wrote under ``.wfjobs-dev`` in the current directory, and only to the origin of
``--url``: a redirect to another scheme, host or port is followed without it.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from cli.errors import CliError
from schemas import defaults

DEFAULT_URL = defaults.API_URL
HTTP_TIMEOUT_S = 30.0
HTTP_TIMEOUT_ENV = "WFJOBS_HTTP_TIMEOUT_S"
# Said after a call that got no answer in time: a slow one can be waited for.
_WAIT_LONGER = f" (--http-timeout or {HTTP_TIMEOUT_ENV} waits longer)"
TOKEN_ENV = "WFJOBS_TOKEN"
TOKEN_FILE_ENV = "WFJOBS_TOKEN_FILE"
# How much of an error answer that is not the API's own JSON is shown.
_MAX_DETAIL = 300


class _TokenStaysHome(urllib.request.HTTPRedirectHandler):
    """Follows redirects as urllib does, but sends the token only to the origin it
    was meant for: urllib copies every header to wherever a redirect points."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: Any,
        code: int,
        msg: str,
        headers: Any,
        newurl: str,
    ) -> urllib.request.Request | None:
        follow = super().redirect_request(req, fp, code, msg, headers, newurl)
        here = _origin(req.full_url)
        if follow is not None and (here is None or _origin(follow.full_url) != here):
            follow.remove_header("Authorization")
        return follow


def _origin(url: str) -> tuple[str, str, int | None] | None:
    """Scheme, host and port of ``url``; None when its port cannot be read."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        return None
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), port or default


_OPENER = urllib.request.build_opener(_TokenStaysHome())


def find_token(environ: Mapping[str, str] | None = None) -> str:
    """The token to send, or "" when there is none anywhere we look."""
    environ = os.environ if environ is None else environ
    token = environ.get(TOKEN_ENV, "").strip()
    if token:
        return token
    named = environ.get(TOKEN_FILE_ENV, "").strip()
    path = Path(named) if named else Path(defaults.DEV_TOKEN_FILE)
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        if named:
            raise CliError("INVALID_ARGUMENT", f"{TOKEN_FILE_ENV}: no such file {named}") from None
        return ""
    except OSError as exc:
        raise CliError("INVALID_ARGUMENT", f"cannot read the token file {path}: {exc}") from None


class ApiClient:
    """The verbs over HTTP: JSON in, JSON out, errors as :class:`CliError`."""

    def __init__(
        self, base_url: str, *, token: str | None = None, timeout_s: float = HTTP_TIMEOUT_S
    ) -> None:
        self.base_url = _api_url(base_url)
        self.token = find_token() if token is None else token
        self.timeout_s = timeout_s
        # Response headers of the last call (an ETag, say).
        self.headers: Mapping[str, str] = {}

    def call(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        query: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = self._request(method, path, query, headers, data, accept="application/json")
        try:
            with self._open(request, self.timeout_s, _WAIT_LONGER) as response:
                payload = response.read()
                self.headers = dict(response.headers.items())
        except OSError as exc:
            raise self._unreachable(exc, request, self.timeout_s, _WAIT_LONGER) from None
        except http.client.HTTPException as exc:
            raise self._not_http(exc) from None
        if not payload:
            return {}
        try:
            decoded = json.loads(payload)
        except ValueError:
            # Something else answers at that address: a proxy's page, another service.
            raise CliError(
                "INTERNAL",
                f"{method} {self.base_url}{path} answered something that is not JSON "
                "(is --url a workflow-jobs worker?)",
            ) from None
        if not isinstance(decoded, dict):
            raise CliError("INTERNAL", f"{method} {path} answered {type(decoded).__name__}")
        return decoded

    @contextlib.contextmanager
    def stream(
        self,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        idle_timeout_s: float,
    ) -> Iterator[Iterator[bytes]]:
        """The lines of a streamed GET (Server-Sent Events) as they arrive.

        A read that waits longer than ``idle_timeout_s`` raises ``TimeoutError``.
        """
        request = self._request("GET", path, query, headers, None, accept="text/event-stream")
        with self._open(request, idle_timeout_s) as response:
            kind = response.headers.get_content_type()
            if kind != "text/event-stream":
                # Another server's page: it would end without an event, and the
                # caller would reconnect to it forever.
                raise CliError(
                    "INTERNAL",
                    f"GET {self.base_url}{path} answered {kind}, not an event stream "
                    "(is --url a workflow-jobs worker?)",
                )
            yield iter(response.readline, b"")

    def _request(
        self,
        method: str,
        path: str,
        query: Mapping[str, Any] | None,
        headers: Mapping[str, str] | None,
        data: bytes | None,
        *,
        accept: str,
    ) -> urllib.request.Request:
        url = self.base_url + path
        params = {key: value for key, value in (query or {}).items() if value not in (None, "")}
        if params:
            url += "?" + urllib.parse.urlencode(params)
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Accept", accept)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        return request

    def _open(self, request: urllib.request.Request, timeout_s: float, hint: str = "") -> Any:
        """``request`` sent; ``hint`` follows the error when no answer came in time."""
        try:
            return _OPENER.open(request, timeout=timeout_s)
        except urllib.error.HTTPError as exc:
            error = _http_error(exc)
            if error.code == "UNAUTHENTICATED" and not self.token:
                error = CliError(
                    error.code,
                    f"{error.message} (no token found: set {TOKEN_ENV} or {TOKEN_FILE_ENV}, or "
                    f"run `wfjobs dev` here, which writes {defaults.DEV_TOKEN_FILE})",
                )
            raise error from None
        except OSError as exc:
            raise self._unreachable(exc, request, timeout_s, hint) from None
        except http.client.HTTPException as exc:
            raise self._not_http(exc) from None

    def _not_http(self, exc: http.client.HTTPException) -> CliError:
        # Something listens there but does not answer HTTP (a Kafka or Postgres
        # port, say), or the answer was cut short.
        # repr: whatever it sent is escaped, not written to the terminal as it is.
        return CliError(
            "UNAVAILABLE",
            f"{self.base_url} gave no HTTP answer ({repr(exc)[:_MAX_DETAIL]}); is it a worker?",
        )

    def _unreachable(
        self, exc: OSError, request: urllib.request.Request, timeout_s: float, hint: str
    ) -> CliError:
        method = request.get_method()
        maybe = "" if method == "GET" else "; it may have been done all the same"
        if isinstance(exc, TimeoutError):
            # Not a connect timeout (urllib wraps those in a URLError): the worker
            # took the request, so one that changes something may have been done.
            return CliError(
                "UNAVAILABLE",
                f"{method} {request.full_url} got no answer within {timeout_s:g} s{maybe}{hint}",
            )
        if not isinstance(exc, urllib.error.URLError):
            # urllib wraps what fails while connecting and sending; this came
            # after, while waiting for the answer (a worker killed mid-call).
            return CliError(
                "UNAVAILABLE",
                f"{method} {request.full_url}: the connection closed before the answer "
                f"came ({exc}){maybe}",
            )
        reason = getattr(exc, "reason", exc)
        return CliError(
            "UNAVAILABLE", f"cannot reach {self.base_url}: {reason} (is a worker running?)"
        )


def _api_url(url: str) -> str:
    """``url`` without its trailing slash, refused unless it is an http(s) URL with a
    host: urllib would otherwise raise on it mid-call, or read a ``file:`` URL."""
    stripped = url.strip().rstrip("/")
    if stripped != shown_url(stripped):
        # urllib would take "user:password@host" for the host name and look it up.
        raise CliError(
            "INVALID_ARGUMENT",
            f"--url (or WFJOBS_URL) must not carry a user or password, got "
            f"{shown_url(stripped)!r}; the token goes in {TOKEN_ENV} or {TOKEN_FILE_ENV}",
        )
    try:
        parts = urllib.parse.urlsplit(stripped)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname)
        _ = parts.port  # a port that is not a number or out of range raises here
    except ValueError:
        valid = False
    if not valid:
        raise CliError(
            "INVALID_ARGUMENT",
            f"--url (or WFJOBS_URL) must be an http:// or https:// URL with a host, got {url!r}",
        )
    return stripped


def shown_url(url: str) -> str:
    """``url`` as the command line may print it: a user and password before the
    host are left out."""
    scheme, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    if not sep or "@" not in authority:
        return url
    return f"{scheme}://***@{authority.rpartition('@')[2]}{slash}{path}"


def _http_error(exc: urllib.error.HTTPError) -> CliError:
    raw = exc.read()
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if isinstance(body, dict) and "code" in body:
        return CliError(str(body["code"]), str(body.get("message", "")))
    text = raw.decode(errors="replace").strip()
    # Plain text (the HTTP parser's own refusals) says why in its first line; an
    # HTML page (a proxy's) would fill the terminal, so its status line stands in.
    plain = exc.headers is None or exc.headers.get_content_type() == "text/plain"
    detail = text.splitlines()[0][:_MAX_DETAIL] if text and plain else ""
    return CliError(f"HTTP_{exc.code}", detail or str(exc.reason))


def path_segment(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")
