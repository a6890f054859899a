"""Eval routes (§12): the Evals, their runs, and an agent digest's results.

`GET /v1/evals` lists each Eval with its latest run on its agent's current
digest; `POST /v1/evals/{name}/runs` starts a run (202, `running`); `GET
/v1/evals/{name}/runs` lists runs newest first (`?agent=REF`); `GET
/v1/evals/runs/{run_id}` reads one (`?wait=S` holds the answer until it
ends); `GET /v1/agents/{ref}/evals` answers, for that agent digest, each of
its Evals at its current digest with the latest run and `passed`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..compiler.definitions import EvalDefinition
from ..evals.runs import EvalRuns
from .plumbing import page_params, read_json
from .turns import wait_param


class StartRun(BaseModel):
    model_config = ConfigDict(extra="forbid")
    agent: str | None = Field(default=None, min_length=1)


def _evals(request: Request) -> EvalRuns:
    evals = request.app.state.service.evals
    assert evals is not None
    return evals


async def eval_json(evals: EvalRuns, definition: EvalDefinition, agent_digest: str | None) -> dict[str, Any]:
    """An Eval with its latest run on `agent_digest` and `passed`: whether that digest passed it (a passing
    run, as the gates ask, even when a later run did not pass), null until a run of it ended."""
    latest = await evals.latest(definition, agent_digest) if agent_digest is not None else None
    passed = None
    if latest is not None and agent_digest is not None:
        found = latest if latest["status"] == "passed" else await evals.passing(
            definition.name, definition.digest, agent_digest)
        passed = True if found is not None else None if latest["status"] == "running" else False
    return {"name": definition.name, "description": definition.description, "digest": definition.digest,
            "agent": definition.agent, "cases": len(definition.cases), "threshold": definition.threshold,
            "repeat": definition.repeat, "latest_run": latest, "passed": passed}


async def list_evals(request: Request) -> Response:
    evals = _evals(request)
    current = evals.registry.current
    items = []
    for definition in sorted(current.evals(), key=lambda e: e.name):
        agent = current.get("Agent", definition.agent)
        items.append(await eval_json(evals, definition, agent.digest if agent is not None else None))
    return JSONResponse({"items": items, "next_cursor": None})


async def start_run(request: Request) -> Response:
    body = await read_json(request, StartRun) if await request.body() else StartRun()
    run = await _evals(request).start(request.path_params["name"], body.agent)
    return JSONResponse(run, status_code=202)


async def list_runs(request: Request) -> Response:
    limit, _ = page_params(request)
    evals = _evals(request)
    name = request.path_params["name"]
    evals.definition(name)  # 404 for an eval never defined here
    runs = await evals.runs(name, request.query_params.get("agent"), limit)
    return JSONResponse({"items": runs, "next_cursor": None})


async def get_run(request: Request) -> Response:
    wait_s = wait_param(request.query_params.get("wait"))
    return JSONResponse(await _evals(request).get(request.path_params["run_id"], wait_s or 0.0))


async def agent_evals(request: Request) -> Response:
    evals = _evals(request)
    closure = await evals.registry.resolve(request.path_params["ref"])
    agent = closure.agent
    items = []
    for definition in sorted(evals.registry.current.evals(agent.name), key=lambda e: e.name):
        items.append(await eval_json(evals, definition, agent.digest))
    return JSONResponse({"agent": agent.name, "digest": agent.digest, "items": items, "next_cursor": None})


routes = [
    Route("/v1/evals", list_evals, methods=["GET"]),
    Route("/v1/evals/runs/{run_id}", get_run, methods=["GET"]),
    Route("/v1/evals/{name}/runs", start_run, methods=["POST"]),
    Route("/v1/evals/{name}/runs", list_runs, methods=["GET"]),
    Route("/v1/agents/{ref}/evals", agent_evals, methods=["GET"]),
]
