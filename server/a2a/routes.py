"""The A2A routes: `GET /a2a/{ref}/.well-known/agent-card.json` and JSON-RPC at `POST /a2a/{ref}`.

`{ref}` is any agent reference; one that resolves to no agent is HTTP 404
(the error table's `agent_not_found` / `digest_not_found`), before any
JSON-RPC is read. The endpoint is the SDK's `JsonRpcDispatcher` with its
0.3 adapter on, over `CorralHandler`; each call carries the service, the
reference and who asks (the key's fingerprint, as the permissions route
records it) in its `ServerCallContext`. Auth, Host and Origin are the app's
middleware, as for every route; a body with a lone surrogate is a 400.
"""

from __future__ import annotations

import hashlib

from a2a.server.context import ServerCallContext
from a2a.server.routes.common import DefaultServerCallContextBuilder
from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import RequestError
from ..providers.wellformed import has_lone_surrogate
from .cards import CARD_SUFFIX, PREFIX, card_json
from .handler import Call, CorralHandler


def who(request: Request) -> str:
    """Who decides through A2A: the API key's fingerprint (never the key), or anonymous."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return "key:" + hashlib.sha256(token.strip().encode()).hexdigest()[:12]
    return "anonymous"


class _Calls(DefaultServerCallContextBuilder):
    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        closure = request.state.a2a_closure
        context.state["corral"] = Call(service=request.app.state.service, ref=request.path_params["ref"],
                                       name=closure.agent.name, who=who(request))
        return context


def endpoint_url(request: Request, ref: str) -> str:
    return f"{str(request.base_url).rstrip('/')}{PREFIX}{ref}"


async def agent_card(request: Request) -> Response:
    """The agent card of a reference (version = the digest it serves)."""
    service = request.app.state.service
    ref = request.path_params["ref"]
    closure = await service.registry.resolve(ref)
    return JSONResponse(card_json(closure, endpoint_url(request, ref), secured=bool(service.settings.keys)))


_DISPATCHER = JsonRpcDispatcher(CorralHandler(), context_builder=_Calls(), enable_v0_3_compat=True)


async def jsonrpc(request: Request) -> Response:
    """A2A JSON-RPC: the 1.0 methods, and the 0.3 names (told apart by the `A2A-Version` header)."""
    registry = request.app.state.service.registry
    request.state.a2a_closure = await registry.resolve(request.path_params["ref"])  # unknown: 404
    try:
        body = await request.json()  # kept by the request: the dispatcher reads it again for free
    except ValueError:
        body = None  # not JSON: the dispatcher answers JSON-RPC's parse error
    if has_lone_surrogate(body):
        raise RequestError("the request holds a lone surrogate (U+D800 to U+DFFF)")
    return await _DISPATCHER.handle_requests(request)


routes = [
    Route(PREFIX + "{ref}" + CARD_SUFFIX, agent_card, methods=["GET"]),
    Route(PREFIX + "{ref}", jsonrpc, methods=["POST"]),
]
