"""The transcript: a tagged union of messages, and usage counts.

Messages are what a conversation persists and what every model provider is
given; each provider adapter translates them to its own wire format. They
are frozen and round-trip through JSON (`to_json` / `message_from_json`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from .canonical import freeze, thaw


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: Any  # a JSON object as the model sent it (a dict), or the raw text if it was not JSON

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "arguments": thaw(self.arguments)}


@dataclass(frozen=True, kw_only=True, slots=True)
class UserMessage:
    content: str
    role: Literal["user"] = "user"

    def to_json(self) -> dict[str, Any]:
        return {"role": "user", "content": self.content}


@dataclass(frozen=True, kw_only=True, slots=True)
class AssistantMessage:
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    role: Literal["assistant"] = "assistant"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [c.to_json() for c in self.tool_calls]
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolResultMessage:
    tool_call_id: str
    name: str
    content: str
    is_error: bool = False
    role: Literal["tool"] = "tool"

    def to_json(self) -> dict[str, Any]:
        return {
            "role": "tool",
            "tool_call_id": self.tool_call_id,
            "name": self.name,
            "content": self.content,
            "is_error": self.is_error,
        }


Message = UserMessage | AssistantMessage | ToolResultMessage


def message_from_json(data: dict[str, Any]) -> Message:
    role = data.get("role")
    if role == "user":
        return UserMessage(content=data["content"])
    if role == "assistant":
        calls = tuple(
            ToolCall(id=c["id"], name=c["name"], arguments=freeze(c.get("arguments", {})))
            for c in data.get("tool_calls", ())
        )
        return AssistantMessage(content=data.get("content") or "", tool_calls=calls)
    if role == "tool":
        return ToolResultMessage(
            tool_call_id=data["tool_call_id"],
            name=data.get("name", ""),
            content=data.get("content", ""),
            is_error=bool(data.get("is_error", False)),
        )
    raise ValueError(f"unknown message role {role!r}")


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.input_tokens + other.input_tokens, self.output_tokens + other.output_tokens)

    def to_json(self) -> dict[str, int]:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool as a model sees it."""

    name: str
    description: str
    input_schema: Any = field(default_factory=lambda: freeze({"type": "object", "properties": {}}))


def repair_history(messages: list[Message]) -> list[Message]:
    """Answer tool calls that never got a result (a turn cancelled mid-call).

    Providers reject a transcript where a tool call has no result, so a
    cancelled or crashed turn would poison every later turn. Each turn repairs its whole history,
    so the common case (every call answered by the results right after it) is checked first, in
    one pass that builds nothing.
    """
    calls_at = [i for i, m in enumerate(messages) if isinstance(m, AssistantMessage) and m.tool_calls]
    if all(_answered(messages, i) for i in calls_at):
        return list(messages)
    return _repaired(messages)


def _answered(messages: list[Message], at: int) -> bool:
    """Whether the results right after the message at `at` answer each of its tool calls."""
    waiting = {c.id for c in messages[at].tool_calls}  # type: ignore[union-attr]
    after = at + 1
    while waiting and after < len(messages) and isinstance(messages[after], ToolResultMessage):
        waiting.discard(messages[after].tool_call_id)  # type: ignore[union-attr]
        after += 1
    return not waiting


def _repaired(messages: list[Message]) -> list[Message]:
    out: list[Message] = []
    pending: dict[str, str] = {}
    for message in messages:
        if isinstance(message, ToolResultMessage):
            pending.pop(message.tool_call_id, None)
        elif pending:
            out += [ToolResultMessage(tool_call_id=i, name=n, content="(interrupted: no result)",
                                      is_error=True) for i, n in pending.items()]
            pending = {}
        out.append(message)
        if isinstance(message, AssistantMessage):
            pending = {c.id: c.name for c in message.tool_calls}
    out += [ToolResultMessage(tool_call_id=i, name=n, content="(interrupted: no result)", is_error=True)
            for i, n in pending.items()]
    return out
