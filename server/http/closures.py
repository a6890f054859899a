"""`GET /v1/agents/{name}/closure`: an agent's closure at any digest it was served with, spec by spec.

`GET /v1/definitions/{kind}/{name}` reads the set being served now; this
reads what a reference (`name`, `name@sha256:…`, `name@alias`) resolves to,
whenever it was served (restarts included, from the stored specs), so a
client can compare two digests of an agent spec against spec, members
included: the console's diff does. Specs hold `${ENV}` references, never
their values, as everywhere else.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ..canonical import thaw
from ..compiler.definitions import Definition


def definition_json(d: Definition) -> dict[str, Any]:
    """One definition as `GET /v1/definitions/{kind}/{name}` shows it (a stored one has no source)."""
    source = {"file": d.source.file, "line": d.source.line} if d.source else None
    return {"kind": d.kind, "name": d.name, "digest": d.digest, "spec": thaw(d.spec), "source": source}


async def get_closure(request: Request) -> JSONResponse:
    closure = await request.app.state.service.registry.resolve(request.path_params["name"])
    agent = closure.agent
    members = sorted((d for d in closure.members.values() if d is not agent), key=lambda d: (d.kind, d.name))
    return JSONResponse({"agent": agent.name, "digest": agent.digest,
                         "definitions": [definition_json(d) for d in (agent, *members)]})


routes = [Route("/v1/agents/{name}/closure", get_closure, methods=["GET"])]
