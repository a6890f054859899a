"""Answering tool calls that wait on `ask`, and reading the audit trail."""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..clock import iso
from ..store.base import PermissionRecord
from .plumbing import read_json


class Decision(BaseModel):
    model_config = ConfigDict(extra="forbid")
    decision: Literal["allow", "deny"]


def who(request: Request) -> str:
    """Who decided: the API key's fingerprint (never the key), or anonymous."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return "key:" + hashlib.sha256(token.strip().encode()).hexdigest()[:12]
    return "anonymous"


def permission_json(record: PermissionRecord) -> dict[str, Any]:
    return {
        "request_id": record.id, "conversation_id": record.conversation_id, "turn_id": record.turn_id,
        "tool_call_id": record.tool_call_id, "name": record.tool, "arguments": record.arguments,
        "reason": record.reason, "status": record.status, "requested_at": iso(record.requested_at),
        "expires_at": iso(record.expires_at), "decided_by": record.decided_by,
        "decided_at": iso(record.decided_at),
    }


async def decide(request: Request) -> Response:
    service = request.app.state.service
    conversation = await service.conversations.get(request.path_params["id"])
    body = await read_json(request, Decision)
    record = await service.permissions.decide(conversation.id, request.path_params["request_id"],
                                              body.decision == "allow", who(request))
    return JSONResponse(permission_json(record))


async def audit(request: Request) -> Response:
    service = request.app.state.service
    conversation = await service.conversations.get(request.path_params["id"])
    records = await service.records.permissions(conversation.id)
    return JSONResponse({"items": [permission_json(r) for r in records], "next_cursor": None})


routes = [
    Route("/v1/conversations/{id}/permissions/{request_id}", decide, methods=["POST"]),
    Route("/v1/conversations/{id}/permissions", audit, methods=["GET"]),
]
