"""`/mcp`: the MCP server mounted in the HTTP app.

Host, Origin and Content-Type are checked for `/mcp` exactly as for every
other route, by `browsers.BrowserGuard` (one rule for every loopback
address), so the SDK's own DNS-rebinding protection, which pins a fixed list
of host strings, is turned off here.
"""

from __future__ import annotations

from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp.server.transport_security import TransportSecuritySettings
from starlette.routing import Route

from .server import AgentsMCP


def mcp_route(agents: AgentsMCP) -> Route:
    """`/mcp` as a plain route (not a mount at `/`, which would swallow every unknown path)."""
    security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    # Called for its side effect: it builds `session_manager` with the security settings.
    agents.server.streamable_http_app(streamable_http_path="/mcp", transport_security=security,
                                      session_idle_timeout=600)
    endpoint = StreamableHTTPASGIApp(agents.server.session_manager)
    return Route("/mcp", endpoint=endpoint, methods=["GET", "POST", "DELETE"])
