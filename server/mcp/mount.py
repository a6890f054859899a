"""`/mcp`: the MCP server mounted in the HTTP app.

Host, Origin and Content-Type are checked for `/mcp` exactly as for every
other route, by `browsers.BrowserGuard` (one rule for every loopback
address), so the SDK's own DNS-rebinding protection, which pins a fixed list
of host strings, is turned off here.

With several replicas behind a load balancer (`stateless`), no MCP session
may live in one process: `initialize` carries no session id yet, so no
balancer can route a session's later requests back to it. The SDK's
stateless mode serves every request on its own, on any replica; the
modern protocol era is sessionless anyway. What a handshake-era client
loses is the standalone GET stream, hence spontaneous `list_changed`
notifications (modern clients get them on `subscriptions/listen`, served by
whichever replica they reach, since every replica swaps its own set).
"""

from __future__ import annotations

from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp.server.transport_security import TransportSecuritySettings
from starlette.routing import Route

from .server import AgentsMCP


def mcp_route(agents: AgentsMCP, *, stateless: bool = False) -> Route:
    """`/mcp` as a plain route (not a mount at `/`, which would swallow every unknown path)."""
    security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    # Called for its side effect: it builds `session_manager` with the security settings.
    agents.server.streamable_http_app(streamable_http_path="/mcp", transport_security=security,
                                      session_idle_timeout=600, stateless_http=stateless)
    endpoint = StreamableHTTPASGIApp(agents.server.session_manager)
    return Route("/mcp", endpoint=endpoint, methods=["GET", "POST", "DELETE"])
