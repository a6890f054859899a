"""A fake Anthropic Messages API server that speaks the real wire protocol.

`POST /v1/messages` with `stream: true` answers with the real event sequence:
`message_start`, `ping`, per content block `content_block_start` /
`content_block_delta` (`text_delta`, `input_json_delta`) /
`content_block_stop`, then `message_delta` and `message_stop`. Errors use
the API's `{"type": "error", "error": {...}}` body. It refuses what the real
API refuses: no `anthropic-version` header, no `model`, `max_tokens` or
`messages`, or a `tool_result` that answers no `tool_use` of the assistant
message just before it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from .scenarios import (
    STALL_LIMIT_S,
    Cut,
    Malformed,
    Reply,
    ScriptedServer,
    Stall,
    Status,
    StreamError,
    error_response,
    split,
    sse,
)


class FakeAnthropic(ScriptedServer):
    def __init__(self) -> None:
        super().__init__()
        self.app = Starlette(routes=[Route("/v1/messages", self.messages, methods=["POST"])])

    async def messages(self, request: Request) -> Response:
        body, scenario = await self.take(request)
        problem = _invalid(body, request.headers)
        if problem:
            return _error(400, "invalid_request_error", problem)
        if scenario is None:
            return _error(400, "invalid_request_error", "no scenario scripted")
        if isinstance(scenario, Status):
            return _error(scenario.status, scenario.error_type, scenario.message, scenario.retry_after)
        if not body.get("stream"):
            return _error(400, "invalid_request_error", "this fake only streams")
        return StreamingResponse(_play(body["model"], scenario), media_type="text/event-stream")


def _event(data: dict[str, Any]) -> bytes:
    return sse(data, event=data["type"])


def _start(model: str, input_tokens: int) -> list[bytes]:
    message = {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": model,
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 1},
    }
    return [_event({"type": "message_start", "message": message}), _event({"type": "ping"})]


def _text_block(index: int, pieces: list[str]) -> list[bytes]:
    out = [
        _event({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}})
    ]
    for text in pieces:
        delta = {"type": "text_delta", "text": text}
        out.append(_event({"type": "content_block_delta", "index": index, "delta": delta}))
    return out


def _reply(model: str, reply: Reply) -> list[bytes]:
    out = _start(model, reply.usage[0])
    index = 0
    if reply.text:
        out += _text_block(index, split(reply.text, reply.chunks))
        out.append(_event({"type": "content_block_stop", "index": index}))
        index += 1
    for call in reply.calls:
        block = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
        out.append(_event({"type": "content_block_start", "index": index, "content_block": block}))
        for piece in split(call.text, call.pieces):
            delta = {"type": "input_json_delta", "partial_json": piece}
            out.append(_event({"type": "content_block_delta", "index": index, "delta": delta}))
        out.append(_event({"type": "content_block_stop", "index": index}))
        index += 1
    stop = reply.stop or ("tool_use" if reply.calls else "end_turn")
    out.append(
        _event(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": reply.usage[1]},
            }
        )
    )
    out.append(_event({"type": "message_stop"}))
    return out


async def _play(model: str, scenario: Any) -> AsyncIterator[bytes]:
    if isinstance(scenario, Reply):
        for event in _reply(model, scenario):
            yield event
        return
    for event in _start(model, 10):
        yield event
    if isinstance(scenario, StreamError):
        yield _event({"type": "error", "error": {"type": scenario.error_type, "message": "scripted"}})
        return
    for event in _text_block(0, split(scenario.text, 3)[:1]):
        yield event
    if isinstance(scenario, Malformed):
        yield b"event: content_block_delta\ndata: {not json\n\n"
    elif isinstance(scenario, Stall):
        await anyio.sleep(STALL_LIMIT_S)  # cancelled when the client disconnects
    elif not isinstance(scenario, Cut):
        raise TypeError(f"the Anthropic fake cannot play {scenario!r}")


def _invalid(body: Any, headers: Any) -> str:
    if "anthropic-version" not in headers:
        return "anthropic-version header is required"
    if not isinstance(body, dict) or not body.get("model") or not isinstance(body.get("max_tokens"), int):
        return "model and max_tokens are required"
    if not isinstance(body.get("messages"), list):
        return "messages is required"
    tool_uses: set[str] = set()
    for message in body["messages"]:
        blocks = message["content"] if isinstance(message.get("content"), list) else []
        if message.get("role") == "assistant":
            tool_uses = {b["id"] for b in blocks if b.get("type") == "tool_use"}
            continue
        for block in blocks:
            if block.get("type") == "tool_result" and block.get("tool_use_id") not in tool_uses:
                return "tool_result must answer a tool_use of the preceding assistant message"
        tool_uses = set()
    return ""


def _error(status: int, kind: str, message: str, retry_after: str | None = None) -> Response:
    return error_response(status, {"type": "error", "error": {"type": kind, "message": message}}, retry_after)
