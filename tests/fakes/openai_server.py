"""A fake OpenAI chat-completions server that speaks the real wire protocol.

`POST /v1/chat/completions` (so the base URL is `{server}/v1`): with
`stream: true`, `chat.completion.chunk` events as OpenAI sends them (a role
chunk, content deltas, tool-call pieces by `index`, a finish chunk, a usage
chunk when `stream_options.include_usage`, then `[DONE]`); without it, one
`chat.completion` object. It checks what the real API would refuse: a body
without `model` or `messages`, a `tool` message that answers no call of the
assistant message before it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .scenarios import (
    STALL_LIMIT_S,
    Cut,
    Malformed,
    Reply,
    ScriptedServer,
    Stall,
    Status,
    error_response,
    split,
    sse,
)


class FakeOpenAI(ScriptedServer):
    """`report_usage=False`: a compatible server that ignores `stream_options.include_usage` (many do)."""

    def __init__(self, *, report_usage: bool = True) -> None:
        super().__init__()
        self.report_usage = report_usage
        self.app = Starlette(routes=[Route("/v1/chat/completions", self.completions, methods=["POST"])])

    async def completions(self, request: Request) -> Response:
        body, scenario = await self.take(request)
        problem = _invalid(body)
        if problem:
            return _error(400, "invalid_request_error", problem)
        if scenario is None:
            return _error(400, "invalid_request_error", "no scenario scripted", code="no_scenario")
        if isinstance(scenario, Status):
            return _error(scenario.status, scenario.error_type, scenario.message, scenario.retry_after)
        if not body.get("stream"):
            if not isinstance(scenario, Reply):
                return _error(400, "invalid_request_error", "this scenario needs stream: true")
            return JSONResponse(_completion(body["model"], scenario))
        usage = bool((body.get("stream_options") or {}).get("include_usage")) and self.report_usage
        chunks = _Chunks(body["model"], usage)
        return StreamingResponse(chunks.play(scenario), media_type="text/event-stream")


class _Chunks:
    def __init__(self, model: str, include_usage: bool):
        self.model = model
        self.include_usage = include_usage

    def chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        data: dict[str, Any] = {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": self.model,
            "system_fingerprint": None,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if self.include_usage:
            data["usage"] = None
        return sse(data)

    async def play(self, scenario: Any) -> AsyncIterator[bytes]:
        yield self.chunk({"role": "assistant", "content": ""})
        if isinstance(scenario, Reply):
            for piece in self.reply(scenario):
                yield piece
            return
        first = split(getattr(scenario, "text", ""), 3)[:1]
        for text in first:
            yield self.chunk({"content": text})
        if isinstance(scenario, Malformed):
            yield b"data: {not json\n\n"
        elif isinstance(scenario, Stall):
            await anyio.sleep(STALL_LIMIT_S)  # cancelled when the client disconnects
        elif not isinstance(scenario, Cut):
            raise TypeError(f"the OpenAI fake cannot play {scenario!r}")

    def reply(self, reply: Reply) -> list[bytes]:
        out = [self.chunk({"content": text}) for text in split(reply.text, reply.chunks)]
        for index, call in enumerate(reply.calls):
            function = {"name": call.name, "arguments": ""}
            head = {"index": index, "id": call.id, "type": "function", "function": function}
            out.append(self.chunk({"tool_calls": [head]}))
            for piece in split(call.text, call.pieces):
                out.append(self.chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
        out.append(self.chunk({}, finish=_finish_reason(reply)))
        if self.include_usage:
            usage = _usage(reply)
            out.append(
                sse(
                    {
                        "id": "chatcmpl-fake",
                        "object": "chat.completion.chunk",
                        "created": 1700000000,
                        "model": self.model,
                        "choices": [],
                        "usage": usage,
                    }
                )
            )
        out.append(sse("[DONE]"))
        return out


def _finish_reason(reply: Reply) -> str:
    return reply.stop or ("tool_calls" if reply.calls else "stop")


def _usage(reply: Reply) -> dict[str, int]:
    prompt, completion = reply.usage
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _completion(model: str, reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None, "refusal": None}
    if reply.calls:
        message["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.text},
            }
            for c in reply.calls
        ]
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1700000000,
        "model": model,
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": _finish_reason(reply)}
        ],
        "usage": _usage(reply),
    }


def _invalid(body: Any) -> str:
    if not isinstance(body, dict) or not body.get("model") or not isinstance(body.get("messages"), list):
        return "model and messages are required"
    answerable: set[str] = set()
    for message in body["messages"]:
        if message.get("role") == "assistant":
            answerable = {c["id"] for c in message.get("tool_calls") or ()}
        elif message.get("role") == "tool" and message.get("tool_call_id") not in answerable:
            return "a tool message must answer a tool call of the preceding assistant message"
    return ""


def _error(status: int, kind: str, message: str, retry_after: str | None = None, code: str | None = None):
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return error_response(status, body, retry_after)
