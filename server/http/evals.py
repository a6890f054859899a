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


def eval_json(definition: EvalDefinition, latest: dict[str, Any] | None) -> dict[str, Any]:
    return {"name": definition.name, "description": definition.description, "digest": definition.digest,
            "agent": definition.agent, "cases": len(definition.cases), "threshold": definition.threshold,
            "repeat": definition.repeat, "latest_run": latest,
            "passed": passed(latest)}


def passed(run: dict[str, Any] | None) -> bool | None:
    """Whether a run passed; None when there is none, or it is still running."""
    return None if run is None or run["status"] == "running" else run["status"] == "passed"


async def list_evals(request: Request) -> Response:
    evals = _evals(request)
    current = evals.registry.current
    items = []
    for definition in sorted(current.evals(), key=lambda e: e.name):
        agent = current.get("Agent", definition.agent)
        latest = await evals.latest(definition, agent.digest) if agent is not None else None
        items.append(eval_json(definition, latest))
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
        items.append(eval_json(definition, await evals.latest(definition, agent.digest)))
    return JSONResponse({"agent": agent.name, "digest": agent.digest, "items": items, "next_cursor": None})


routes = [
    Route("/v1/evals", list_evals, methods=["GET"]),
    Route("/v1/evals/runs/{run_id}", get_run, methods=["GET"]),
    Route("/v1/evals/{name}/runs", start_run, methods=["POST"]),
    Route("/v1/evals/{name}/runs", list_runs, methods=["GET"]),
    Route("/v1/agents/{ref}/evals", agent_evals, methods=["GET"]),
]
