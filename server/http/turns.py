"""`GET /v1/conversations/{id}/turns/{turn_id}`: one turn, and how a client that does not stream
reads the result of a turn that waited on a person (`?wait=S` holds the answer until it ends)."""

from __future__ import annotations

import math
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import RequestError
from ..runtime import waits
from ..runtime.steps import steps_of
from .conversations import turn_json

MAX_WAIT_S = 60.0


def wait_param(raw: str | None) -> float | None:
    """`?wait=S`: seconds to hold the answer for a turn that has not ended, 0 < S <= 60."""
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_WAIT_S:  # NaN fails this too
        raise RequestError(f"wait must be a number of seconds above 0 and at most {MAX_WAIT_S:g}",
                           details={"wait": raw})
    return value


def view_json(view: waits.TurnView, steps: dict[str, Any]) -> dict[str, Any]:
    """The non-streaming result's shape (§8) with the turn list's fields; `permission_requests` while it
    waits; its `trace_id` and `steps` (§13)."""
    body = view.result.to_json() | turn_json(view.record)
    if view.requests is not None:
        body["permission_requests"] = [r.to_json() for r in view.requests]
    body.update(steps)
    return body


async def get_turn(request: Request) -> Response:
    wait_s = wait_param(request.query_params.get("wait"))
    service = request.app.state.service
    view = await waits.read(service.conversations, request.path_params["id"], request.path_params["turn_id"],
                            wait_s)
    return JSONResponse(view_json(view, await steps_of(service.store, view.record)))


routes = [Route("/v1/conversations/{id}/turns/{turn_id}", get_turn, methods=["GET"])]
