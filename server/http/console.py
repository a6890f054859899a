"""`GET /console`: the web console (§11), a page and its static files served from the package.

The page is plain HTML, CSS and ES modules in `server/console/`: no build
step, nothing fetched from another host (its Content-Security-Policy allows
this origin only). It holds no data. It reads and steers the server through
the public HTTP API and `/v1/events` like any other client, sending the API
key itself from the page's session storage, so the key check lets the page
and its files through (`guards.is_open`); the page is told only whether the
server wants a key, so it can ask for one before its first request.

The page is for people, not part of the JSON API: it stays out of
`/openapi.json` (`Unlisted`), as its files do (a `Mount`).
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

FILES = Path(__file__).resolve().parent.parent / "console"
STATIC_SUFFIXES = frozenset({".js", ".css", ".svg"})  # the page itself is served by `page`, filled in
# Only this origin, for everything the page loads or connects to; nothing may frame it.
POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
          "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {
    "Content-Security-Policy": POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


async def page(request: Request) -> Response:
    """The console's page; `corral-keys` says whether requests need `Authorization: Bearer`,
    `corral-trace-url` where a turn's trace is shown (`CORRAL_TRACE_URL`, if set)."""
    settings = request.app.state.service.settings
    keys = "required" if settings.keys else "none"
    html = (FILES / "index.html").read_text("utf-8").replace("{{keys}}", keys)
    html = html.replace("{{trace_url}}", escape(settings.trace_url, quote=True))
    return Response(html, media_type="text/html; charset=utf-8", headers=HEADERS)


class ConsoleFiles(StaticFiles):
    """The page's scripts, styles and icons, revalidated on every load (so an upgrade shows at once)."""

    def file_response(self, full_path, stat_result, scope: Scope, status_code: int = 200) -> Response:
        response = super().file_response(full_path, stat_result, scope, status_code)
        response.headers.update({"X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"})
        return response

    def lookup_path(self, path: str):
        if Path(path).suffix not in STATIC_SUFFIXES:
            return "", None  # a 404: nothing but the page's assets is served from here
        return super().lookup_path(path)


class Unlisted(BaseRoute):
    """A route served like any other but left out of the API document (which lists `Route`s)."""

    def __init__(self, route: Route):
        self.route = route

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        return self.route.matches(scope)

    def url_path_for(self, name: str, /, **params: object):
        return self.route.url_path_for(name, **params)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.route.handle(scope, receive, send)


routes = [
    Unlisted(Route("/console", page, methods=["GET"])),
    Mount("/console", ConsoleFiles(directory=FILES), name="console"),
]
