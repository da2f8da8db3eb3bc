"""The web dashboard: three static files the ``api`` role serves under ``/dashboard/``.

The page is plain HTML, CSS and a JavaScript module written by hand, shipped in
the package: no build step at install time, nothing fetched from elsewhere, so
it works offline. It holds no data of its own: the browser calls the HTTP API
with the token its user pastes (kept in that browser's local storage), so
every action goes through the API's authentication and scopes like any other
client's. Its policy lets the page load only its own files and talk only to
this origin.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import faust
from faust.web import Request, Response, View

ASSETS: dict[str, str] = {
    "app.js": "text/javascript",
    "app.css": "text/css",
    "favicon.svg": "image/svg+xml",
}
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # The files change with the release; a reload after an upgrade must not mix them.
    "Cache-Control": "no-cache",
}


def _read(name: str) -> bytes:
    return (resources.files(__name__) / name).read_bytes()


def register_dashboard(app: faust.App) -> None:
    """Serve the dashboard at ``/dashboard/``; ``/dashboard`` redirects there."""
    index = _read("index.html")
    assets = {name: (_read(name), media) for name, media in ASSETS.items()}

    @app.page("/dashboard")
    class DashboardRedirect(View):
        async def get(self, request: Request, **_: Any) -> Response:
            return self.bytes(b"", status=308, headers={"Location": "/dashboard/"})

    @app.page("/dashboard/")
    class DashboardPage(View):
        async def get(self, request: Request, **_: Any) -> Response:
            return self.bytes(
                index,
                headers={**SECURITY_HEADERS, "Content-Type": "text/html; charset=utf-8"},
            )

    @app.page("/dashboard/{name:app\\.js|app\\.css|favicon\\.svg}")
    class DashboardAsset(View):
        async def get(self, request: Request, name: str = "", **_: Any) -> Response:
            body, media = assets[name]
            return self.bytes(
                body, headers={**SECURITY_HEADERS, "Content-Type": f"{media}; charset=utf-8"}
            )


__all__ = ["register_dashboard"]
