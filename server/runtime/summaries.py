"""Summaries for context compaction (contract §10): what the summary model reads, and its answer.

`summarize` asks a model for a summary of part of a conversation (after the
previous summary) without streaming it anywhere, and returns the text with
the tokens the request used (they count toward the turn's budget, see
`compaction`). A model that answers nothing gets an excerpt in its place.
`render` writes the conversation as the summary model reads it, clipped to
what its context window holds.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from contextlib import aclosing
from typing import Any

from ..canonical import thaw
from ..messages import AssistantMessage, Message, ToolResultMessage, Usage, UserMessage
from ..providers.base import ModelPort, ModelRequest, TextDelta, UsageChunk
from .tokens import estimate

log = logging.getLogger("corral.context")

SUMMARY_INSTRUCTIONS = (
    "You compact a conversation between a user and an AI assistant so that it can go on within a "
    "limited context window. Write a concise summary of the conversation you are given: what the user "
    "wants, what was decided and done, facts and results learned (tool results included), open "
    "questions, and what was about to happen next. Write it for the assistant, who will continue "
    "the conversation from your summary alone; no preamble."
)
RENDER_LIMIT = 4000  # characters of one message shown to the summary model


async def summarize(port: ModelPort, previous: str | None, messages: Sequence[Message]) -> tuple[str, Usage]:
    """Ask `port` for a summary of `messages` (after the `previous` summary), without streaming it
    anywhere: the text is collected, and only the summary is kept; with what the request used (as
    reported, else estimated)."""
    limit = _render_limit(port)
    text = render(previous, messages, limit)
    request = ModelRequest(SUMMARY_INSTRUCTIONS, (UserMessage(content=text),), ())
    parts: list[str] = []
    usage = Usage()
    async with aclosing(port.stream(request)) as chunks:
        async for chunk in chunks:
            if isinstance(chunk, TextDelta):
                parts.append(chunk.text)
            elif isinstance(chunk, UsageChunk):
                usage = usage + chunk.usage
    summary = "".join(parts).strip()
    if not usage.input_tokens and not usage.output_tokens:  # the provider said nothing: its estimate
        usage = Usage(estimate(SUMMARY_INSTRUCTIONS) + estimate(text), estimate(summary))
    if not summary:  # it answered with a tool call, or nothing: an excerpt stands in for the summary
        log.warning("the model asked for a summary answered none; an excerpt of the messages stands in")
        return excerpt(previous, messages), usage
    return summary, usage


def excerpt(previous: str | None, messages: Sequence[Message], each: int = 200) -> str:
    """The start of each message: what stands for a summary the model did not write."""
    lines = [previous] if previous else []
    for message in messages:
        if isinstance(message, ToolResultMessage):
            lines.append(f"- tool {message.name}: {_clip(message.content, each)}")
        elif message.content:
            lines.append(f"- {message.role}: {_clip(message.content, each)}")
    return "(an excerpt: no summary was written)\n" + "\n".join(lines)


def _render_limit(port: ModelPort) -> int | None:
    """Characters of conversation the summary model can read, when its window is known."""
    definition = getattr(port, "definition", None)
    window = getattr(definition, "context_window", None)
    if window is None:
        return None
    room = window - definition.max_output_tokens - estimate(SUMMARY_INSTRUCTIONS) - 64  # type: ignore[union-attr]
    return max(room, 256) * 4


def render(previous: str | None, messages: Sequence[Message], limit: int | None = None) -> str:
    """The conversation as the summary model reads it: one block per message, long ones clipped;
    beyond `limit` characters, the oldest blocks are left out (the previous summary is kept)."""
    blocks: list[str] = []
    for message in messages:
        if isinstance(message, UserMessage):
            blocks.append(f"User: {_clip(message.content)}")
        elif isinstance(message, AssistantMessage):
            calls = "".join(f"\n[called {c.name} {_clip(_arguments(c.arguments), 500)}]"
                            for c in message.tool_calls)
            blocks.append(f"Assistant: {_clip(message.content)}{calls}")
        elif isinstance(message, ToolResultMessage):
            status = " (error)" if message.is_error else ""
            result = _clip(message.content, RENDER_LIMIT // 2)
            blocks.append(f"Tool {message.name} returned{status}: {result}")
    head = f"Summary of the conversation before this part:\n{previous}\n\n" if previous else ""
    intro = "The conversation to summarize:\n\n"
    if limit is not None:
        room = limit - len(head) - len(intro)
        kept: list[str] = []
        for block in reversed(blocks):
            room -= len(block) + 2
            if room < 0:
                break
            kept.append(block)
        if len(kept) < len(blocks):
            kept.append(f"[{len(blocks) - len(kept)} older messages left out]")
        blocks = kept[::-1]
    return head + intro + "\n\n".join(blocks)


def _clip(text: str, limit: int = RENDER_LIMIT) -> str:
    return text if len(text) <= limit else text[:limit] + f"… [{len(text) - limit} more characters]"


def _arguments(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(thaw(arguments), ensure_ascii=False)
