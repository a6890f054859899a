"""Corral's agents as an MCP server (the official SDK's low-level `Server`).

Each agent is a tool named after it, input `{"message", "conversation_id"?,
"agent"?}` (`agent` pins a digest or alias: `support@sha256:…`,
`support@prod`); the result's text is the answer and its structured content
`{conversation_id, turn_id, digest}` lets a client continue (and, for an
agent with an `output_schema`, `structured` holds the answer's parsed JSON
value; `context` says how full the conversation's context window is, as
`GET …/context` does). Progress flows
while the turn runs; a client's cancellation cancels the turn. Definitions
are resources (`corral://definitions/{kind}/{name}`), skills are prompts.

The tool list is computed per request from the registry, so a swap needs no
re-registration: `notify_changed` tells connected clients of both protocol
eras (modern ones through the subscription bus, handshake-era sessions
through their standalone stream; see the SDK notes §4.3).

Every failure is answered in its MCP form from `errors.ERRORS`: a tool
result with `isError`, its text `[code] message` (and the details), or, for
an unknown tool, resource or prompt, a JSON-RPC `invalid params` error whose
data is the error envelope; never a protocol-level crash.
"""

from __future__ import annotations

import contextlib
import json
import logging
import warnings
import weakref
from typing import Any

import anyio
import mcp.types as types
import yaml
from mcp.server import NotificationOptions, Server, ServerRequestContext
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    ListenHandler,
    PromptsListChanged,
    ResourcesListChanged,
    ToolsListChanged,
)
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from .. import __version__, tracing
from ..canonical import thaw
from ..compiler import schemas
from ..compiler.definitions import PATH_KINDS, AgentDefinition, SkillDefinition
from ..deployment.reports import SwapReport
from ..errors import TOOL_RESULT, CorralError, envelope, forms
from ..providers.wellformed import has_lone_surrogate
from ..runtime.active_turn import ActiveTurn
from ..runtime.steering import Steered
from ..runtime.structured import MISSING
from ..service import Service
from ..store.base import ConversationRecord
from ..turn_events import MessageDelta, PermissionRequested, ToolFinished, ToolStarted, TurnEvent

log = logging.getLogger("corral.mcp")
URI_PREFIX = "corral://definitions/"
INPUT_SCHEMA = {
    "type": "object",
    "properties": {
        "message": {"type": "string", "minLength": 1, "description": "What to say to the agent."},
        "conversation_id": {"type": "string", "description": "Continue this conversation."},
        "agent": {"type": "string",
                  "description": "Pin a version: NAME@sha256:<digest> or NAME@<alias>."},
    },
    "required": ["message"],
    "additionalProperties": False,
}
OUTPUT_SCHEMA = {
    "type": "object",
    "properties": {"conversation_id": {"type": "string"}, "turn_id": {"type": "string"},
                   "digest": {"type": "string"}, "status": {"type": "string"},
                   "structured": {"description": "The answer's JSON value (agents with an output_schema)."},
                   "context": {"type": "object", "description": "How full the conversation's context is: "
                               "window, used, source, threshold, compactions (GET …/context)."}},
    "required": ["conversation_id", "turn_id", "digest"],
}
_validator = schemas.validator(INPUT_SCHEMA)
_LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "notice": logging.INFO,
               "warning": logging.WARNING, "error": logging.ERROR, "critical": logging.CRITICAL,
               "alert": logging.CRITICAL, "emergency": logging.CRITICAL}


def describe(agent: AgentDefinition) -> str:
    return agent.description or f"Talk to the Corral agent {agent.name!r} (model {agent.model})."


class _AgentServer(Server):
    """Advertises listChanged to handshake-era clients, which the HTTP manager does not by default."""

    def create_initialization_options(self, notification_options=None, experimental_capabilities=None,
                                      extensions=None):
        options = notification_options or NotificationOptions(
            tools_changed=True, prompts_changed=True, resources_changed=True)
        return super().create_initialization_options(options, experimental_capabilities, extensions)


