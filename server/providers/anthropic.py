"""Anthropic's Messages API, streamed.

`POST {base_url}/v1/messages` with `x-api-key` (resolved from the environment
at call time), `anthropic-version: 2023-06-01` and `stream: true`; the
instructions go in the top-level `system`. Assistant turns become content
blocks (`text`, `tool_use` with an `input` object); tool results go back as
`tool_result` blocks of one user message per run of consecutive results.

The event stream: `message_start` (input usage), `content_block_start` /
`content_block_delta` / `content_block_stop` per block (a tool call is
emitted whole at its block's stop), `message_delta` (stop reason, output
usage), `message_stop`; `ping` is ignored and `error` fails the call
(retryable when the server is overloaded or failed internally).

A request's `response_format` (an output schema) is not sent: the API has no
such field, and the agent loop's instructions and repairs see to the form.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing
from typing import Any

from ..canonical import freeze, thaw
from ..compiler.definitions import ModelDefinition
from ..errors import ProviderError
from ..messages import AssistantMessage, Message, ToolCall, ToolResultMessage, ToolSpec, Usage
from .base import Finish, ModelChunk, ModelRequest, TextDelta, ToolCallChunk, UsageChunk
from .transport import ModelHTTP
from .wire import api_key, describe, drain, identifier, malformed, parse_arguments, parse_json, post_events

DEFAULT_BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"
RETRYABLE_ERRORS = {"overloaded_error", "api_error", "rate_limit_error", "timeout_error"}


class AnthropicProvider:
    """A `ModelPort` for the Anthropic Messages API."""

    def __init__(self, definition: ModelDefinition, client: ModelHTTP, environ: Mapping[str, str]):
        self.definition = definition
        self._client = client
        self._environ = environ
        self._url = (definition.base_url or DEFAULT_BASE_URL).rstrip("/") + "/v1/messages"
        self._label = describe(definition, "anthropic", self._url)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        headers = {"accept": "text/event-stream", "anthropic-version": API_VERSION}
        key = api_key(self.definition, self._environ, self._label)
        if key:
            headers["x-api-key"] = key
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
                for chunk in reply.feed(parse_json(event.data, self._label)):
                    yield chunk
                if reply.done:
                    await drain(events)
                    break
        for chunk in reply.finish():
            yield chunk

    def body(self, request: ModelRequest) -> dict[str, Any]:
        """The request body for `request`, as the wire expects it."""
        d = self.definition
        body: dict[str, Any] = {
            "model": d.model,
            "max_tokens": d.max_output_tokens,
            "messages": _messages(request.messages),
            "stream": True,
        }
        if request.instructions:
            body["system"] = request.instructions
        if d.temperature is not None:
            body["temperature"] = d.temperature
        if request.tools:
            body["tools"] = [_tool(t) for t in request.tools]
        return body


def _messages(messages: tuple[Message, ...]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for message in messages:
        if isinstance(message, AssistantMessage):
            blocks = _assistant_blocks(message)
            if blocks:  # the API refuses an empty assistant turn
                out.append({"role": "assistant", "content": blocks})
            continue
        if isinstance(message, ToolResultMessage):
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": message.tool_call_id,
                "content": message.content,
                "is_error": message.is_error,
            }
        else:
            block = {"type": "text", "text": message.content}
        # Results of one assistant turn share one user message, and a user's words that
        # follow them join it (after the results, as the API requires).
        last = out[-1] if out else None
        if last and last["role"] == "user" and last["content"][-1]["type"] == "tool_result":
            last["content"].append(block)
        else:
            out.append({"role": "user", "content": [block]})
    return out


def _assistant_blocks(message: AssistantMessage) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": message.content}] if message.content else []
    for call in message.tool_calls:
        # `input` must be an object; a call whose arguments were not JSON is replayed with none.
        arguments = thaw(call.arguments) if isinstance(call.arguments, Mapping) else {}
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": arguments})
    return blocks


def _tool(tool: ToolSpec) -> dict[str, Any]:
    return {"name": tool.name, "description": tool.description, "input_schema": thaw(tool.input_schema)}


class _Reply:
    """The state of one streamed message: open tool-use blocks, stop reason, usage."""

    def __init__(self, label: str):
        self._label = label
        self._tools: dict[int, dict[str, Any]] = {}
        self._reason: str | None = None
        self._usage = Usage()
        self.done = False

    def feed(self, data: dict[str, Any]) -> list[ModelChunk]:
        handler = getattr(self, "_on_" + str(data.get("type")), None)
        if handler is None:  # ping, and event types newer than this adapter
            return []
        try:
            return handler(data)
        except (AttributeError, TypeError, KeyError, ValueError):
            raise malformed(self._label) from None

    def _on_message_start(self, data: dict[str, Any]) -> list[ModelChunk]:
        usage = data["message"].get("usage") or {}
        inputs = sum(int(usage.get(k) or 0) for k in _INPUT_COUNTS)
        self._usage = Usage(inputs, int(usage.get("output_tokens") or 0))
        return []

    def _on_content_block_start(self, data: dict[str, Any]) -> list[ModelChunk]:
        block = data["content_block"]
        if block["type"] == "tool_use":
            self._tools[data["index"]] = {"block": block, "json": []}
        elif block["type"] == "text" and block.get("text"):
            return [TextDelta(block["text"])]
        return []

    def _on_content_block_delta(self, data: dict[str, Any]) -> list[ModelChunk]:
        delta = data["delta"]
        if delta["type"] == "text_delta" and delta["text"]:
            return [TextDelta(delta["text"])]
        if delta["type"] == "input_json_delta":
            self._tools[data["index"]]["json"].append(delta["partial_json"])
        return []

    def _on_content_block_stop(self, data: dict[str, Any]) -> list[ModelChunk]:
        tool = self._tools.pop(data["index"], None)
        if tool is None:
            return []
        block, text = tool["block"], "".join(tool["json"])
        # Input arrives in deltas; a block that had none may carry it whole in its start.
        arguments = parse_arguments(text) if text else freeze(dict(block.get("input") or {}))
        return [ToolCallChunk(ToolCall(id=block["id"], name=block["name"], arguments=arguments))]

    def _on_message_delta(self, data: dict[str, Any]) -> list[ModelChunk]:
        self._reason = data["delta"].get("stop_reason") or self._reason
        usage = data.get("usage") or {}
        inputs = sum(int(usage[k] or 0) for k in _INPUT_COUNTS if k in usage)
        self._usage = Usage(
            inputs or self._usage.input_tokens,
            int(usage.get("output_tokens") or self._usage.output_tokens),
        )
        return []

    def _on_message_stop(self, data: dict[str, Any]) -> list[ModelChunk]:
        self.done = True
        return []

    def _on_error(self, data: dict[str, Any]) -> list[ModelChunk]:
        kind = identifier((data.get("error") or {}).get("type")) or "error"
        retryable = kind in RETRYABLE_ERRORS
        raise ProviderError(f"{self._label}: {kind} in the response stream", retryable=retryable)

    def finish(self) -> list[ModelChunk]:
        if not self.done:
            raise ProviderError(f"{self._label}: the stream ended before the reply finished", retryable=True)
        return [UsageChunk(self._usage), Finish(self._reason or "end_turn")]


_INPUT_COUNTS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
