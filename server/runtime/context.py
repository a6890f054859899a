"""Context management (contract §10): what each model request of a conversation carries.

A conversation's transcript keeps every message; a model request carries its
*view*: the agent's instructions and tools, then either the whole history or,
once the conversation was compacted, what the latest `ContextView` says (a
summary of the messages it left out, or a note that they were dropped, then
the messages after it, old tool results cut for `truncate`), then the
running turn's own messages.

Before each model request (`ContextWindow.prepare`), the tokens of the
request are counted. Over the agent's `context.threshold` of the model's
`context_window`, or too many to leave `max_output_tokens` for the answer,
the older history is compacted: `summarize` asks a model (the agent's, or
`context.model`) for a summary of the messages before the `keep_recent_turns`
turns preceding the running one (the previous summary included, so each
compaction summarizes only what is new), `truncate` cuts the tool results
there and then drops the oldest turns until the request is under the
threshold. The new view and its `context.compacted` event commit together
(`Store.save_context_view`, fenced like every write of the turn), so later
turns, another replica and a restarted server send the same view, and the
next compaction comes only once the view and the messages since cross the
threshold again. A request that still cannot fit fails the turn with
`context_window_exceeded` before anything is sent. A model without a
`context_window` is not managed (a view made by `POST …/compact` still
applies).

Token counts are kept per conversation in a `Ledger`, incrementally: each
message is estimated once (`tokens`), into running sums, so counting a
request costs the same in a conversation of 5 turns or 500. Where the
provider reported usage for the last request, `used` is its input tokens plus
the estimate of what was added since (`source: "actual"`); otherwise it is
the estimate of the whole view (`"estimated"`).

Cut points are turn starts (the first message of a turn), so a kept part
never begins with a tool result whose call was left out; message seqs are
1, 2, ... in each conversation (the store numbers them without gaps), so the
message at index i has seq i + 1 and a view's `upto_seq` is also the number
of messages it leaves out.
"""

from __future__ import annotations

import bisect
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from .. import tracing
from ..canonical import thaw
from ..compiler.definitions import Closure, ContextPolicy, ModelDefinition, ToolDefinition
from ..errors import RunError
from ..messages import Message, ToolResultMessage, Usage, UserMessage, repair_history
from ..providers.base import ModelPort
from ..store.base import ContextView, EventRecord
from ..tracing import names
from .summaries import summarize
from .tokens import estimate, estimate_messages

if TYPE_CHECKING:
    from ..messages import ToolSpec
    from ..store.base import Store
    from .events import EventHub
    from .transcripts import Transcripts

log = logging.getLogger("corral.context")


class Models(Protocol):
    """Where a summary's model comes from: the agent's own, or a named Model (`plans.Runtime`)."""

    def model(self, closure: Closure) -> ModelPort: ...

    def provider(self, model: ModelDefinition) -> ModelPort: ...

SUMMARY_HEAD = ("Summary of the earlier part of this conversation (its older messages were compacted to "
                "fit the context window):\n\n")
DROPPED_NOTE = "[{n} earlier messages of this conversation were left out to fit the context window]"
CUT_RESULT = "[tool result cut to fit the context window: {n} characters]"
CUT_TOKENS = estimate(CUT_RESULT.format(n=10**6))  # what a cut result still costs
COMPACTED = "context.compacted"

Commit = Callable[[ContextView, dict[str, Any]], Awaitable[None]]


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


class Contexts:
    """Every conversation's ledger here (the recent ones), and compaction itself."""

    SIZE = 1000

    def __init__(self, store: Store, runtime: Models, transcripts: Transcripts, hub: EventHub):
        self.store = store
        self.runtime = runtime
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

        return ContextWindow(self, ledger, closure, base, history, offset, turn_id, commit)

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

        compaction = Compaction(self, ledger, closure, self.base(closure), history, commit, turn_id=None)
        data = await compaction.run(strategy, kept=policy.keep_recent_turns, minimum=0)
        return {"compacted": data is not None, **(data or {}), "context": await self.usage(conversation_id,
                                                                                           closure)}

    # --- the summary model -----------------------------------------------------

    def summarizer(self, closure: Closure) -> ModelPort:
        name = closure.agent.context_policy.model
        if name is None:
            return self.runtime.model(closure)
        chain: list[ModelDefinition] = []

        def add(model_name: str) -> None:
            model = closure.get("Model", model_name)
            assert isinstance(model, ModelDefinition)
            if model not in chain:
                chain.append(model)
                for fallback in model.fallbacks:
                    add(fallback)

        add(name)
        ports = [self.runtime.provider(m) for m in chain]
        if len(ports) == 1:
            return ports[0]
        from ..providers.resilience import FallbackModel

        return FallbackModel(ports)


class ContextWindow:
    """One turn's requests: counted, compacted when they must be, refused when they cannot fit."""

    def __init__(self, contexts: Contexts, ledger: Ledger, closure: Closure, base: int,
                 history: Sequence[Message], offset: int, turn_id: str, commit: Commit):
        self.contexts = contexts
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
            compaction = Compaction(self.contexts, ledger, self.closure, self.base, self.history, self.commit,
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


class Compaction:
    """One compaction of a conversation's view: where to cut, the new view, and its commit."""

    def __init__(self, contexts: Contexts, ledger: Ledger, closure: Closure, base: int,
                 history: Sequence[Message], commit: Commit, *, turn_id: str | None):
        self.contexts = contexts
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
        port = self.contexts.summarizer(self.closure)
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