class AgentsMCP:
    def __init__(self, service: Service | None = None):
        self.service: Service = service  # type: ignore[assignment]  # set by the host's lifespan
        self.bus = InMemorySubscriptionBus()
        self._legacy: weakref.WeakSet[Any] = weakref.WeakSet()
        with warnings.catch_warnings():
            # The contract asks for logging/setLevel; the 2026-07-28 era deprecates it, and says so.
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            self.server = self._build()
        self.server.middleware.append(self._track_legacy)

    def _build(self) -> Server:
        return _AgentServer(
            "corral", version=__version__,
            instructions="Each tool is a Corral agent. Pass conversation_id from a result to continue.",
            on_list_tools=self.list_tools, on_call_tool=self.call_tool,
            on_list_resources=self.list_resources, on_read_resource=self.read_resource,
            on_list_resource_templates=self.list_templates,
            on_list_prompts=self.list_prompts, on_get_prompt=self.get_prompt,
            on_completion=self.complete, on_set_logging_level=self.set_level,
            on_subscriptions_listen=ListenHandler(self.bus),
            get_tool_input_schema=self.input_schema,
        )

    def input_schema(self, name: str) -> dict[str, Any] | None:
        """The input schema `tools/list` advertises for `name` (None: not listed), for the SDK's check of
        `Mcp-Param-*` headers; without it the SDK runs a whole `tools/list` on every `tools/call`."""
        if self.service is None or self.service.registry.current.get("Agent", name) is None:
            return None
        return INPUT_SCHEMA

    # --- change notifications ----------------------------------------------

    async def _track_legacy(self, ctx: Any, call_next: Any) -> Any:
        connection = getattr(ctx.session, "_connection", None)  # private in 2.3; see the SDK notes §4.3
        if (connection is not None and getattr(connection, "protocol_version", None) in
                HANDSHAKE_PROTOCOL_VERSIONS and getattr(connection, "has_standalone_channel", False)):
            self._legacy.add(connection)
        return await call_next(ctx)

    async def on_swap(self, report: SwapReport) -> None:
        if report.changes:
            await self.notify_changed()

    async def notify_changed(self) -> None:
        """Tell every connected client that tools, resources and prompts may have changed."""
        for event in (ToolsListChanged(), ResourcesListChanged(), PromptsListChanged()):
            await self.bus.publish(event)
        for connection in list(self._legacy):
            for method in ("notifications/tools/list_changed", "notifications/resources/list_changed",
                           "notifications/prompts/list_changed"):
                try:
                    await connection.notify(method, None)
                except Exception:  # a closed session: nothing to tell
                    self._legacy.discard(connection)

    # --- tools ---------------------------------------------------------------

    async def list_tools(self, ctx: ServerRequestContext, params: Any) -> types.ListToolsResult:
        agents = sorted(self.service.registry.current.agents(), key=lambda a: a.name)
        return types.ListToolsResult(tools=[
            types.Tool(name=a.name, description=describe(a), input_schema=INPUT_SCHEMA,
                       output_schema=OUTPUT_SCHEMA) for a in agents
        ])

    async def call_tool(self, ctx: ServerRequestContext, params: types.CallToolRequestParams) -> Any:
        arguments = params.arguments or {}
        pinned = isinstance(arguments.get("agent"), str)  # a removed agent stays callable by its pin
        if self.service.registry.current.get("Agent", params.name) is None and not pinned:
            raise _protocol_error("not_found", f"Unknown tool: {params.name}")
        if has_lone_surrogate(arguments):  # the modern transport's json.loads lets one through
            return _tool_error("invalid_request", "the arguments hold a lone surrogate (U+D800 to U+DFFF)")
        problems = list(_validator.iter_errors(arguments))
        if problems:
            return _tool_error("invalid_request", "; ".join(p.message for p in problems[:3]))
        try:
            return await self._run(ctx, params.name, arguments)
        except Steered as steered:  # the agent's `on_busy: steer`, and a turn was running
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=f"The message was added to the running turn "
                                                               f"{steered.turn_id}.")],
                structured_content={"conversation_id": steered.conversation_id, "turn_id": steered.turn_id,
                                    "digest": steered.digest, "status": "steered"})
        except CorralError as exc:
            return _tool_error(exc.code, exc.message, details=exc.details)
        except Exception:
            log.exception("MCP call to %s failed", params.name)
            return _tool_error("internal", "internal error")

    async def _run(self, ctx: ServerRequestContext, name: str, arguments: dict[str, Any]) -> Any:
        conversations = self.service.conversations
        ref = arguments.get("agent") or name
        if ref.partition("@")[0] != name:
            return _tool_error("invalid_request", f"`agent` must pin {name}, e.g. {name}@sha256:…")
        if arguments.get("conversation_id"):
            conversation = await conversations.get(arguments["conversation_id"])
            if conversation.agent_name != name:
                owner = conversation.agent_name
                return _tool_error("invalid_request", f"conversation {conversation.id} belongs to {owner}")
        else:
            conversation = await conversations.create(ref, None, {"source": "mcp"})
        with tracing.adopted(tracing.context_from_meta(ctx.meta)):  # a `traceparent` in `_meta`
            turn = await conversations.send(conversation.id, arguments["message"])
        try:
            if ctx.meta and ctx.meta.get("progress_token") is not None:
                asked = await self._progress(ctx, conversation.id, turn)
            else:  # no progress wanted: no need to follow the turn's events
                await turn.attention.wait()
                asked = turn.asked if not turn.done.is_set() else None
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):  # the client gave up: so does the turn
                turn.cancel()
            raise
        if asked is not None:
            return _tool_error("permission_required", (
                f"{name} wants to call {asked.tool} and needs a person's approval: POST "
                f"/v1/conversations/{conversation.id}/permissions/{asked.request_id} with "
                '{"decision": "allow"} (or "deny"); the turn then goes on, and its answer appears in '
                f"GET /v1/conversations/{conversation.id}/messages"),
                {"conversation_id": conversation.id, "turn_id": turn.id,
                 "digest": turn.record.digest, "status": "waiting"})
        result = await conversations.result(turn)
        structured = {"conversation_id": conversation.id, "turn_id": result.turn_id,
                      "digest": result.digest, "status": result.status}
        structured.update(await self._context(conversation))
        if not result.completed:
            error = result.failure()
            return _tool_error(error["code"], error["message"], structured, details=error.get("details"))
        if result.structured is not MISSING:
            structured["structured"] = result.structured
        return types.CallToolResult(content=[types.TextContent(type="text", text=result.output or "")],
                                    structured_content=structured)

    async def _context(self, conversation: ConversationRecord) -> dict[str, Any]:
        """`{"context": …}`: how full the conversation's context is; nothing when that cannot be said
        (its agent is gone from the definitions, the store failed)."""
        with contextlib.suppress(CorralError):
            return {"context": await self.service.conversations.context(conversation.id, conversation)}
        return {}

    async def _progress(self, ctx: ServerRequestContext, conversation_id: str,
                        turn: ActiveTurn) -> PermissionRequested | None:
        """Relay progress until the turn ends; returns a permission request if it stops to ask."""
        step = 0
        events = self.service.conversations.events(conversation_id, after=turn.started_seq - 1,
                                                   until_turn=turn.id)
        async for record in events:
            event = record.event if record is not None else None
            if isinstance(event, PermissionRequested):
                return event
            message = _progress_message(event)
            if message is None:
                continue
            step += 1
            await ctx.session.report_progress(step, None, message)
        return None

    # --- resources and prompts -------------------------------------------------

    async def list_resources(self, ctx: ServerRequestContext, params: Any) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[
            types.Resource(uri=URI_PREFIX + d.ref, name=d.ref, mime_type="application/yaml",
                           description=d.description or f"The {d.kind} definition {d.name!r}.")
            for d in self.service.registry.current
        ])

    async def list_templates(self, ctx: ServerRequestContext,
                             params: Any) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=[types.ResourceTemplate(
            uri_template=URI_PREFIX + "{kind}/{name}", name="definition", mime_type="application/yaml",
            description="A Corral definition: its normalized spec and digest, as YAML.")])

    async def read_resource(self, ctx: ServerRequestContext,
                            params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        uri = str(params.uri)
        kind_path, _, name = uri.removeprefix(URI_PREFIX).partition("/")
        definition = None
        if uri.startswith(URI_PREFIX) and kind_path in PATH_KINDS:
            definition = self.service.registry.current.get(PATH_KINDS[kind_path], name)
        if definition is None:
            raise _protocol_error("not_found", f"unknown resource {uri}")
        text = f"# digest: {definition.digest}\n" + yaml.safe_dump(thaw(definition.spec), sort_keys=False)
        return types.ReadResourceResult(contents=[
            types.TextResourceContents(uri=uri, text=text, mime_type="application/yaml")])

    def _skills(self) -> list[SkillDefinition]:
        return sorted(self.service.registry.current.of_kind("Skill"), key=lambda s: s.name)  # type: ignore

    async def list_prompts(self, ctx: ServerRequestContext, params: Any) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=[
            types.Prompt(name=s.name, description=s.description or f"The {s.name} skill.",
                         arguments=[types.PromptArgument(name="task", description="What to apply it to.",
                                                         required=False)])
            for s in self._skills()
        ])

    async def get_prompt(self, ctx: ServerRequestContext,
                         params: types.GetPromptRequestParams) -> types.GetPromptResult:
        skill = self.service.registry.current.get("Skill", params.name)
        if not isinstance(skill, SkillDefinition):
            raise _protocol_error("not_found", f"unknown prompt {params.name}")
        task = (params.arguments or {}).get("task")
        text = skill.instructions + (f"\n\nTask: {task}" if task else "")
        return types.GetPromptResult(description=skill.description, messages=[
            types.PromptMessage(role="user", content=types.TextContent(type="text", text=text))])

    async def complete(self, ctx: ServerRequestContext,
                       params: types.CompleteRequestParams) -> types.CompleteResult:
        prefix, values = params.argument.value, []
        if isinstance(params.ref, types.ResourceTemplateReference):
            if params.argument.name == "kind":
                values = sorted(PATH_KINDS)
            elif params.argument.name == "name":
                kind = PATH_KINDS.get(((params.context and params.context.arguments) or {}).get("kind", ""))
                values = sorted({d.name for d in self.service.registry.current if kind in (None, d.kind)})
        matches = [v for v in values if v.startswith(prefix)]
        return types.CompleteResult(completion=types.Completion(
            values=matches[:100], total=len(matches), has_more=len(matches) > 100))

    async def set_level(self, ctx: ServerRequestContext, params: types.SetLevelRequestParams) -> Any:
        logging.getLogger("corral").setLevel(_LOG_LEVELS.get(params.level, logging.INFO))
        return types.EmptyResult()


