"""Running one begun turn: drive the loop, persist as it goes, publish what was persisted.

Every event is written to the store first and published second, so a live
reader and a replaying one see the same sequence. Writes are batched, one
transaction per model step or tool result (`Journal`): text deltas wait at
most `Journal.WINDOW` to go with the next write, a step's deltas commit with
its message, a tool result with its `tool.finished`. Nothing a turn raises
escapes `TurnRunner.run`: its outcome is settled on the turn (a storage
failure fails it with `storage_error`, after the storage grace of the
patient store it writes through; a bug with `internal`), or it goes on
elsewhere (its lease was lost, or it was handed over at a checkpoint).

Not responsible for a turn's beginning (its row and `turn.started`) or its
ending (the last writes, its terminal event, the conversation let go): both
are `turn_lifecycle`'s, which runs this in the turn's task.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskGroup

from ..compiler.definitions import Closure
from ..errors import CorralError, LeaseLost, StorageError
from ..messages import Message, Usage, UserMessage, repair_history
from ..store.base import ConversationRecord
from ..tools.base import ToolContext
from ..tracing import TurnTrace
from ..turn_events import MessageDelta, PermissionRequested, ToolFinished, TurnEvent
from .active_turn import ActiveTurn, Completed, Failed, HandOff
from .checkpoints import Checkpoint
from .loop import Append, Done, Emit, Spent, run_turn
from .turn_traces import attempt_span

if TYPE_CHECKING:
    from ..metrics import Metrics
    from ..store.base import Store
    from .budgets import Spending
    from .context import Contexts
    from .events import EventHub
    from .plans import Runtime
    from .steering import Steering
    from .transcripts import Transcripts

log = logging.getLogger("corral.turns")


class TurnRunner:
    """Runs a begun turn's loop on this replica (its collaborators come from the composition root)."""

    def __init__(self, store: Store, runtime: Runtime, hub: EventHub, metrics: Metrics, *,
                 transcripts: Transcripts, spending: Spending, contexts: Contexts, steering: Steering):
        self.store = store  # a `PatientStore`: a turn outlasts a short outage of the store (§7)
        self.runtime = runtime
        self.hub = hub
        self.metrics = metrics
        self.transcripts = transcripts
        self.spending = spending  # each conversation's tokens, for budgets per conversation
        self.contexts = contexts  # what each request carries
        self.steering = steering  # messages steered into a running turn

    def journal(self, conversation_id: str, turn: ActiveTurn, timers: TaskGroup) -> Journal:
        """The turn's writer (`timers`: where its delayed flushes run, until its ending is written)."""
        return Journal(self.store, self.hub, conversation_id, turn, timers)

    async def run(self, conversation: ConversationRecord, closure: Closure, active: ActiveTurn,
                  journal: Journal, resumed: Checkpoint | None = None) -> None:
        """Run a begun turn, or (`resumed`) the next attempt of one taken over from a stopped replica, to
        its outcome (settled on `active`). Raises nothing but cancellation; the caller ends the turn."""
        async with attempt_span(active.trace or TurnTrace.begin(), active, self.runtime.secrets.redactor):
            try:
                await self._run(conversation, closure, active, journal, resumed)
                await journal.flush()
            except LeaseLost:
                active.goes_on_elsewhere("lost")
            except HandOff:
                active.goes_on_elsewhere("handed_over")
            except CorralError as exc:
                active.settle(Failed(exc.envelope()["error"], usage=active.usage))
            except Exception:  # a bug must fail this turn, not the task group every turn runs in
                log.exception("turn %s failed unexpectedly", active.id)
                active.settle(Failed({"code": "internal", "message": "internal error during the turn"},
                                     usage=active.usage))

    async def _run(self, conversation: ConversationRecord, closure: Closure, active: ActiveTurn,
                   journal: Journal, resumed: Checkpoint | None) -> None:
        turn = active.record
        if resumed is None:
            history = await self.transcripts.history(conversation.id)
        else:
            history = list(resumed.history)
        context = ToolContext(conversation_id=conversation.id, turn_id=turn.id, agent=turn.agent,
                              digest=turn.digest, root=closure.root, environ=self.runtime.environ,
                              channel=TurnChannel(self.store, self.hub, conversation.id, active, journal),
                              files=self.runtime.files)
        past = tuple(repair_history(history))
        # transcript: the conversation so far, as hooks' transcript_path shows it while the turn runs
        plan = await self.runtime.plan(closure, past, turn.input, context,
                                       transcript=lambda: (*past, *(active.messages or ())))
        if resumed is not None:
            plan = replace(plan, resumed=resumed.messages, started=resumed.started, unknown=resumed.unknown,
                           used=resumed.usage)
            active.usage = resumed.usage
        if active.output is not None:  # the request's own schema, for this turn (the OpenAI route's)
            plan = replace(plan, output=active.output)
        if plan.budget is not None and plan.budget.per_conversation is not None:
            spent = await self.spending.before(conversation.id)
            plan = replace(plan, budget=replace(plan.budget, spent_before=spent))
        window = await self.contexts.window(conversation.id, closure, plan.instructions,
                                            [t.spec for t in plan.tools.values()], history, len(past),
                                            turn.id, active.fence, journal.flush)
        plan = replace(plan, window=window,
                       steers=lambda: self.steering.pick_up(conversation.id, active, journal.flush))
        async for event in run_turn(plan):
            await self._handle(active, journal, event)

    async def _handle(self, active: ActiveTurn, journal: Journal, event: Any) -> None:
        if isinstance(event, Emit):
            # a delta waits for company; a tool's result goes with the message that follows it
            emitted = event.event
            await journal.event(emitted, later=isinstance(emitted, MessageDelta | ToolFinished))
            if isinstance(emitted, ToolFinished):
                self.metrics.tool_calls.inc(emitted.tool, "error" if emitted.is_error else "ok")
        elif isinstance(event, Append):
            # the turn's own prompt waits, like a delta, for the model's first step (one transaction
            # less per turn); an attempt that stops before it commits starts over from the turn's input
            await journal.message(event.message, later=isinstance(event.message, UserMessage))
            active.append(event.message)
            if active.hand_off:  # a checkpoint: a stopping replica hands the turn over here
                raise HandOff
        elif isinstance(event, Spent):
            active.usage = journal.usage = event.usage  # committed with the turn's next write
        elif isinstance(event, Done):
            active.settle(Completed(event.output, event.stop_reason, event.usage, event.structured))


