"""The worker's HTTP API as the command line calls it: JSON in, JSON out."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from cli.errors import CliError
from schemas import defaults

DEFAULT_URL = defaults.API_URL
HTTP_TIMEOUT_S = 30.0


class ApiClient:
    """The verbs over HTTP: JSON in, JSON out, errors as :class:`CliError`."""

    def __init__(self, base_url: str, *, timeout_s: float = HTTP_TIMEOUT_S) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    def call(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        query: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        url = self.base_url + path
        params = {key: value for key, value in (query or {}).items() if value not in (None, "")}
        if params:
            url += "?" + urllib.parse.urlencode(params)
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            raise _http_error(exc) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CliError(
                "UNAVAILABLE", f"cannot reach {self.base_url}: {reason} (is a worker running?)"
            ) from None
        if not payload:
            return {}
        decoded = json.loads(payload)
        if not isinstance(decoded, dict):
            raise CliError("INTERNAL", f"{method} {path} answered {type(decoded).__name__}")
        return decoded


def _http_error(exc: urllib.error.HTTPError) -> CliError:
    raw = exc.read()
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if isinstance(body, dict) and "code" in body:
        return CliError(str(body["code"]), str(body.get("message", "")))
    text = raw.decode(errors="replace").strip()
    return CliError(f"HTTP_{exc.code}", text or str(exc.reason))


def path_segment(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")
