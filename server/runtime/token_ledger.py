"""A conversation's token account (contract §10): what its next model request will carry.

Token counts are kept per conversation in a `Ledger`, incrementally: each
message is estimated once (`tokens`), into running sums, so counting a
request costs the same in a conversation of 5 turns or 500. Where the
provider reported usage for the last request, `used` is its input tokens plus
the estimate of what was added since (`source: "actual"`); otherwise it is
the estimate of the whole view (`"estimated"`). `Limits` is what an account
is held against: where compaction starts, and what a request may carry.

Cut points are turn starts (the first message of a turn), so a kept part
never begins with a tool result whose call was left out; message seqs are
1, 2, ... in each conversation (the store numbers them without gaps), so the
message at index i has seq i + 1 and a view's `upto_seq` is also the number
of messages it leaves out.

Not responsible for reading the store (`context.Contexts` keeps each
conversation's ledger up to date) or for compacting (`compaction`).
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..canonical import thaw
from ..compiler.definitions import ContextPolicy, ModelDefinition
from ..messages import Message, ToolResultMessage
from ..store.base import ContextView
from .context_views import CUT_TOKENS, head_tokens
from .tokens import estimate, estimate_messages

if TYPE_CHECKING:
    from ..messages import ToolSpec


@dataclass
class Ledger:
    """One conversation's running token account (all counts estimated, message by message, once).

    `tokens[i]` is the estimate of the first i messages, `results[i]` of the content of the tool
    results among them, `cuts[i]` how many of them are tool results; `starts` holds the index of
    each turn's first message. `anchor` is the last reported usage: (messages the request carried,
    its input tokens, the view number it was made under).
    """

    conversation_id: str
    tokens: list[int] = field(default_factory=lambda: [0])
    results: list[int] = field(default_factory=lambda: [0])
    cuts: list[int] = field(default_factory=lambda: [0])
    starts: list[int] = field(default_factory=list)
    view: ContextView | None = None
    head: int = 0  # the tokens of what stands for the messages the view leaves out
    loaded: bool = False  # `view` was read from the store
    anchor: tuple[int, int, int] | None = None

    @property
    def count(self) -> int:
        return len(self.tokens) - 1

    @property
    def number(self) -> int:
        return self.view.number if self.view is not None else 0

    @property
    def upto(self) -> int:
        return min(self.view.upto_seq, self.count) if self.view is not None else 0

    @property
    def cut(self) -> int:
        return min(max(self.view.cut_seq, self.upto), self.count) if self.view is not None else 0

    def add(self, message: Message) -> None:
        result = isinstance(message, ToolResultMessage)
        self.tokens.append(self.tokens[-1] + estimate_messages((message,)))
        self.results.append(self.results[-1] + (estimate(message.content) if result else 0))
        self.cuts.append(self.cuts[-1] + result)

    def mark_start(self, index: int) -> None:
        if not self.starts or self.starts[-1] < index:
            self.starts.append(index)

    def sync(self, history: Sequence[Message], starts: Sequence[int]) -> None:
        """Count what was appended since (by this process or another); start over if it went back."""
        if len(history) < self.count:
            self.tokens, self.results, self.cuts, self.starts = [0], [0], [0], []
            self.anchor = None
        seen = self.count
        for message in history[seen:]:
            self.add(message)
        for start in starts[bisect.bisect_left(starts, seen):]:
            if start < len(history):
                self.mark_start(start)

    def set_view(self, view: ContextView | None) -> None:
        if view is not None and self.view is not None and view.number == self.view.number:
            return
        self.view = view
        self.head = head_tokens(view)
        self.anchor = None  # a count made under another view no longer says what a request carries

    def estimated(self, base: int, upto: int, cut: int, head: int) -> int:
        """The estimate of a request with this view: base, head, messages from `upto`, cut results."""
        total = base + head + self.tokens[-1] - self.tokens[upto]
        if cut > upto:
            cut_results = self.cuts[cut] - self.cuts[upto]
            total -= (self.results[cut] - self.results[upto]) - cut_results * CUT_TOKENS
        return total

    def used(self, base: int) -> tuple[int, str]:
        """The tokens of the next request (everything counted so far), and where the count comes from."""
        if self.anchor is not None and self.anchor[2] == self.number and self.anchor[0] <= self.count:
            carried, tokens, _ = self.anchor
            return tokens + self.tokens[-1] - self.tokens[carried], "actual"
        return self.estimated(base, self.upto, self.cut, self.head), "estimated"


def spec_tokens(instructions: str, tools: Sequence[ToolSpec]) -> int:
    """What a request carries besides its messages: the instructions and the tools' specs."""
    return estimate(instructions) + sum(
        estimate(t.name) + estimate(t.description) + estimate(json.dumps(thaw(t.input_schema)))
        for t in tools)


@dataclass(frozen=True)
class Limits:
    """Where compaction starts and what a request may carry, for one model and policy."""

    threshold: float  # tokens; inf: no automatic compaction
    room: float  # window - max_output_tokens; inf: no window

    @classmethod
    def of(cls, model: ModelDefinition, policy: ContextPolicy) -> Limits:
        window = model.context_window
        if window is None:
            return cls(float("inf"), float("inf"))
        threshold = policy.threshold * window if policy.strategy != "none" else float("inf")
        return cls(threshold, window - model.max_output_tokens)