def _progress_message(event: TurnEvent | None) -> str | None:
    """What a progress notification says of an event (None: nothing, for the events it does not relay)."""
    match event:
        case ToolStarted(tool=tool):
            return f"calling {tool}"
        case ToolFinished(tool=tool):
            return f"{tool} done"
        case MessageDelta():
            return "writing"
    return None


def _tool_error(code: str, message: str, structured: dict[str, Any] | None = None, *,
                details: Any = None) -> types.CallToolResult:
    """An error as a tool result: `[code] message`, then the details as JSON; a result that names its turn
    also carries the envelope in its structured content. A code whose MCP form is a JSON-RPC error
    (`errors.ERRORS`) is raised as that error instead."""
    if forms(code).mcp != TOOL_RESULT:
        raise _protocol_error(code, message, details)
    text = f"[{code}] {message}"
    if details is not None:
        text += "\n" + json.dumps(details, ensure_ascii=False, default=str)
    with_turn = structured is not None and "turn_id" in structured  # else the output schema is not met
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], is_error=True,
        structured_content={**structured, **envelope(code, message, details)} if with_turn else None,
    )


def _protocol_error(code: str, message: str, details: Any = None) -> MCPError:
    """The JSON-RPC error of a code whose MCP form (`errors.ERRORS`) is one; its data is the envelope."""
    form = forms(code).mcp
    assert isinstance(form, int), f"{code} is answered as a tool result, not a JSON-RPC error"
    return MCPError(code=form, message=message, data=envelope(code, message, details)["error"])
