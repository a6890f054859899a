"""What a web browser may do to a Corral server (§7): no page can drive a server it was not meant to.

A developer's server listens on loopback with no keys, and any page the
developer visits can send requests to it. Three rules close that:

- Host. On a loopback bind every route refuses a `Host` that is not a
  loopback address or `localhost` (with or without the port), or one of
  `CORRAL_ALLOWED_HOSTS` (421). A DNS-rebinding page reaches 127.0.0.1
  under its own name, so its requests carry a foreign Host. With
  `CORRAL_ALLOWED_HOSTS` set the rule holds on any bind.
- Origin. A browser names the page that sent a request; any `Origin` but the
  server's own (the console) and `CORRAL_CORS_ORIGINS` is refused (403),
  `null` included.
- Content type. A request with a body takes `application/json` only (415):
  `text/plain` and form bodies are what a page may send without a CORS
  preflight.

CORS stays closed unless `CORRAL_CORS_ORIGINS` opens it (Starlette's
`CORSMiddleware` then answers preflights, placed inside this guard). This
module is not responsible for API keys (`guards.ApiKeys`) or body size.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from ..settings import is_loopback
from .guards import reject

BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
JSON = "application/json"
# What a browser page may set on a CORS request to Corral, once its origin is allowed.
CORS_HEADERS = ("Authorization", "Content-Type", "Idempotency-Key", "Last-Event-ID", "X-Request-ID",
                "Mcp-Session-Id", "Mcp-Protocol-Version")
CORS_EXPOSED = ("X-Request-ID", "Mcp-Session-Id", "Retry-After")


def host_name(host: str) -> str:
    """The name in a Host header, without its port and brackets, lowercased."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    name, sep, port = host.rpartition(":")
    return name if sep and port.isdigit() and ":" not in name else host


class BrowserGuard:
    """Host, Origin and Content-Type checks on every route, REST and `/mcp` alike."""

    def __init__(self, app: ASGIApp, *, bind_host: str, allowed_hosts: Iterable[str] = (),
                 cors_origins: Iterable[str] = ()):
        self.app = app
        self.allowed_hosts = frozenset(host_name(h) for h in allowed_hosts)
        self.check_host = is_loopback(bind_host) or bool(self.allowed_hosts)
        self.cors_origins = frozenset(o.strip().lower().rstrip("/") for o in cors_origins)

    def _host_ok(self, host: str) -> bool:
        name = host_name(host)
        return is_loopback(name) or name in self.allowed_hosts

    def _origin_ok(self, origin: str, host: str) -> bool:
        origin = origin.strip().lower().rstrip("/")
        if origin in self.cors_origins:
            return True
        parts = urlsplit(origin)
        # the server's own origin: the page the console is served on
        return parts.scheme in ("http", "https") and bool(host) and parts.netloc == host.strip().lower()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
        host = headers.get("host", "")
        if self.check_host and host and not self._host_ok(host):
            return await reject(send, "host_not_allowed",
                                f"Host {host_name(host)!r} is not served here (see CORRAL_ALLOWED_HOSTS)")
        origin = headers.get("origin")
        if origin is not None and not self._origin_ok(origin, host):
            return await reject(send, "forbidden",
                                "requests from this Origin are refused (see CORRAL_CORS_ORIGINS)")
        if scope["method"] in BODY_METHODS and not _json_or_empty(headers):
            return await reject(send, "unsupported_media_type", f"a request body must be {JSON}")
        return await self.app(scope, receive, send)


def _json_or_empty(headers: dict[str, str]) -> bool:
    """A declared content type must be JSON; a body without one is refused too."""
    declared = headers.get("content-type")
    if declared is not None:
        return declared.split(";", 1)[0].strip().lower() == JSON
    has_body = headers.get("content-length", "0").strip() not in ("", "0") or "transfer-encoding" in headers
    return not has_body
