"""Deployment routes: reload, swap history, the server-wide event stream, aliases, replicas."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..clock import iso
from ..deployment.registry import ALIAS, AgentNotFound
from ..errors import RequestError
from ..store.evals import AliasRules
from . import canaries
from .plumbing import KEEP_ALIVE, page, page_params, read_json, sse_frame, sse_response


class SetAlias(BaseModel):
    model_config = ConfigDict(extra="forbid")
    digest: str = Field(min_length=1)
    # from now on every move of the alias (this one too) needs passing evals (§12); absent: unchanged
    require_evals: bool | None = None
    # a share of new conversations on the alias goes to this digest (§12); absent: unchanged; null: none
    canary: canaries.Canary | None = None


def _service(request: Request):
    return request.app.state.service


async def reload(request: Request) -> Response:
    """Reload here and on every other replica; the report is this replica's."""
    return JSONResponse((await _service(request).replica.reload_everywhere("api")).to_json())


async def list_replicas(request: Request) -> Response:
    """Replicas heard from lately (ten lease periods); `alive` while their heartbeat is within a lease."""
    service = _service(request)
    lease_s, now = service.settings.lease_s, time.time()
    replicas = await service.replica.heard_from(now - 10 * lease_s)
    return JSONResponse({"items": [{
        "id": r.id, "started_at": iso(r.started_at), "heartbeat_at": iso(r.heartbeat_at),
        "set_digest": r.set_digest, "running_turns": r.running_turns,
        "alive": r.heartbeat_at >= now - lease_s,
        "self": r.id == service.replica.id,
    } for r in replicas], "next_cursor": None})


async def history(request: Request) -> Response:
    limit, cursor = page_params(request)
    swaps = await _service(request).swapper.history(limit=limit + 1, after=cursor)
    return JSONResponse(page(swaps, limit, lambda s: s["id"]))


async def server_events(request: Request) -> Response:
    service = _service(request)

    async def frames() -> AsyncIterator[bytes]:
        with service.hub.subscribe_global() as live:
            yield KEEP_ALIVE  # flush headers now: a client waiting for a swap is connected from here
            while True:
                try:
                    event = await live.next(15.0)
                except Exception:  # closed: shutdown, or this reader lagged far behind
                    return
                yield KEEP_ALIVE if event is None else sse_frame(event.name, event.data, event.seq)

    return sse_response(frames(), service.metrics)


async def put_alias(request: Request) -> Response:
    service = _service(request)
    name, alias = request.path_params["name"], request.path_params["alias"]
    if not ALIAS.match(alias) or alias.startswith("sha256"):
        raise RequestError("an alias is 1-63 of a-z 0-9 _ . - and does not start with sha256")
    body = await read_json(request, SetAlias)
    closure = await service.registry.resolve(f"{name}@{body.digest}")  # 404 unless served
    rules = await canaries.moved_rules(service, name, alias, body, closure.agent)
    if rules != await service.store.get_alias_rules(name, alias):
        await service.store.set_alias_rules(name, alias, rules)
    await service.store.set_alias(name, alias, closure.agent.digest, time.time())
    moved: dict[str, Any] = {"agent": name, "alias": alias, "digest": closure.agent.digest}
    # the rules are shown once an alias has some (the answer for a plain alias keeps its shape)
    if body.model_fields_set - {"digest"} or rules != AliasRules():
        moved |= {"require_evals": rules.require_evals, "canary": canaries.canary_json(rules)}
    return JSONResponse(moved)


async def list_aliases(request: Request) -> Response:
    name = request.path_params["name"]
    store = _service(request).store
    items = [await canaries.alias_json(store, name, a) for a in await store.list_aliases(name)]
    return JSONResponse({"items": items, "next_cursor": None})


async def delete_alias(request: Request) -> Response:
    name, alias = request.path_params["name"], request.path_params["alias"]
    store = _service(request).store
    if not await store.delete_alias(name, alias):
        raise AgentNotFound(f"agent {name!r} has no alias {alias!r}")
    rules = await store.get_alias_rules(name, alias)
    if rules.canary_digest is not None:  # a canary ends with its alias; `require_evals` stays with the name
        await store.set_alias_rules(name, alias, AliasRules(require_evals=rules.require_evals))
    return Response(status_code=204)


routes = [
    Route("/v1/definitions/reload", reload, methods=["POST"]),
    Route("/v1/definitions/history", history, methods=["GET"]),
    Route("/v1/replicas", list_replicas, methods=["GET"]),
    Route("/v1/events", server_events, methods=["GET"]),
    Route("/v1/agents/{name}/aliases", list_aliases, methods=["GET"]),
    Route("/v1/agents/{name}/aliases/{alias}", put_alias, methods=["PUT"]),
    Route("/v1/agents/{name}/aliases/{alias}", delete_alias, methods=["DELETE"]),
]
