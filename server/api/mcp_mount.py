"""`/mcp`: the MCP server mounted in the HTTP app, behind an Origin check.

The SDK's own DNS-rebinding protection is kept for loopback binds (it pins
Host and Origin to loopback). A browser page on another origin must never
drive an agent, whatever the bind address, so Origin is also checked here:
absent (a non-browser client), loopback, or the same host as `Host`.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp.server.transport_security import TransportSecuritySettings
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ..mcp_server import AgentsMCP

LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def mcp_route(agents: AgentsMCP, host: str) -> Route:
    """`/mcp` as a plain route (not a mount at `/`, which would swallow every unknown path)."""
    security = None if host in LOOPBACK else TransportSecuritySettings(enable_dns_rebinding_protection=False)
    # Called for its side effect: it builds `session_manager` with the security settings.
    agents.server.streamable_http_app(streamable_http_path="/mcp", host=host,
                                      transport_security=security, session_idle_timeout=600)
    endpoint = OriginGuard(StreamableHTTPASGIApp(agents.server.session_manager))
    return Route("/mcp", endpoint=endpoint, methods=["GET", "POST", "DELETE"])


class OriginGuard:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            origin = headers.get(b"origin", b"").decode("latin-1")
            if origin and not _allowed(origin, headers.get(b"host", b"").decode("latin-1")):
                body = json.dumps({"error": {"code": "forbidden", "message": "foreign Origin"}}).encode()
                await send({"type": "http.response.start", "status": 403,
                            "headers": [(b"content-type", b"application/json")]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def _allowed(origin: str, host: str) -> bool:
    parts = urlsplit(origin)
    return parts.hostname in LOOPBACK or parts.netloc == host
