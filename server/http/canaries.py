"""An alias's rules over HTTP (§12): `require_evals` and a canary, its promotion and its end.

`PUT /v1/agents/{name}/aliases/{alias}` (in `deployments`) takes
`require_evals` and `canary` {digest, weight} beside the digest; absent, each
is left as it was (`canary: null` ends it). `POST …/aliases/{alias}/promote`
moves the alias to its canary (gated like any move) and ends the canary;
`DELETE …/aliases/{alias}/canary` ends it. An alias's listing shows its
canary and, per side, the conversations created and their turns completed
and failed.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..clock import iso
from ..compiler.definitions import AgentDefinition
from ..errors import RequestError
from ..evals import gates
from ..store.evals import AliasRules


class Canary(BaseModel):
    model_config = ConfigDict(extra="forbid")
    digest: str = Field(min_length=1)
    weight: float = Field(ge=0, le=1)


def _service(request: Request):
    return request.app.state.service


async def moved_rules(service: Any, name: str, alias: str, body: Any, agent: AgentDefinition) -> AliasRules:
    """The alias's rules once `body` (a `SetAlias`) moves it to `agent`'s digest; raises `evals_required`
    when its (new or kept) `require_evals` refuses that digest."""
    rules = await service.store.get_alias_rules(name, alias)
    if body.require_evals is not None:
        rules = replace(rules, require_evals=body.require_evals)
    if rules.require_evals:
        await gates.require(service.evals, agent, f"alias {name}@{alias}")
    if "canary" in body.model_fields_set:
        canary = body.canary
        if canary is None:
            return replace(rules, canary_digest=None, canary_weight=None)
        served = await service.registry.resolve(f"{name}@{canary.digest}")  # 404 unless served
        rules = replace(rules, canary_digest=served.agent.digest, canary_weight=canary.weight)
    return rules


def canary_json(rules: AliasRules) -> dict[str, Any] | None:
    if rules.canary_digest is None:
        return None
    return {"digest": rules.canary_digest, "weight": rules.canary_weight}


async def alias_json(store: Any, name: str, alias: dict[str, Any]) -> dict[str, Any]:
    """One alias as its listing shows it: digest, rules, canary and each side's counts."""
    rules = await store.get_alias_rules(name, alias["alias"])
    counted = await store.canary_counts(name, alias["alias"])
    zero = {"conversations": 0, "turns_completed": 0, "turns_failed": 0}
    sides = {"stable": {"digest": alias["digest"], **counted.get(alias["digest"], zero)}}
    if rules.canary_digest is not None:
        sides["canary"] = {"digest": rules.canary_digest, **counted.get(rules.canary_digest, zero)}
    return {**alias, "updated_at": iso(alias["updated_at"]), "require_evals": rules.require_evals,
            "canary": canary_json(rules), "sides": sides}


async def promote(request: Request) -> Response:
    service = _service(request)
    name, alias = request.path_params["name"], request.path_params["alias"]
    rules = await service.store.get_alias_rules(name, alias)
    if rules.canary_digest is None:
        raise RequestError(f"alias {name}@{alias} has no canary to promote", code="conflict",
                           details={"agent": name, "alias": alias})
    closure = await service.registry.resolve(f"{name}@{rules.canary_digest}")
    if rules.require_evals:
        await gates.require(service.evals, closure.agent, f"alias {name}@{alias}")
    await service.store.set_alias(name, alias, closure.agent.digest, time.time())
    await service.store.set_alias_rules(name, alias, replace(rules, canary_digest=None, canary_weight=None))
    return JSONResponse({"agent": name, "alias": alias, "digest": closure.agent.digest,
                         "require_evals": rules.require_evals, "canary": None})


async def end_canary(request: Request) -> Response:
    service = _service(request)
    name, alias = request.path_params["name"], request.path_params["alias"]
    rules = await service.store.get_alias_rules(name, alias)
    if rules.canary_digest is None:
        raise RequestError(f"alias {name}@{alias} has no canary", code="not_found",
                           details={"agent": name, "alias": alias})
    await service.store.set_alias_rules(name, alias, replace(rules, canary_digest=None, canary_weight=None))
    return Response(status_code=204)


routes = [
    Route("/v1/agents/{name}/aliases/{alias}/promote", promote, methods=["POST"]),
    Route("/v1/agents/{name}/aliases/{alias}/canary", end_canary, methods=["DELETE"]),
]
