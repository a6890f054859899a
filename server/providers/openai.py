"""Any OpenAI-compatible chat-completions endpoint, streamed.

`POST {base_url}/chat/completions` with `stream: true` and
`stream_options.include_usage`, a Bearer key resolved from the environment at
call time. The transcript becomes `system` / `user` / `assistant` (with
`tool_calls`, arguments JSON-encoded) / `tool` messages. Tool-call pieces are
assembled by `index` and emitted whole when the choice finishes; usage comes
from the last chunk, after the finish reason, so `Finish` is sent at `[DONE]`
(or at the end of the stream). A turn with an output schema sends it as
`response_format`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing
from typing import Any
from urllib.parse import urlsplit

from ..canonical import thaw
from ..compiler.definitions import ModelDefinition
from ..errors import ProviderError
from ..messages import AssistantMessage, Message, ToolCall, ToolResultMessage, ToolSpec, Usage
from .base import Finish, ModelChunk, ModelRequest, TextDelta, ToolCallChunk, UsageChunk
from .transport import ModelHTTP
from .wire import (
    EncodedCache,
    Fragments,
    PrefixCache,
    api_key,
    describe,
    drain,
    dumps,
    malformed,
    parse_arguments,
    parse_json,
    post_events,
)

DEFAULT_BASE_URL = "https://api.openai.com/v1"
STOP_REASONS = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
}


class OpenAIProvider:
    """A `ModelPort` for OpenAI's chat completions and the many servers that copy them."""

    def __init__(self, definition: ModelDefinition, client: ModelHTTP, environ: Mapping[str, str]):
        self.definition = definition
        self._client = client
        self._environ = environ
        self._url = (definition.base_url or DEFAULT_BASE_URL).rstrip("/") + "/chat/completions"
        self._label = describe(definition, "openai", self._url)
        # OpenAI's own newer models refuse `max_tokens`; most compatible servers only know it
        official = urlsplit(self._url).hostname == "api.openai.com"
        self._limit_field = "max_completion_tokens" if official else "max_tokens"

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        headers = {"accept": "text/event-stream"}
        key = api_key(self.definition, self._environ, self._label)
        if key:
            headers["authorization"] = f"Bearer {key}"
        reply = _Reply(self._label)
        events = post_events(
            self._client,
            self._url,
            body=self.body(request),
            headers=headers,
            timeout_s=self.definition.timeout_s,
            label=self._label,
        )
        async with aclosing(events):
            async for event in events:
                if event.data.strip() == "[DONE]":
                    await drain(events)
                    break
                for chunk in reply.feed(parse_json(event.data, self._label)):
                    yield chunk
        for chunk in reply.finish():
            yield chunk

    def body(self, request: ModelRequest) -> dict[str, Any]:
        """The request body for `request`, as the wire expects it."""
        d = self.definition
        messages = Fragments([dumps({"role": "system", "content": request.instructions})]
                             if request.instructions else [])
        if request.messages:
            messages.append(_HISTORIES(request.messages))
        body: dict[str, Any] = {
            "model": d.model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        body[self._limit_field] = d.max_output_tokens
        if d.temperature is not None:
            body["temperature"] = d.temperature
        if request.tools:
            body["tools"] = [_tool(t) for t in request.tools]
        if request.response_format is not None:  # structured output, natively
            body["response_format"] = thaw(request.response_format)
        return body


def _message(message: Message) -> dict[str, Any]:
    if isinstance(message, ToolResultMessage):
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    if isinstance(message, AssistantMessage):
        # `content` may be null only beside tool calls.
        content = message.content or (None if message.tool_calls else "")
        out: dict[str, Any] = {"role": "assistant", "content": content}
        if message.tool_calls:
            out["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": _arguments_text(c.arguments)},
                }
                for c in message.tool_calls
            ]
        return out
    return {"role": "user", "content": message.content}


# a history's messages are the same objects turn after turn: each is encoded once, and a request
# joins only what its conversation added since the last
_HISTORIES = PrefixCache(EncodedCache(lambda message: dumps(_message(message))))


def _arguments_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(thaw(arguments), ensure_ascii=False)


def _tool(tool: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": thaw(tool.input_schema),
        },
    }


class _Reply:
    """The state of one streamed reply: tool-call pieces by index, the finish reason, usage."""

    def __init__(self, label: str):
        self._label = label
        self._calls: dict[int, dict[str, Any]] = {}
        self._emitted = 0
        self._reason: str | None = None
        self._usage: Usage | None = None

    def feed(self, data: dict[str, Any]) -> list[ModelChunk]:
        try:
            return self._feed(data)
        except (AttributeError, TypeError, KeyError, ValueError):
            raise malformed(self._label) from None

    def _feed(self, data: dict[str, Any]) -> list[ModelChunk]:
        if data.get("error"):  # some compatible servers report failures in the stream itself
            raise ProviderError(f"{self._label}: error in the response stream", retryable=True)
        if usage := data.get("usage"):
            counts = (int(usage.get(k) or 0) for k in ("prompt_tokens", "completion_tokens"))
            self._usage = Usage(*counts)
        out: list[ModelChunk] = []
        for choice in data.get("choices") or ():
            delta = choice.get("delta") or {}
            if text := delta.get("content"):
                out.append(TextDelta(text))
            for piece in delta.get("tool_calls") or ():
                self._piece(piece)
            if reason := choice.get("finish_reason"):
                self._reason = reason
                out += self._complete_calls()
        return out

    def _piece(self, piece: dict[str, Any]) -> None:
        call = self._calls.setdefault(int(piece.get("index") or 0), {"id": "", "name": "", "arguments": []})
        function = piece.get("function") or {}
        call["id"] = piece.get("id") or call["id"]
        call["name"] = function.get("name") or call["name"]
        if function.get("arguments"):
            call["arguments"].append(function["arguments"])

    def _complete_calls(self) -> list[ModelChunk]:
        calls = [self._calls[i] for i in sorted(self._calls)]
        self._calls.clear()
        self._emitted += len(calls)
        return [
            ToolCallChunk(
                ToolCall(
                    id=c["id"] or f"call_{uuid.uuid4().hex[:24]}",
                    name=c["name"],
                    arguments=parse_arguments("".join(c["arguments"])),
                )
            )
            for c in calls
        ]

    def finish(self) -> list[ModelChunk]:
        if self._reason is None:
            raise ProviderError(f"{self._label}: the stream ended before the reply finished", retryable=True)
        reason = STOP_REASONS.get(self._reason, self._reason)
        if self._emitted and reason == "end_turn":  # some servers say "stop" after tool calls
            reason = "tool_use"
        out: list[ModelChunk] = [UsageChunk(self._usage)] if self._usage else []
        return [*out, Finish(reason)]
