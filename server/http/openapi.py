"""`GET /openapi.json`: the OpenAPI 3.1 document of the HTTP API.

Built from one table of operations; request bodies come from the same
pydantic models the routes validate with, so the document cannot drift from
what the server accepts.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .. import __version__
from .conversations import CreateConversation, SendMessage
from .deployments import SetAlias
from .openai_compat import ChatRequest
from .permissions import Decision

ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["code", "message"], "properties": {
        "code": {"type": "string"}, "message": {"type": "string"}, "details": {},
        "request_id": {"type": "string"}}}},
}
PAGE = [("limit", "integer"), ("cursor", "string")]
SSE = "text/event-stream"

# method, path, summary, body model, query parameters, success status, success media type
OPERATIONS: list[tuple[str, str, str, type[BaseModel] | None, list[tuple[str, str]], int, str]] = [
    ("get", "/healthz", "Liveness", None, [], 200, "application/json"),
    ("get", "/readyz", "Readiness", None, [], 200, "application/json"),
    ("get", "/metrics", "Prometheus metrics", None, [], 200, "text/plain"),
    ("get", "/openapi.json", "This document", None, [], 200, "application/json"),
    ("get", "/v1/agents", "List agents", None, PAGE, 200, "application/json"),
    ("get", "/v1/agents/{name}", "Read an agent (name, name@sha256:…, name@alias)", None, [], 200,
     "application/json"),
    ("get", "/v1/agents/{name}/aliases", "List an agent's aliases", None, [], 200, "application/json"),
    ("put", "/v1/agents/{name}/aliases/{alias}", "Point an alias at a served digest", SetAlias, [], 200,
     "application/json"),
    ("delete", "/v1/agents/{name}/aliases/{alias}", "Remove an alias", None, [], 204, ""),
    ("get", "/v1/definitions", "The set digest and every definition", None, [], 200, "application/json"),
    ("get", "/v1/definitions/{kind}/{name}", "One definition's normalized spec", None, [], 200,
     "application/json"),
    ("post", "/v1/definitions/reload", "Compile and swap now; the report", None, [], 200, "application/json"),
    ("get", "/v1/definitions/history", "Past swaps, newest first", None, PAGE, 200, "application/json"),
    ("get", "/v1/events", "Server-wide events (swaps, conversation status)", None, [], 200, SSE),
    ("post", "/v1/conversations", "Create a conversation", CreateConversation, [], 201, "application/json"),
    ("get", "/v1/conversations", "List conversations", None,
     [*PAGE, ("agent", "string"), ("digest", "string"), ("status", "string")], 200, "application/json"),
    ("get", "/v1/conversations/{id}", "Read a conversation", None, [], 200, "application/json"),
    ("delete", "/v1/conversations/{id}", "Delete a conversation", None, [], 204, ""),
    ("post", "/v1/conversations/{id}/messages", "Run a turn (JSON, or SSE with stream)", SendMessage, [], 200,
     "application/json"),
    ("get", "/v1/conversations/{id}/messages", "The transcript", None, PAGE, 200, "application/json"),
    ("get", "/v1/conversations/{id}/turns", "The turns", None, PAGE, 200, "application/json"),
    ("get", "/v1/conversations/{id}/events", "The conversation's events (Last-Event-ID resumes)", None, [],
     200, SSE),
    ("post", "/v1/conversations/{id}/interrupt", "Cancel the running turn", None, [], 200,
     "application/json"),
    ("get", "/v1/conversations/{id}/permissions", "Permission requests and decisions", None, [], 200,
     "application/json"),
    ("post", "/v1/conversations/{id}/permissions/{request_id}", "Answer a permission request", Decision, [],
     200, "application/json"),
    ("post", "/v1/chat/completions", "OpenAI-compatible chat completions", ChatRequest, [], 200,
     "application/json"),
    ("get", "/v1/models", "OpenAI-compatible model list (the agents)", None, [], 200, "application/json"),
]


def _operation(method: str, path: str, summary: str, body: type[BaseModel] | None,
               query: list[tuple[str, str]], status: int, media: str, schemas: dict[str, Any]) -> dict:
    params = [{"name": p.strip("{}"), "in": "path", "required": True, "schema": {"type": "string"}}
              for p in path.split("/") if p.startswith("{")]
    params += [{"name": n, "in": "query", "required": False, "schema": {"type": t}} for n, t in query]
    success: dict[str, Any] = {"description": summary}
    if media:
        schema = {"type": "object"} if "json" in media else {"type": "string"}
        success["content"] = {media: {"schema": schema}}
    op: dict[str, Any] = {
        "summary": summary,
        "operationId": f"{method}_{path.strip('/').replace('/', '_').replace('{', '').replace('}', '')}",
        "parameters": params,
        "responses": {str(status): success, "default": {"description": "An error", "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}},
    }
    if body is not None:
        schema = body.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[body.__name__] = schema
        op["requestBody"] = {"required": True, "content": {
            "application/json": {"schema": {"$ref": f"#/components/schemas/{body.__name__}"}}}}
    return op


def document() -> dict[str, Any]:
    schemas: dict[str, Any] = {"Error": ERROR}
    paths: dict[str, dict[str, Any]] = {}
    for method, path, summary, body, query, status, media in OPERATIONS:
        paths.setdefault(path, {})[method] = _operation(method, path, summary, body, query, status, media,
                                                        schemas)
    return {
        "openapi": "3.1.0",
        "info": {"title": "Corral", "version": __version__,
                 "description": "A declarative agent server. Errors share one envelope with a stable code."},
        "paths": paths,
        "components": {"schemas": schemas,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}, {}],
    }


async def openapi(request: Request) -> Response:
    return JSONResponse(document())


routes = [Route("/openapi.json", openapi)]
