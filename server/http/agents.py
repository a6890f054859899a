"""Read routes over the definitions being served: agents, definitions, models."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ..canonical import thaw
from ..compiler.definitions import PATH_KINDS, AgentDefinition, Definition
from ..errors import RequestError
from .plumbing import page, page_params


def _service(request: Request):
    return request.app.state.service


def agent_json(agent: AgentDefinition) -> dict[str, Any]:
    return {
        "name": agent.name,
        "description": agent.description,
        "digest": agent.digest,
        "model": agent.model,
        "tools": list(agent.tools),
        "agents": list(agent.agents),
        "skills": list(agent.skills),
        "hooks": list(agent.hooks),
        "on_busy": agent.on_busy,
        "max_steps": agent.max_steps,
        "source": _source(agent),
    }


def _source(d: Definition) -> dict[str, Any] | None:
    return {"file": d.source.file, "line": d.source.line} if d.source else None


async def list_agents(request: Request) -> JSONResponse:
    limit, cursor = page_params(request)
    agents = sorted(_service(request).registry.current.agents(), key=lambda a: a.name)
    if cursor:
        agents = [a for a in agents if a.name > cursor]
    return JSONResponse(page([agent_json(a) for a in agents[: limit + 1]], limit, lambda a: a["name"]))


async def get_agent(request: Request) -> JSONResponse:
    closure = await _service(request).registry.resolve(request.path_params["name"])
    return JSONResponse(agent_json(closure.agent))


async def list_definitions(request: Request) -> JSONResponse:
    return JSONResponse(_service(request).registry.current.listing())


async def get_definition(request: Request) -> JSONResponse:
    kind_path, name = request.path_params["kind"], request.path_params["name"]
    kind = PATH_KINDS.get(kind_path)
    if kind is None:
        raise RequestError(f"unknown kind {kind_path!r}; one of {', '.join(sorted(PATH_KINDS))}")
    definition = _service(request).registry.current.get(kind, name)
    if definition is None:
        raise RequestError(f"no {kind} named {name!r}", code="not_found")
    return JSONResponse({
        "kind": definition.kind, "name": definition.name, "digest": definition.digest,
        "spec": thaw(definition.spec), "source": _source(definition),
    })


async def list_models(request: Request) -> JSONResponse:
    """OpenAI's shape: each agent is a model a chat-completions client can name."""
    created = int(request.app.state.started_at)
    data = [{"id": a.name, "object": "model", "created": created, "owned_by": "corral"}
            for a in sorted(_service(request).registry.current.agents(), key=lambda a: a.name)]
    return JSONResponse({"object": "list", "data": data})


routes = [
    Route("/v1/agents", list_agents),
    Route("/v1/agents/{name}", get_agent),
    Route("/v1/definitions", list_definitions),
    Route("/v1/definitions/{kind}/{name}", get_definition),
    Route("/v1/models", list_models),
]
