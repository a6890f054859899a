"""A model port wrapped so that everything it streams is well-formed Unicode.

A model (or a server that speaks for one) may send a lone surrogate: JSON
lets a string hold `"\\ud83d"`, and a streaming wire may split the two
escapes of one character (`"\\ud83d"` then `"\\ude00"`) across chunks. Such
text cannot be encoded, so no store could keep it and the turn would fail
with its answer lost (CONTRACT §7). Here a high surrogate that ends a text
delta waits for the next one: followed by its low half it becomes the
character it stands for; anything else leaves U+FFFD in place of each lone
surrogate. Tool-call names and arguments get the same replacement.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from ..canonical import freeze, thaw
from ..messages import ToolCall
from .base import ModelChunk, ModelPort, ModelRequest, TextDelta, ToolCallChunk

REPLACEMENT = "\ufffd"
_SURROGATES = re.compile("[\ud800-\udfff]")
_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")


def _join(match: re.Match[str]) -> str:
    return match.group().encode("utf-16", "surrogatepass").decode("utf-16")


def well_formed(text: str) -> str:
    """`text` with each surrogate pair as its character and each lone surrogate as U+FFFD."""
    if not _SURROGATES.search(text):
        return text
    return _SURROGATES.sub(REPLACEMENT, _PAIR.sub(_join, text))


def has_lone_surrogate(data: Any) -> bool:
    """Whether a string or key anywhere in parsed JSON `data` holds a surrogate (one a JSON parser
    left unpaired); level by level, so nothing recurses."""
    level = [data]
    while level:
        strings = [node for node in level if isinstance(node, str)]
        strings += [key for node in level if isinstance(node, dict) for key in node]
        if any(_SURROGATES.search(text) for text in strings):
            return True
        level = [child for node in level if isinstance(node, (dict, list))
                 for child in (node.values() if isinstance(node, dict) else node)]
    return False


def _scrubbed(value: Any) -> Any:
    if isinstance(value, str):
        return well_formed(value)
    if isinstance(value, dict):
        return {well_formed(k): _scrubbed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrubbed(v) for v in value]
    return value


def _call(call: ToolCall) -> ToolCall:
    arguments = _scrubbed(thaw(call.arguments))
    return ToolCall(id=well_formed(call.id), name=well_formed(call.name),
                    arguments=freeze(arguments) if isinstance(arguments, dict) else arguments)


class WellFormedModel:
    """`port`, with lone surrogates in what it streams rejoined or replaced (see the module's docstring)."""

    def __init__(self, port: ModelPort):
        self.port = port
        self.definition = port.definition

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        held = ""  # a high surrogate that ended the last text delta, waiting for its low half
        async with aclosing(self.port.stream(request)) as chunks:
            async for chunk in chunks:
                if isinstance(chunk, TextDelta):
                    text = held + chunk.text
                    held = text[-1] if "\ud800" <= text[-1:] <= "\udbff" else ""
                    if text := well_formed(text[:-1] if held else text):
                        yield TextDelta(text)
                    continue
                if held:  # the text ended on half a character
                    yield TextDelta(REPLACEMENT)
                    held = ""
                yield ToolCallChunk(_call(chunk.call)) if isinstance(chunk, ToolCallChunk) else chunk
        if held:
            yield TextDelta(REPLACEMENT)
