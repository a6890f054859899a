"""Compaction (contract §10): one conversation's view made smaller, and committed.

Over the agent's `context.threshold` of the model's `context_window` (or with
too little room left for the answer), the older history is compacted:
`summarize` asks a model (the agent's, or `context.model`: `summary_model`)
for a summary of the messages before the `keep_recent_turns` turns preceding
the running one (the previous summary included, so each compaction
summarizes only what is new); `truncate` cuts the tool results there and
then drops the oldest turns until the request is under the threshold. The new
view and its `context.compacted` event are committed together by the caller's
`Commit` (fenced like every write of the turn). A compaction never makes the
view larger: a summary no smaller than what it replaces is dropped for
`truncate`.

Not responsible for when to compact (`context_window`, `POST …/compact`) or
for the summary prompt (`summaries`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

from .. import tracing
from ..compiler.definitions import Closure, ModelDefinition
from ..messages import Message, Usage
from ..providers.base import ModelPort
from ..store.base import ContextView
from ..tracing import names
from .context_views import head_tokens
from .summaries import summarize
from .token_ledger import Ledger, Limits

log = logging.getLogger("corral.context")

COMPACTED = "context.compacted"

Commit = Callable[[ContextView, dict[str, Any]], Awaitable[None]]


class Models(Protocol):
    """Where a summary's model comes from: the agent's own, or a named Model (`plans.Runtime`)."""

    def model(self, closure: Closure) -> ModelPort: ...

    def provider(self, model: ModelDefinition) -> ModelPort: ...


def summary_model(models: Models, closure: Closure) -> ModelPort:
    """The model that writes an agent's summaries: its `context.model` (with its fallbacks), else its own."""
    name = closure.agent.context_policy.model
    if name is None:
        return models.model(closure)
    chain: list[ModelDefinition] = []

    def add(model_name: str) -> None:
        model = closure.get("Model", model_name)
        assert isinstance(model, ModelDefinition)
        if model not in chain:
            chain.append(model)
            for fallback in model.fallbacks:
                add(fallback)

    add(name)
    ports = [models.provider(m) for m in chain]
    if len(ports) == 1:
        return ports[0]
    from ..providers.resilience import FallbackModel

    return FallbackModel(ports)


class Compaction:
    """One compaction of a conversation's view: where to cut, the new view, and its commit."""

    def __init__(self, models: Models, ledger: Ledger, closure: Closure, base: int,
                 history: Sequence[Message], commit: Commit, *, turn_id: str | None):
        self.models = models
        self.ledger = ledger
        self.closure = closure
        self.base = base
        self.history = history  # the stored transcript before any running turn: every cut is within it
        self.commit = commit
        self.turn_id = turn_id
        self.model = closure.model_chain()[0]
        self.limits = Limits.of(self.model, closure.agent.context_policy)
        self.usage = Usage()  # what its summary request used: the turn's budget counts it

    def _cut(self, kept: int, minimum: int) -> int | None:
        """Where the kept part begins: the start of the `kept`-th last turn, fewer while the kept part
        alone leaves no room; None when there is nothing older to compact."""
        ledger, upto = self.ledger, self.ledger.upto
        starts = ledger.starts

        def at(n: int) -> int:
            return (starts[-n] if n <= len(starts) else 0) if n > 0 else min(ledger.count, len(self.history))

        cut = at(kept)
        while kept > minimum and ledger.estimated(self.base, cut, cut, 0) > self.limits.room:
            kept -= 1
            cut = at(kept)
        cut = min(cut, len(self.history))
        return cut if cut > upto else None

    async def run(self, strategy: str, *, kept: int, minimum: int) -> dict[str, Any] | None:
        """Compact and commit; the event's data, or None when there was nothing to compact."""
        with tracing.span(*names.compaction(strategy)) as span:  # a summary's `chat` span inside
            data = await self._run(strategy, kept=kept, minimum=minimum)
            span.outcome("compacted" if data else "unchanged")
            span.update({f"corral.compaction.{k}": v for k, v in (data or {}).items() if k != "turn_id"})
            return data

    async def _run(self, strategy: str, *, kept: int, minimum: int) -> dict[str, Any] | None:
        ledger = self.ledger
        cut = self._cut(kept, minimum)
        if cut is None:
            return None
        before, source = ledger.used(self.base)
        made = self._truncate(cut) if strategy == "truncate" else await self._summarize(cut)
        if made is None:
            return None
        view, messages = made
        strategy = view.strategy  # a summary that did not help was dropped for `truncate`
        after = ledger.estimated(self.base, view.upto_seq, view.cut_seq, head_tokens(view))
        view = replace(view, tokens=after)
        data = {"turn_id": self.turn_id, "strategy": strategy, "before": before, "after": after,
                "messages": messages, "source": source}
        await self.commit(view, data)
        ledger.set_view(view)
        log.info("conversation %s compacted (%s): %d -> %d tokens, %d messages", ledger.conversation_id,
                 strategy, before, after, messages)
        return data

    def _new_view(self, **fields: Any) -> ContextView:
        return ContextView(conversation_id=self.ledger.conversation_id, number=self.ledger.number + 1,
                           created_at=time.time(), **fields)

    def _truncate(self, cut: int) -> tuple[ContextView, int] | None:
        """Cut the tool results before `cut`; then, while over the threshold, drop the oldest turns."""
        ledger = self.ledger
        upto, was_cut = ledger.upto, ledger.cut
        starts = [s for s in ledger.starts if upto < s <= cut]

        def tokens(drop: int) -> int:
            view = ContextView(conversation_id="", number=0, upto_seq=drop, cut_seq=cut)
            return ledger.estimated(self.base, drop, cut, head_tokens(view))

        drop, target = upto, min(self.limits.threshold, self.limits.room)
        while starts and tokens(drop) > target:
            drop = starts.pop(0)
        newly_cut = ledger.cuts[cut] - ledger.cuts[max(drop, was_cut)] if cut > max(drop, was_cut) else 0
        messages = (drop - upto) + newly_cut
        if messages == 0:
            return None
        return self._new_view(upto_seq=drop, cut_seq=cut, summary=None, strategy="truncate"), messages

    async def _summarize(self, cut: int) -> tuple[ContextView, int] | None:
        ledger = self.ledger
        upto = ledger.upto
        previous = ledger.view.summary if ledger.view is not None else None
        port = summary_model(self.models, self.closure)
        text, self.usage = await summarize(port, previous, self.history[upto:cut])
        was_cut = ledger.cut
        view = self._new_view(upto_seq=cut, cut_seq=was_cut if was_cut > cut else 0, summary=text,
                              strategy="summarize")
        # a compaction never makes the view larger: a summary no smaller than what it replaces goes
        if head_tokens(view) >= ledger.estimated(0, upto, ledger.cut, ledger.head) - ledger.estimated(
                0, cut, max(ledger.cut, cut), 0):
            log.warning("conversation %s: the summary is no smaller than what it replaces; truncating",
                        ledger.conversation_id)
            return self._truncate(cut)
        return view, cut - upto
