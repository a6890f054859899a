"""The Starlette application: routes, guards, error handlers, and the service lifespan."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware

from .. import a2a
from ..errors import CorralError
from ..mcp.mount import mcp_route
from ..mcp.server import AgentsMCP
from ..service import open_service
from ..settings import Settings
from ..tracing import InboundTrace
from . import (
    agents,
    canaries,
    closures,
    console,
    conversations,
    deployments,
    evals,
    health,
    openai_compat,
    openapi,
    permissions,
    turns,
)
from .browsers import CORS_EXPOSED, CORS_HEADERS, BrowserGuard
from .guards import ApiKeys, BodyLimit, RequestIds
from .plumbing import corral_error_handler, http_error_handler, internal_error_handler


def create_app(settings: Settings) -> Starlette:
    agents_mcp = AgentsMCP()
    # creates the session manager the lifespan runs; stateless where replicas share the store
    mcp = mcp_route(agents_mcp, stateless=settings.replicated)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with open_service(settings) as service:
            agents_mcp.service = service
            service.swapper.listeners.append(agents_mcp.on_swap)
            app.state.service = service
            app.state.started_at = time.time()
            async with agents_mcp.server.session_manager.run():
                yield

    routes = [
        *health.routes,
        *deployments.routes,
        *canaries.routes,
        *agents.routes,
        *closures.routes,
        *conversations.routes,
        *turns.routes,
        *evals.routes,
        *permissions.routes,
        *openapi.routes,
        *openai_compat.routes,
        *console.routes,
        *a2a.routes,
        mcp,
    ]
    return Starlette(
        routes=routes,
        middleware=_middleware(settings),
        lifespan=lifespan,
        exception_handlers={CorralError: corral_error_handler, HTTPException: http_error_handler,
                            Exception: internal_error_handler},
    )


def _middleware(settings: Settings) -> list[Middleware]:
    """Outermost first: every response gets a request id; browsers are checked before keys, and a
    CORS preflight (which carries no key) is answered before the key check."""
    middleware = [
        Middleware(RequestIds),
        Middleware(BrowserGuard, bind_host=settings.host, allowed_hosts=settings.hosts,
                   cors_origins=settings.origins),
    ]
    if settings.origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=list(settings.origins),
                                     allow_methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
                                     allow_headers=list(CORS_HEADERS), expose_headers=list(CORS_EXPOSED),
                                     max_age=600))
    return [*middleware,
            Middleware(ApiKeys, keys=settings.keys,
                       also_open=a2a.is_card_path if settings.a2a_public_cards else None),
            Middleware(BodyLimit, limit=settings.max_body_bytes, timeout_s=settings.body_timeout_s),
            Middleware(InboundTrace)]  # a request's `traceparent`: the turns it starts are its children
