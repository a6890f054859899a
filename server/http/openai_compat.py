"""`POST /v1/chat/completions`: any OpenAI client can talk to a Corral agent.

`model` names an agent (`name`, `name@sha256:…`). Each request is one turn
of a new conversation whose earlier messages are the request's history; the
conversation is kept (metadata `source: openai`) so it is auditable like any
other. System messages are ignored: the agent's own instructions apply. The
agent's tool calls happen inside the turn and are not surfaced as OpenAI
tool calls.

`response_format` is honoured: `{"type": "json_schema", "json_schema":
{"schema", "name"?, "strict"?}}` makes the answer JSON valid against that
schema for this turn (instead of the agent's `output_schema`), `{"type":
"json_object"}` any JSON object; the model is asked to repair an invalid
answer, then the request fails with `output_invalid`. OpenAI-compatible
upstream models get it natively. A streamed turn with a schema sends its
answer whole when it is valid, not the deltas of attempts that were not.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, ConfigDict, Field, StrictBool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..compiler.schemas import check_schema
from ..errors import CorralError, RequestError
from ..messages import AssistantMessage, Message, UserMessage
from ..runtime import waits
from ..runtime.active_turn import CANCELLED_ERROR, ActiveTurn, TurnResult
from ..runtime.conversations import Conversations
from ..runtime.structured import OutputSchema
from ..store.base import EventRecord
from ..turn_events import ENDINGS, MessageDelta, PermissionRequested, TurnCompleted, TurnEnded, TurnFailed
from .plumbing import BrokenOff, error_response, read_json, sse_response


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # OpenAI clients send many knobs we ignore
    model: str = Field(min_length=1)
    messages: list[ChatMessage] = Field(min_length=1)
    stream: StrictBool = False
    stream_options: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None


def _text(content: str | list[dict[str, Any]] | None) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if p.get("type") == "text")
    return content or ""


def _history(messages: list[ChatMessage]) -> tuple[list[Message], str]:
    if messages[-1].role != "user":
        raise RequestError("the last message must have role user")
    history: list[Message] = []
    for m in messages[:-1]:
        if m.role == "user":
            history.append(UserMessage(content=_text(m.content)))
        elif m.role == "assistant":
            history.append(AssistantMessage(content=_text(m.content)))
    return history, _text(messages[-1].content)


def _output(response_format: dict[str, Any] | None) -> OutputSchema | None:
    """The JSON the answer must be, from OpenAI's `response_format` (None: free text)."""
    kind = (response_format or {}).get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return OutputSchema.json_object()
    if kind != "json_schema":
        raise RequestError("response_format.type must be text, json_object or json_schema")
    spec = (response_format or {}).get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise RequestError("response_format json_schema needs json_schema.schema, a JSON Schema object")
    try:
        check_schema(spec["schema"])
    except SchemaError as exc:
        raise RequestError(f"response_format.json_schema.schema is not a valid JSON Schema: {exc.message}",
                           details={"path": list(exc.path)}) from None
    native = {k: spec[k] for k in ("name", "description", "schema", "strict") if k in spec}
    return OutputSchema(spec["schema"], {"type": "json_schema", "json_schema": {"name": "output", **native}})


async def chat_completions(request: Request) -> Response:
    service = request.app.state.service
    body = await read_json(request, ChatRequest)
    history, text = _history(body.messages)
    if not text:
        raise RequestError("the last user message is empty")
    output = _output(body.response_format)
    conversations = service.conversations
    conversation = await conversations.create(body.model, None, {"source": "openai"}, history)
    turn = await conversations.send(conversation.id, text, output=output)
    completion_id = "chatcmpl-" + turn.id
    created = int(time.time())
    if body.stream:
        usage = bool((body.stream_options or {}).get("include_usage"))
        # with a schema, an answer that needed a repair streamed deltas that are not the answer
        whole = output is not None or (await service.registry.resolve(
            f"{conversation.agent_name}@{conversation.digest}")).agent.output_schema is not None
        events = conversations.events(conversation.id, after=turn.started_seq - 1, until_turn=turn.id)
        chunks = _chunks(events, completion_id, created, body.model, usage, whole=whole)
        return sse_response(chunks, service.metrics)
    try:
        result = await _result(conversations, turn)
    except CorralError as exc:  # the turn ran: a retry would run (and pay for) another one
        response = error_response(exc)
        response.headers["x-should-retry"] = "false"  # OpenAI's clients obey this
        return response
    return JSONResponse({
        "id": completion_id, "object": "chat.completion", "created": created, "model": body.model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": result.output},
                     "finish_reason": "stop", "logprobs": None}],
        "usage": _usage(result.usage),
        "system_fingerprint": result.digest,
    })


