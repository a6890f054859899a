"""The `scripted` provider: deterministic, offline, and the tests' model.

Rules are tried top to bottom against the last user message (`when` is a
regex, searched; omitted matches anything). A matching rule with a
`tool_call` asks for that call first; once its result is back, the model
answers with the rule's `reply` (default `{tool_result}`). With no rule
matching, the answer is `default`, else the input echoed.

`reply` and string tool arguments may use `{input}`, `{tool_result}` and the
named groups of `when` (`(?P<city>\\w+)` gives `{city}`); other braces are
left as written.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Mapping
from typing import Any

from ..canonical import thaw
from ..compiler.definitions import ModelDefinition
from ..messages import AssistantMessage, ToolCall, ToolResultMessage, Usage, UserMessage
from .base import Finish, ModelChunk, ModelRequest, TextDelta, ToolCallChunk, UsageChunk

_PLACEHOLDER = re.compile(r"\{(\w+)\}")
_WORDS = re.compile(r"\s*\S+\s*|\s+")


def _fill(text: str, values: Mapping[str, str]) -> str:
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), text)


def _fill_all(value: Any, values: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        return _fill(value, values)
    if isinstance(value, Mapping):
        return {k: _fill_all(v, values) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_fill_all(v, values) for v in value]
    return value


class ScriptedProvider:
    def __init__(self, definition: ModelDefinition):
        self.definition = definition
        self._rules = [(re.compile(r["when"]) if r.get("when") else None, r) for r in definition.script]

    def _match(self, text: str) -> tuple[Mapping[str, Any] | None, dict[str, str]]:
        for pattern, rule in self._rules:
            if pattern is None:
                return rule, {}
            found = pattern.search(text)
            if found:
                groups = {k: v for k, v in found.groupdict().items() if v is not None}
                return rule, groups
        return None, {}

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        user_at = max((i for i, m in enumerate(request.messages) if isinstance(m, UserMessage)), default=-1)
        text = request.messages[user_at].content if user_at >= 0 else ""
        since = request.messages[user_at + 1 :]
        results = [m for m in since if isinstance(m, ToolResultMessage)]
        calls_made = sum(len(m.tool_calls) for m in since if isinstance(m, AssistantMessage))
        rule, groups = self._match(text)
        values = {**groups, "input": text, "tool_result": results[-1].content.strip() if results else ""}
        usage = Usage(sum(len(getattr(m, "content", "")) for m in request.messages) // 4 + 1, 0)
        if rule is not None and rule.get("tool_call") and not results:
            call = rule["tool_call"]
            arguments = _fill_all(thaw(call.get("arguments", {})), values)
            yield ToolCallChunk(ToolCall(id=f"call_{calls_made + 1}", name=call["name"], arguments=arguments))
            yield UsageChunk(Usage(usage.input_tokens, 8))
            yield Finish("tool_use")
            return
        if rule is not None:
            reply = _fill(rule.get("reply") or "{tool_result}", values)
        elif self.definition.default is not None:
            reply = _fill(self.definition.default, values)
        else:
            reply = text
        for piece in _WORDS.findall(reply) or [""]:
            yield TextDelta(piece)
        yield UsageChunk(Usage(usage.input_tokens, len(reply) // 4 + 1))
        yield Finish("end_turn")
