"""Token counts without a tokenizer: an offline estimate, about four characters a token.

No tokenizer that downloads its tables at run time (many deployments have no
internet), and no provider's exact count: what is sent to a model is
estimated from its characters, rounded up, plus a few tokens of framing per
message. Where a provider reports usage, that count is the one that holds;
this estimate is for before a request is sent, and for providers that
report nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from ..canonical import thaw
from ..messages import AssistantMessage, Message

CHARS_PER_TOKEN = 4
PER_MESSAGE = 4  # the role and the framing every chat format wraps a message in


def estimate(text: str) -> int:
    """The tokens of `text`: its characters / 4, rounded up."""
    return -(-len(text) // CHARS_PER_TOKEN)


def estimate_messages(messages: Iterable[Message]) -> int:
    """The tokens of a transcript as a model request carries it (tool calls and results included)."""
    total = 0
    for message in messages:
        total += PER_MESSAGE + estimate(message.content)
        if isinstance(message, AssistantMessage):
            for call in message.tool_calls:
                total += estimate(call.name) + estimate(_text(call.arguments))
    return total


def _text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(thaw(arguments), ensure_ascii=False)
