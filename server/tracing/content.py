"""Message content in spans: only on the standard opt-in, and redacted as tool output is.

`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true` puts what a model was
sent and answered (`gen_ai.system_instructions`, `gen_ai.input.messages`,
`gen_ai.output.messages`) and a tool call's arguments and result
(`gen_ai.tool.call.arguments`, `gen_ai.tool.call.result`) on the spans, as
the GenAI conventions' JSON. Every string in them passes the turn's redactor
first (the runtime's known secret values; `redacting`), the one tool results
pass before anyone sees them. Without the variable none of it is built.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from ..messages import AssistantMessage, Message, ToolCall, ToolResultMessage

OPT_IN = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
Redact = Callable[[str], str]

_capture = {"on": False}
_redact: ContextVar[Redact | None] = ContextVar("corral_trace_redactor", default=None)


def configure_content(environ: Mapping[str, str]) -> None:
    _capture["on"] = environ.get(OPT_IN, "").strip().lower() == "true"


def capture_content() -> bool:
    """Whether spans carry message content (the standard opt-in)."""
    return _capture["on"]


@contextmanager
def redacting(redact: Redact | None) -> Iterator[None]:
    """Content captured inside passes `redact` (a turn's; a sub-agent's turn keeps its parent's)."""
    token = _redact.set(redact or _redact.get())
    try:
        yield
    finally:
        _redact.reset(token)


def redacted(text: str) -> str:
    redact = _redact.get()
    return redact(text) if redact is not None else text


def _json(value: Any) -> str:
    return redacted(json.dumps(value, ensure_ascii=False, default=str))


def _parts(message: Message) -> list[dict[str, Any]]:
    if isinstance(message, ToolResultMessage):
        return [{"type": "tool_call_response", "id": message.tool_call_id, "response": message.content}]
    parts: list[dict[str, Any]] = [{"type": "text", "content": message.content}] if message.content else []
    if isinstance(message, AssistantMessage):
        parts += [_call_part(c) for c in message.tool_calls]
    return parts


def _call_part(call: ToolCall) -> dict[str, Any]:
    return {"type": "tool_call", "id": call.id, "name": call.name, "arguments": call.to_json()["arguments"]}


def input_messages(messages: Iterable[Message]) -> str:
    """`gen_ai.input.messages`: the request's messages, as the conventions' JSON."""
    return _json([{"role": m.role, "parts": _parts(m)} for m in messages])


def output_messages(text: str, calls: Iterable[ToolCall], finish_reason: str) -> str:
    """`gen_ai.output.messages`: the one reply a chat step produced."""
    parts = _parts(AssistantMessage(content=text, tool_calls=tuple(calls)))
    return _json([{"role": "assistant", "parts": parts, "finish_reason": finish_reason}])


def system_instructions(text: str) -> str:
    return _json([{"type": "text", "content": text}])


def value(data: Any) -> str:
    """A tool call's arguments or result, as JSON (a string stays a string)."""
    return redacted(data) if isinstance(data, str) else _json(data)