async def _result(conversations: Conversations, turn: ActiveTurn) -> TurnResult:
    """The completed turn's result; a failure, or a wait on a person, raised as its error."""
    answer = await waits.answer(conversations, turn)
    if isinstance(answer, waits.Waiting):
        raise permission_required(answer.conversation_id, answer.turn_id, answer.requests)
    if not answer.completed:
        error = answer.failure()
        raise CorralError(error["message"], code=error["code"], details=error.get("details"))
    return answer


def permission_required(conversation_id: str, turn_id: str,
                        requests: tuple[waits.PendingRequest, ...]) -> CorralError:
    """A turn that waits on a person: it goes on once someone answers, and its result is read from the
    conversation (as the MCP tool says it)."""
    first, path = requests[0], f"/v1/conversations/{conversation_id}"
    return CorralError(
        f"the agent wants to call {first.tool} and needs a person's approval: POST "
        f"{path}/permissions/{first.request_id} with {{\"decision\": \"allow\"}} (or \"deny\"); the "
        f"turn then goes on, and its result is read with GET {path}/turns/{turn_id}?wait=60",
        code="permission_required", details={"conversation_id": conversation_id, "turn_id": turn_id,
                                             "permission_requests": [r.to_json() for r in requests]})


def _usage(usage: Mapping[str, int]) -> dict[str, int]:
    prompt, completion = usage.get("input_tokens", 0), usage.get("output_tokens", 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def _chunks(events: AsyncIterator[EventRecord | None], completion_id: str, created: int, model: str,
                  include_usage: bool, *, whole: bool = False) -> AsyncIterator[bytes]:
    """OpenAI's chunks of a turn's events; `whole`: the answer in one chunk once valid, no deltas."""
    def frame(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        chunk = {"id": completion_id, "object": "chat.completion.chunk", "created": created,
                 "model": model, "choices": [choice], **extra}
        return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"

    yield frame({"role": "assistant", "content": ""})
    async for record in events:
        if record is None:
            yield b": keep-alive\n\n"
            continue
        event = record.event
        if isinstance(event, MessageDelta) and not whole:
            yield frame({"content": event.text})
        elif isinstance(event, (*ENDINGS, PermissionRequested)):
            last = _last(record.conversation_id, event, frame, whole=whole, include_usage=include_usage)
            for chunk in last:
                yield chunk
            yield b"data: [DONE]\n\n"
            return
    raise BrokenOff  # the server stops before the turn's end: no [DONE], the stream is broken off (§8)


def _last(conversation_id: str, event: TurnEnded | PermissionRequested, frame: Callable[..., bytes], *,
          whole: bool, include_usage: bool) -> Iterator[bytes]:
    """The chunks that end a stream: the answer's, its error's, or the permission it waits on."""
    if isinstance(event, PermissionRequested):  # as the non-streaming answer: the turn waits on a person
        yield _waits_on(conversation_id, event)
    elif isinstance(event, TurnCompleted):
        if whole:
            yield frame({"content": event.output or ""})
        yield frame({}, "stop")
        if include_usage:
            yield frame({}, choices=[], usage=_usage(event.usage))
    else:
        error = (event.error if isinstance(event, TurnFailed) else None) or CANCELLED_ERROR
        yield b"data: " + json.dumps({"error": {**error, "type": error["code"]}}).encode() + b"\n\n"


def _waits_on(conversation_id: str, event: PermissionRequested) -> bytes:
    """The error chunk of a streamed turn that waits on a person (its `permission.requested` event)."""
    request = waits.PendingRequest(request_id=event.request_id, tool=event.tool, input=event.arguments,
                                   expires_at=event.expires_at)
    body = permission_required(conversation_id, event.turn_id, (request,)).envelope()["error"]
    return b"data: " + json.dumps({"error": {**body, "type": body["code"]}}).encode() + b"\n\n"


routes = [Route("/v1/chat/completions", chat_completions, methods=["POST"])]
