"""The model port: what the agent loop needs from any model provider.

A provider takes the transcript so far, the instructions and the tools, and
streams back one assistant step as chunks: text deltas, complete tool calls
(arguments already assembled from however many pieces the wire split them
into), usage, and a final `Finish`. It is not responsible for retries,
fallbacks or time-outs of the whole step (see `resilience`), nor for running
tools.

Errors: a provider raises `ProviderError` (a `ModelError`, defined with every
other error in `errors`) with `retryable` set for 429 and 5xx (and
`retry_after` when the server said), never with the provider's raw body or a
key in the message.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..compiler.definitions import ModelDefinition
from ..errors import ProviderError  # noqa: F401  (re-exported: the port's one failure)
from ..messages import Message, ToolCall, ToolSpec, Usage


@dataclass(frozen=True, slots=True)
class ModelRequest:
    instructions: str
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    # The answer's JSON form, as OpenAI's wire spells it ({"type": "json_schema", "json_schema": {...}} or
    # {"type": "json_object"}): providers that take it natively send it; the others ignore it.
    response_format: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallChunk:
    call: ToolCall


@dataclass(frozen=True, slots=True)
class UsageChunk:
    usage: Usage


@dataclass(frozen=True, slots=True)
class Finish:
    stop_reason: str  # "end_turn" | "tool_use" | "max_tokens" | provider-specific


ModelChunk = TextDelta | ToolCallChunk | UsageChunk | Finish


class ModelPort(Protocol):
    """One model, ready to stream a step."""

    definition: ModelDefinition

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]: ...
