"""Liveness, readiness and metrics: what a supervisor and a scraper read."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route


async def healthz(request: Request) -> Response:
    service = getattr(request.app.state, "service", None)
    if service is not None and service.failed is not None:
        return JSONResponse({"status": "failing", **service.failed.envelope()},
                            status_code=service.failed.http_status)
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    service = getattr(request.app.state, "service", None)
    if service is not None and service.failed is not None:
        return JSONResponse({"status": "failing", **service.failed.envelope()},
                            status_code=service.failed.http_status)
    if service is None or not service.ready or not service.conversations.accepting:
        return JSONResponse({"status": "not ready"}, status_code=503)
    digest = service.registry.current.digest
    return JSONResponse({"status": "ready", "replica": service.replica.id, "set_digest": digest,
                         "digest": digest})


async def metrics(request: Request) -> Response:
    body = request.app.state.service.metrics.render()
    return PlainTextResponse(body, media_type="text/plain; version=0.0.4; charset=utf-8")


routes = [
    Route("/healthz", healthz),
    Route("/readyz", readyz),
    Route("/metrics", metrics),
]
