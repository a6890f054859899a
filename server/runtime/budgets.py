"""Token budgets: an Agent's `budget` {max_tokens_per_turn, max_tokens_per_conversation}.

A turn's tokens are the input + output tokens of its model requests, as the
provider reported them (a request whose provider reported nothing counts its
estimate, `tokens`). `TurnSpend` checks the budget before each model request
(what the turn spent plus the request's estimated input) and after it (what
was spent); passing it fails the turn with `budget_exceeded`. The
conversation's earlier turns count by their stored `usage` (failed turns
included: what they spent is recorded too); `Spending` keeps that sum per
conversation, so a turn costs one store read of the turns that ended since.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..canonical import thaw
from ..compiler.definitions import AgentDefinition
from ..errors import RunError
from ..messages import AssistantMessage, ToolSpec, Usage
from ..statuses import ENDED_STATUSES
from .tokens import estimate, estimate_messages

if TYPE_CHECKING:
    from ..providers.base import ModelRequest
    from ..store.base import TurnJournal


@dataclass(frozen=True)
class Budget:
    per_turn: int | None = None
    per_conversation: int | None = None
    spent_before: int = 0  # the conversation's tokens before this turn

    @classmethod
    def of_agent(cls, agent: AgentDefinition) -> Budget | None:
        budget = agent.budget or {}
        turn, conversation = budget.get("max_tokens_per_turn"), budget.get("max_tokens_per_conversation")
        return None if turn is None and conversation is None else cls(turn, conversation)

    def check(self, turn_tokens: int, source: str, *, before: bool = False) -> None:
        """Raise `budget_exceeded` when `turn_tokens` passes a limit (`source`: actual or estimated;
        `before`: the tokens include the next model request, not sent yet)."""
        limits = (("max_tokens_per_turn", self.per_turn, turn_tokens, "turn"),
                  ("max_tokens_per_conversation", self.per_conversation, self.spent_before + turn_tokens,
                   "conversation"))
        for name, limit, used, of in limits:
            if limit is not None and used > limit:
                how = "would pass" if before else "passed"
                with_next = " with the next model request" if before else ""
                raise RunError(f"the {of} {how} its budget of {limit} tokens ({name}): {used} tokens"
                               f"{with_next} ({source})", code="budget_exceeded",
                               details={"budget": name, "limit": limit, "used": used, "source": source})


class TurnSpend:
    """What one turn spent, checked against its budget around each model request."""

    def __init__(self, budget: Budget | None, instructions: str, tools: Sequence[ToolSpec]):
        self.budget = budget
        self.spent = 0
        self._fixed: int | None = None
        self._instructions = instructions
        self._tools = tools
        self._request = 0  # the estimate of the request in flight

    def _estimate(self, request: ModelRequest) -> int:
        if self._fixed is None:
            specs = [{"name": t.name, "description": t.description, "input_schema": thaw(t.input_schema)}
                     for t in self._tools]
            self._fixed = estimate(self._instructions) + (estimate(json.dumps(specs)) if specs else 0)
        return self._fixed + estimate_messages(request.messages)

    def before(self, request: ModelRequest) -> None:
        if self.budget is not None:
            self._request = self._estimate(request)
            self.budget.check(self.spent + self._request, "estimated", before=True)

    def add(self, usage: Usage) -> None:
        """Tokens the turn spent besides its requests now (a compaction's summary, an earlier attempt)."""
        tokens = usage.input_tokens + usage.output_tokens
        self.spent += tokens
        if self.budget is not None and tokens:
            self.budget.check(self.spent, "actual")

    def after(self, usage: Usage, reply: AssistantMessage) -> None:
        if self.budget is None:
            return
        reported = usage.input_tokens + usage.output_tokens
        if reported:
            self.spent += reported
        else:  # the provider said nothing: its estimate counts
            self.spent += self._request + estimate_messages((reply,))
        self.budget.check(self.spent, "actual" if reported else "estimated")


def tokens_of(usage: dict[str, int] | None) -> int:
    usage = usage or {}
    return int(usage.get("input_tokens") or 0) + int(usage.get("output_tokens") or 0)


class Spending:
    """The tokens of each recent conversation's ended turns, kept up to date incrementally.

    The store stays the source of truth: each use reads the turns that ended after the last one
    counted (by this process or another), so the sum is never stale. It stops at a turn still
    running (the current one), to count it once it has ended.
    """

    SIZE = 1000
    PAGE = 1000

    def __init__(self, store: TurnJournal):
        self.store = store
        self._cache: OrderedDict[str, tuple[str | None, int]] = OrderedDict()

    async def before(self, conversation_id: str) -> int:
        last, total = self._cache.pop(conversation_id, (None, 0))
        while True:
            page = await self.store.list_turns(conversation_id, limit=self.PAGE, after=last)
            running = False
            for turn in page:
                if turn.status not in ENDED_STATUSES:
                    running = True
                    break
                total += tokens_of(turn.usage)
                last = turn.id
            if running or len(page) < self.PAGE:
                break
        self._cache[conversation_id] = (last, total)
        if len(self._cache) > self.SIZE:
            self._cache.popitem(last=False)
        return total