class Journal:
    """A turn's writes, batched into as few transactions as a live stream allows.

    Text deltas and the prompt wait, at most `WINDOW` seconds, to be committed with the next write: the
    step's message, or the next deltas once the window has passed. Everything else commits at once,
    with what waits. One lock orders the commits, so events keep the order they were made in.
    """

    WINDOW = 0.02

    def __init__(self, store: Store, hub: EventHub, conversation_id: str, active: ActiveTurn,
                 timers: TaskGroup):
        self.store = store
        self.hub = hub
        self.conversation_id = conversation_id
        self.active = active
        self.timers = timers
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.messages: list[Message] = []
        self.failed: Exception | None = None  # a timed flush that could not commit
        self.usage: Usage | None = None  # the turn's usage so far, once it changed
        self._written: Usage | None = None  # ... as last committed
        self._timer = False
        self._lock = anyio.Lock()

    async def event(self, event: TurnEvent, *, later: bool = False) -> None:
        self.events.append(event.wire())
        await self._commit(later)

    async def message(self, message: Message, *, later: bool = False) -> None:
        self.messages.append(message)
        await self._commit(later)

    async def _commit(self, later: bool) -> None:
        """Now, or (`later`) with the next write, or once `WINDOW` has passed, whichever comes first."""
        if not later:
            await self.flush()
        elif not self._timer:
            self._timer = True
            self.timers.start_soon(self._flush_later)

    async def _flush_later(self) -> None:
        await anyio.sleep(self.WINDOW)
        self._timer = False
        try:
            await self.flush()
        except Exception as exc:  # the turn's next write fails with it, not the task group turns run in
            if not isinstance(exc, StorageError | LeaseLost):
                log.exception("turn %s: a delayed write failed", self.active.id)
            self.failed = exc

    async def flush(self) -> None:
        async with self._lock:
            if self.failed is not None:
                failed, self.failed = self.failed, None
                raise failed
            if not self.events and not self.messages:
                return
            events, self.events = self.events, []
            messages, self.messages = self.messages, []
            now = time.time()
            usage = self.usage if self.usage != self._written else None
            seqs = await self.store.append(self.conversation_id, self.active.id, messages, events, now,
                                           fence=self.active.fence,
                                           usage=None if usage is None else usage.to_json())
            self._written = usage or self._written
            self.hub.committed(self.conversation_id, list(zip(seqs, events, strict=True)), now)


class TurnChannel:
    """A turn's way back from its tool calls: events, the waiting status, and its lease."""

    def __init__(self, store: Store, hub: EventHub, conversation_id: str, active: ActiveTurn,
                 journal: Journal):
        self.store = store
        self.hub = hub
        self.conversation_id = conversation_id
        self.active = active
        self.turn_id = active.id
        self.journal = journal

    async def emit(self, event: TurnEvent) -> None:
        await self.journal.event(event)
        if isinstance(event, PermissionRequested):
            self.active.ask(event)

    async def waiting(self, on: bool) -> None:
        await self.store.update_turn(self.turn_id, status="waiting" if on else "running",
                                     fence=self.active.fence)
        status = "waiting" if on else "busy"
        await self.store.set_conversation_status(self.conversation_id, status, time.time())
        self.hub.status(self.conversation_id, status)

    async def confirm(self) -> None:
        """Right before a side effect (a tool call, a hook, acting on a permission decision): raise
        `LeaseLost` unless this replica still holds the turn under its fence (§9). Fenced writes
        alone would let a replica paused past its lease run a tool before its next write finds out
        that another replica took the turn over (and recorded that call's outcome as unknown). One
        process on the embedded store holds every turn it runs: nothing to ask."""
        store, fence = self.store, self.active.fence
        if store.embedded or fence is None:
            return
        holder = await store.holder(self.conversation_id)
        if holder is None or (holder.turn_id, holder.replica, holder.fence) != (self.turn_id, store.replica,
                                                                                fence):
            raise LeaseLost(f"turn {self.turn_id} no longer holds conversation {self.conversation_id}"
                            f" under fence {fence}")
