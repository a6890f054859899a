"""Context management (contract §10): what each model request of a conversation carries.

A conversation's transcript keeps every message; a model request carries its
*view*: the agent's instructions and tools, then either the whole history or,
once the conversation was compacted, what the latest `ContextView` says (a
summary of the messages it left out, or a note that they were dropped, then
the messages after it, old tool results cut for `truncate`), then the
running turn's own messages.

The parts, one module each: the token account (`token_ledger`), the view as
a request carries it (`context_views`), compaction (`compaction`, its
prompt in `summaries`) and one turn's window (`context_window`: counted
before each request, compacted when it must be, refused when it cannot
fit). A new view and its `context.compacted` event commit together
(`Store.save_context_view`, fenced like every write of the turn), so later
turns, another replica and a restarted server send the same view, and the
next compaction comes only once the view and the messages since cross the
threshold again. A model without a `context_window` is not managed (a view
made by `POST …/compact` still applies).

`Contexts` keeps each conversation's ledger here, in step with the store
(the recent ones), makes each turn's window, and answers the surfaces
(`GET …/context`, `POST …/compact`).
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..canonical import thaw
from ..compiler.definitions import Closure, ToolDefinition
from ..messages import Message
from ..store.base import ContextView, EventRecord
from .compaction import COMPACTED, Compaction, Models
from .context_window import ContextWindow
from .token_ledger import Ledger, spec_tokens
from .tokens import estimate

if TYPE_CHECKING:
    from ..messages import ToolSpec
    from ..store.base import ContextStore
    from .events import EventHub
    from .transcripts import Transcripts


class Contexts:
    """Every conversation's ledger here (the recent ones), each turn's window, and the surfaces."""

    SIZE = 1000

    def __init__(self, store: ContextStore, models: Models, transcripts: Transcripts, hub: EventHub):
        self.store = store
        self.models = models
        self.transcripts = transcripts
        self.hub = hub
        self._ledgers: OrderedDict[str, Ledger] = OrderedDict()
        self._bases: dict[str, int] = {}  # agent digest -> instructions + tools, as its last plan had them

    async def ledger(self, conversation_id: str, history: Sequence[Message] | None = None) -> Ledger:
        """The conversation's ledger, brought up to date with the store (`history`: already read)."""
        ledger = self._ledgers.pop(conversation_id, None) or Ledger(conversation_id)
        starts = self.transcripts.turn_starts(conversation_id)
        if history is None or starts is None:
            fresh = await self.transcripts.history(conversation_id)
            history = fresh if history is None else history
            starts = self.transcripts.turn_starts(conversation_id) or []
        ledger.sync(history, starts)
        # one process owns an embedded store: its views are all made here. Several replicas: any
        # of them may have compacted since
        if not ledger.loaded or not self.store.embedded:
            ledger.set_view(await self.store.get_context_view(conversation_id))
            ledger.loaded = True
        self._ledgers[conversation_id] = ledger
        if len(self._ledgers) > self.SIZE:
            self._ledgers.popitem(last=False)
        return ledger

    def forget(self, conversation_id: str | None = None) -> None:
        """What this process knows of a conversation's view may be stale (None: of every one)."""
        if conversation_id is None:
            for ledger in self._ledgers.values():
                ledger.loaded = False
        elif conversation_id in self._ledgers:
            self._ledgers[conversation_id].loaded = False

    def base(self, closure: Closure) -> int:
        """The instructions and tools of the agent's requests: as its last plan had them, else estimated
        from its definitions (MCP servers' tools are known once a turn has run)."""
        found = self._bases.get(closure.agent.digest)
        if found is not None:
            return found
        tools = [d for d in closure.members.values() if isinstance(d, ToolDefinition)]
        return estimate(closure.agent.instructions) + sum(
            estimate(d.name) + estimate(d.description) + estimate(json.dumps(thaw(d.input_schema)))
            for d in tools)

    # --- a turn --------------------------------------------------------------

    async def window(self, conversation_id: str, closure: Closure, instructions: str,
                     tools: Sequence[ToolSpec], history: Sequence[Message], offset: int, turn_id: str,
                     fence: int | None, flush: Callable[[], Awaitable[None]]) -> ContextWindow:
        """The window of one turn: `history` is the transcript before it (as stored), `offset` where the
        turn's own messages begin in the loop's list (after the history, repaired)."""
        base = self._bases[closure.agent.digest] = spec_tokens(instructions, tools)
        ledger = await self.ledger(conversation_id, history)

        async def commit(view: ContextView, data: dict[str, Any]) -> None:
            await flush()  # what the turn did before goes first
            await self.save(view, turn_id, data, fence)

        return ContextWindow(self.models, ledger, closure, base, history, offset, turn_id, commit)

    async def save(self, view: ContextView, holder: str, data: dict[str, Any], fence: int | None) -> None:
        now = time.time()
        seq = await self.store.save_context_view(view, holder, (COMPACTED, data), now, fence=fence)
        self.hub.publish(EventRecord(seq=seq, conversation_id=view.conversation_id, name=COMPACTED, data=data,
                                     created_at=now))
        ledger = self._ledgers.get(view.conversation_id)
        if ledger is not None:
            ledger.set_view(view)

    # --- surfaces --------------------------------------------------------------

    async def usage(self, conversation_id: str, closure: Closure) -> dict[str, Any]:
        """`GET …/context`: what the next model request will carry."""
        ledger = await self.ledger(conversation_id)
        model, policy = closure.model_chain()[0], closure.agent.context_policy
        used, source = ledger.used(self.base(closure))
        return {"window": model.context_window, "used": used, "source": source,
                "threshold": policy.threshold, "compactions": ledger.number, "strategy": policy.strategy}

    async def compact_now(self, conversation_id: str, closure: Closure, holder: str,
                          fence: int | None) -> dict[str, Any]:
        """`POST …/compact`: compact now, under the threshold too (the caller holds the conversation)."""
        history = await self.transcripts.history(conversation_id)
        ledger = await self.ledger(conversation_id, history)
        policy = closure.agent.context_policy
        strategy = policy.strategy if policy.strategy != "none" else "summarize"

        async def commit(view: ContextView, data: dict[str, Any]) -> None:
            await self.save(view, holder, data, fence)

        compaction = Compaction(self.models, ledger, closure, self.base(closure), history, commit,
                                turn_id=None)
        data = await compaction.run(strategy, kept=policy.keep_recent_turns, minimum=0)
        return {"compacted": data is not None, **(data or {}), "context": await self.usage(conversation_id,
                                                                                           closure)}
