"""A compacted view as a model request carries it (contract §10).

A `ContextView` (the store's row) says which of a conversation's messages a
request leaves out (`upto_seq`), which older tool results it cuts
(`cut_seq`) and the summary that stands for what it left out. `viewed`
renders the history under it: a head message (the summary, or a note that
messages were dropped), then the messages after it, old tool results cut,
tool calls left unanswered answered.

Not responsible for deciding when or how to compact (`compaction`) or for
counting tokens (`token_ledger`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..messages import Message, ToolResultMessage, UserMessage, repair_history
from ..store.base import ContextView
from .tokens import estimate, estimate_messages

SUMMARY_HEAD = ("Summary of the earlier part of this conversation (its older messages were compacted to "
                "fit the context window):\n\n")
DROPPED_NOTE = "[{n} earlier messages of this conversation were left out to fit the context window]"
CUT_RESULT = "[tool result cut to fit the context window: {n} characters]"
CUT_TOKENS = estimate(CUT_RESULT.format(n=10**6))  # what a cut result still costs


def head_tokens(view: ContextView | None) -> int:
    head = head_message(view)
    return estimate_messages((head,)) if head is not None else 0


def head_message(view: ContextView | None) -> UserMessage | None:
    """What the model is told of the messages a view leaves out."""
    if view is None:
        return None
    if view.summary:
        return UserMessage(content=SUMMARY_HEAD + view.summary)
    if view.upto_seq > 0:
        return UserMessage(content=DROPPED_NOTE.format(n=view.upto_seq))
    return None


def viewed(view: ContextView | None, history: Sequence[Message]) -> list[Message]:
    """The history as a request carries it under `view` (tool calls left unanswered answered)."""
    if view is None:
        return repair_history(list(history))
    upto = min(view.upto_seq, len(history))
    kept = list(history[upto:])
    for i in range(max(view.cut_seq - upto, 0)):
        message = kept[i] if i < len(kept) else None
        if isinstance(message, ToolResultMessage):
            kept[i] = replace(message, content=CUT_RESULT.format(n=len(message.content)))
    head = head_message(view)
    return [*([head] if head is not None else []), *repair_history(kept)]
