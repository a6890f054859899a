"""One turn's context window (contract §10): each model request counted, compacted when it must be.

Before each model request (`ContextWindow.prepare`), the tokens of the
request are counted in the conversation's ledger. Over the agent's
`context.threshold` of the model's `context_window`, or too many to leave
`max_output_tokens` for the answer, the older history is compacted
(`compaction`); a request that still cannot fit fails the turn with
`context_window_exceeded` before anything is sent. Under a view, a request
carries the view's history (`context_views.viewed`), then the turn's own
messages.

Not responsible for keeping ledgers or reading the store (`context.Contexts`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..compiler.definitions import Closure
from ..errors import RunError
from ..messages import Message, Usage
from .compaction import Commit, Compaction, Models
from .context_views import viewed
from .token_ledger import Ledger, Limits


class ContextWindow:
    """One turn's requests: counted, compacted when they must be, refused when they cannot fit."""

    def __init__(self, models: Models, ledger: Ledger, closure: Closure, base: int,
                 history: Sequence[Message], offset: int, turn_id: str, commit: Commit):
        self.models = models
        self.ledger = ledger
        self.closure = closure
        self.model = closure.model_chain()[0]
        self.policy = closure.agent.context_policy
        self.limits = Limits.of(self.model, self.policy)
        self.base = base
        self.history = history
        self.start = len(history)  # the index of the turn's first message
        self.offset = offset
        self.turn_id = turn_id
        self.commit = commit
        self._carried = 0
        self._kept: tuple[int, list[Message]] | None = None  # (view number, the history it keeps)
        self.spent = Usage()  # what its summary requests used, not yet counted by the turn (`take_spent`)

    async def prepare(self, messages: Sequence[Message]) -> tuple[Message, ...]:
        """The messages of the next request, after compacting if it must; raises
        `context_window_exceeded` when even that leaves no room for the answer."""
        own = messages[self.offset:]
        ledger = self.ledger
        if ledger.count < self.start:  # someone else's view of the store: catch up
            ledger.sync(self.history, ())
        for i in range(max(ledger.count, self.start), self.start + len(own)):
            ledger.add(own[i - self.start])
        if own:
            ledger.mark_start(self.start)
        used, _ = ledger.used(self.base)
        if used > self.limits.threshold or used > self.limits.room:
            await self._manage(used)
        self._carried = ledger.count
        return self._request(messages)

    def take_spent(self) -> Usage:
        """What summary requests used since the last call: the turn counts it as its own."""
        spent, self.spent = self.spent, Usage()
        return spent

    def observe(self, usage: Usage) -> None:
        """The provider's count of the request just made, where it reported one."""
        if usage.input_tokens > 0:
            self.ledger.anchor = (self._carried, usage.input_tokens, self.ledger.number)

    async def _manage(self, used: int) -> None:
        ledger, limits = self.ledger, self.limits
        own = ledger.tokens[-1] - ledger.tokens[min(self.start, ledger.count)]
        # compacting helps only if the running turn alone leaves room for the answer
        if self.policy.strategy != "none" and self.base + own <= limits.room:
            compaction = Compaction(self.models, ledger, self.closure, self.base, self.history, self.commit,
                                    turn_id=self.turn_id)
            try:
                await compaction.run(self.policy.strategy, kept=self.policy.keep_recent_turns + 1, minimum=1)
            finally:
                self.spent = self.spent + compaction.usage
            used, _ = ledger.used(self.base)
        if used > limits.room:
            window = self.model.context_window
            raise RunError(
                f"the request needs about {used} tokens, and model {self.model.name!r} has a context window "
                f"of {window} with {self.model.max_output_tokens} kept for its answer",
                code="context_window_exceeded",
                details={"window": window, "used": used, "max_output_tokens": self.model.max_output_tokens})

    def _request(self, messages: Sequence[Message]) -> tuple[Message, ...]:
        view = self.ledger.view
        if view is None or view.upto_seq > self.start:
            return tuple(messages)
        if self._kept is None or self._kept[0] != view.number:
            self._kept = (view.number, viewed(view, self.history))
        return (*self._kept[1], *messages[self.offset:])
