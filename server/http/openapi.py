"""`GET /openapi.json`: the OpenAPI 3.1 document of the HTTP API, generated from the app's routes.

Paths and methods come from the routes themselves (`document(app.routes)`),
so a route added to the app is in the document without a word here. What a
route cannot say about itself is declared in `DOCS`, keyed by its endpoint:
a summary, the pydantic model its body is validated with (the very model the
route uses, so the schema cannot drift from what is accepted), its query
parameters, its success status, and the error codes its own code can answer.
Every operation also lists the codes the guards in front of every route
answer (`guard_codes`); each code is shown at its status in
`errors.ERRORS`. A route missing from `DOCS` still appears, summarized by its
docstring, with only those.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from .. import __version__, a2a
from ..errors import ERRORS, TURN_FAILURES, forms
from . import (
    agents,
    canaries,
    closures,
    conversations,
    deployments,
    evals,
    health,
    openai_compat,
    permissions,
    turns,
)
from .browsers import BODY_METHODS
from .guards import OPEN_PATHS

JSON = "application/json"
SSE = "text/event-stream"
PAGE = (("limit", "integer"), ("cursor", "string"))
ERROR_REF = {"$ref": "#/components/schemas/Error"}
ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["code", "message"], "properties": {
        "code": {"$ref": "#/components/schemas/ErrorCode"}, "message": {"type": "string"}, "details": {},
        "request_id": {"type": "string"}}}},
}
# Answered in front of every route: a foreign Host or Origin, a body too large or too slow, a bug.
EVERY_ROUTE = ("forbidden", "host_not_allowed", "payload_too_large", "request_timeout", "internal")


@dataclass(frozen=True)
class Doc:
    """What the document says of one endpoint that its route cannot."""

    summary: str
    errors: tuple[str, ...] = ()
    body: type[BaseModel] | None = None
    query: tuple[tuple[str, str], ...] = ()
    status: int = 200
    media: str = JSON


STORE = ("storage_error",)
REF = ("invalid_request", "agent_not_found", "digest_not_found", *STORE)  # an agent reference resolved
IN_CONVERSATION = ("conversation_not_found", *STORE)
CURSORS = ("invalid_request", *IN_CONVERSATION)

DOCS: dict[Callable[..., Any] | type, Doc] = {
    health.healthz: Doc("Liveness", STORE),
    health.readyz: Doc("Readiness", STORE),
    health.metrics: Doc("Prometheus metrics", media="text/plain"),
    agents.list_agents: Doc("List agents", ("invalid_request",), query=PAGE),
    agents.get_agent: Doc("Read an agent (name, name@sha256:…, name@alias)", REF),
    agents.list_definitions: Doc("The set digest and every definition"),
    agents.get_definition: Doc("One definition's normalized spec", ("invalid_request", "not_found")),
    agents.list_models: Doc("OpenAI-compatible model list (the agents)"),
    closures.get_closure: Doc("An agent's closure at any digest it was served with: every definition's "
                              "spec, digest and source", REF),
    deployments.reload: Doc("Compile and swap now; the report", STORE),
    deployments.list_replicas: Doc("The replicas serving this state (heartbeat, set digest, turns)", STORE),
    deployments.history: Doc("Past swaps, newest first", ("invalid_request", *STORE), query=PAGE),
    deployments.server_events: Doc("Server-wide events (swaps, conversation status)", media=SSE),
    deployments.list_aliases: Doc("List an agent's aliases, each with its rules, its canary and, per side, "
                                  "the conversations created and their turns completed and failed", STORE),
    deployments.put_alias: Doc("Point an alias at a served digest (require_evals: only at one that "
                               "passed its agent's Evals; canary: a share of new conversations elsewhere)",
                               (*REF, "evals_required"), body=deployments.SetAlias),
    canaries.promote: Doc("Move an alias to its canary (gated like any move) and end the canary",
                          (*REF, "conflict", "evals_required")),
    canaries.end_canary: Doc("End an alias's canary", ("not_found", *STORE), status=204, media=""),
    deployments.delete_alias: Doc("Remove an alias", ("agent_not_found", *STORE), status=204, media=""),
    conversations.create_conversation: Doc("Create a conversation", REF,
                                           body=conversations.CreateConversation, status=201),
    conversations.list_conversations: Doc(
        "List conversations (archived ones only with archived=true)", ("invalid_request", *STORE),
        query=(*PAGE, ("agent", "string"), ("digest", "string"), ("status", "string"),
               ("archived", "boolean"))),
    conversations.get_conversation: Doc("Read a conversation", IN_CONVERSATION),
    conversations.update_conversation: Doc("Rename, replace the metadata, archive or unarchive",
                                           ("invalid_request", *IN_CONVERSATION),
                                           body=conversations.UpdateConversation),
    conversations.fork_conversation: Doc(
        "Fork: a new conversation with the transcript before a turn (or all of it), on an agent reference",
        (*REF, *IN_CONVERSATION, "turn_not_found"), body=conversations.ForkConversation, status=201),
    conversations.delete_conversation: Doc("Delete a conversation", ("conversation_busy", *IN_CONVERSATION),
                                           status=204, media=""),
    conversations.send_message: Doc(
        "Run a turn (JSON, or SSE with stream); with if_busy steer into a running turn, 202 {turn_id}; "
        "a turn that waits on a permission request answers at once, 202 with status waiting",
        (*REF, *IN_CONVERSATION, "conversation_busy", "idempotency_key_reused", "conflict", "overloaded",
         "prompt_blocked"), body=conversations.SendMessage),
    conversations.list_messages: Doc("The transcript", CURSORS, query=PAGE),
    conversations.list_turns: Doc("The turns", CURSORS, query=PAGE),
    turns.get_turn: Doc(
        "One turn: its result so far, permission requests while it waits; wait=S (0 < S <= 60) holds the "
        "answer until it ends", ("invalid_request", "turn_not_found", *IN_CONVERSATION),
        query=(("wait", "number"),)),
    conversations.conversation_events: Doc("The conversation's events (Last-Event-ID resumes)", CURSORS,
                                           query=(("after", "integer"),), media=SSE),
    conversations.interrupt: Doc("Cancel the running turn", (*IN_CONVERSATION, "overloaded")),
    conversations.get_context: Doc("What the next model request will carry: window, used (tokens), source "
                                   "(actual or estimated), threshold, compactions", (*REF, *IN_CONVERSATION)),
    conversations.compact: Doc("Compact the conversation's context now (a summary, or old tool results cut)",
                               (*REF, *IN_CONVERSATION, "conversation_busy", "model_error")),
    permissions.audit: Doc("Permission requests and decisions", IN_CONVERSATION),
    permissions.decide: Doc("Answer a permission request",
                            ("invalid_request", "not_found", "conflict", *IN_CONVERSATION),
                            body=permissions.Decision),
    openai_compat.chat_completions: Doc("OpenAI-compatible chat completions",
                                        (*REF, "overloaded", "cancelled", "permission_required",
                                         *TURN_FAILURES),
                                        body=openai_compat.ChatRequest),
    evals.list_evals: Doc("List Evals, each with its latest run on its agent's current digest", STORE),
    evals.start_run: Doc("Run an Eval on its agent's current digest, or on `agent` (any reference); 202 with "
                         "the run, running", ("not_found", *REF), body=evals.StartRun, status=202),
    evals.list_runs: Doc("An Eval's runs, newest first (agent=REF: on that digest)", ("not_found", *REF),
                         query=(("limit", "integer"), ("agent", "string"))),
    evals.get_run: Doc("One eval run; wait=S (0 < S <= 60) holds the answer until it ends",
                       ("invalid_request", "not_found", *STORE), query=(("wait", "number"),)),
    evals.agent_evals: Doc("For an agent digest: each of its Evals at its current digest, the latest run, "
                           "passed (true, false, or null when never run)", REF),
    # A2A answers its JSON-RPC errors in JSON-RPC (see `a2a.failures`); over HTTP, an unknown agent's 404.
    a2a.agent_card: Doc("The A2A agent card of an agent reference (version = its digest)", REF),
    a2a.jsonrpc: Doc("A2A JSON-RPC (1.0 methods, and the 0.3 names)", REF),
    # `/mcp` answers MCP's own errors in JSON-RPC (see `mcp.server`); over HTTP, only the guards'.
    StreamableHTTPASGIApp: Doc("MCP over streamable HTTP: JSON-RPC (POST), its stream (GET), session end "
                               "(DELETE)", media=""),
}


def guard_codes(path: str, method: str) -> tuple[str, ...]:
    """The codes answered in front of a route (guards.ApiKeys, browsers.BrowserGuard, guards.BodyLimit)."""
    codes = list(EVERY_ROUTE)
    if path not in OPEN_PATHS:
        codes.append("unauthorized")
    if method.upper() in BODY_METHODS:
        codes.append("unsupported_media_type")
    return tuple(codes)


def doc_of(endpoint: Any) -> Doc | None:
    """The declaration of an endpoint: a function, or an ASGI app instance by its class."""
    return DOCS.get(endpoint) or DOCS.get(type(endpoint))


def _error_response(codes: list[str]) -> dict[str, Any]:
    only = {"type": "object", "properties": {"error": {"type": "object", "properties": {
        "code": {"enum": codes}}}}}
    return {"description": ", ".join(codes),
            "content": {JSON: {"schema": {"allOf": [ERROR_REF, only]}}}}


def _responses(doc: Doc, codes: Iterable[str]) -> dict[str, Any]:
    success: dict[str, Any] = {"description": doc.summary}
    if doc.media:
        schema = {"type": "object"} if "json" in doc.media else {"type": "string"}
        success["content"] = {doc.media: {"schema": schema}}
    by_status: dict[int, list[str]] = {}
    for code in sorted(set(codes)):
        by_status.setdefault(forms(code).http, []).append(code)
    responses: dict[str, Any] = {str(doc.status): success}
    responses.update((str(status), _error_response(by_status[status])) for status in sorted(by_status))
    responses["default"] = {"description": "An error", "content": {JSON: {"schema": ERROR_REF}}}
    return responses


def _operation(method: str, path: str, doc: Doc, schemas: dict[str, Any]) -> dict[str, Any]:
    params = [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
              for name in re.findall(r"\{(\w+)\}", path)]
    params += [{"name": n, "in": "query", "required": False, "schema": {"type": t}} for n, t in doc.query]
    op: dict[str, Any] = {
        "summary": doc.summary,
        "operationId": f"{method}_{path.strip('/').replace('/', '_').replace('{', '').replace('}', '')}",
        "parameters": params,
        "responses": _responses(doc, (*doc.errors, *guard_codes(path, method))),
    }
    if doc.body is not None:
        schema = doc.body.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[doc.body.__name__] = schema
        op["requestBody"] = {"required": True, "content": {
            JSON: {"schema": {"$ref": f"#/components/schemas/{doc.body.__name__}"}}}}
    return op


def _undeclared(endpoint: Any) -> Doc:
    text = (getattr(endpoint, "__doc__", None) or "").strip()
    return Doc(text.splitlines()[0] if text else getattr(endpoint, "__name__", type(endpoint).__name__))


def document(routes: Iterable[BaseRoute]) -> dict[str, Any]:
    """The document of an app's `routes` (every app of this build has the same ones)."""
    schemas: dict[str, Any] = {"Error": ERROR, "ErrorCode": {"type": "string", "enum": sorted(ERRORS)}}
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        if not isinstance(route, Route):
            continue
        path = re.sub(r"\{(\w+):[^}]*\}", r"{\1}", route.path)  # `{id:int}` -> `{id}`
        doc = doc_of(route.endpoint) or _undeclared(route.endpoint)
        for method in sorted((route.methods or {"GET"}) - {"HEAD"}):
            paths.setdefault(path, {})[method.lower()] = _operation(method.lower(), path, doc, schemas)
    return {
        "openapi": "3.1.0",
        "info": {"title": "Corral", "version": __version__,
                 "description": "A declarative agent server. Errors share one envelope with a stable code; "
                                "each operation lists the codes it can answer, at their statuses."},
        "paths": paths,
        "components": {"schemas": schemas,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}, {}],
    }


async def openapi(request: Request) -> Response:
    cached = getattr(request.app.state, "openapi", None)
    if cached is None:  # the routes of an app never change: build its document once
        cached = request.app.state.openapi = document(request.app.routes)
    return JSONResponse(cached)


DOCS[openapi] = Doc("This document")
routes = [Route("/openapi.json", openapi)]
