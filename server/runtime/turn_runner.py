"""Running one turn: drive the loop, persist as it goes, publish what was persisted.

Every event is written to the store first and published second, so a live
reader and a replaying one see the same sequence. Writes are batched, one
transaction per model step or tool result (`Journal`): the start is one
(turn, status, `turn.started`), text deltas wait at most `Journal.WINDOW`
to go with the next write, a step's deltas commit with its message, a tool
result with its `tool.finished`, and the end is one (turn, its last event,
status, the conversation released). A turn ends in exactly one
of `turn.completed`, `turn.failed` (with the error envelope) or
`turn.cancelled`; `finish` writes that ending even when the turn was
cancelled, under a shield. Nothing a turn raises escapes it: a storage
failure fails the turn with `storage_error` (a store that cannot be reached
is tried again for the storage grace first, `patience`), a bug with `internal`. An
ending the store could not take is kept (`ActiveTurn.ending`, so the waiting
client still gets it) and written once the store is writable again
(`record_unrecorded`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

import anyio
from anyio.abc import TaskGroup

from ..compiler.definitions import Closure
from ..errors import CorralError, LeaseLost, StorageError
from ..messages import Message, Usage, UserMessage, repair_history
from ..store.base import ConversationRecord, EventRecord, TurnRecord
from ..tools.base import ToolContext
from ..tracing import TurnTrace
from .active_turn import ActiveTurn, Completed, Ending, Failed, HandOff, ending_of
from .budgets import Spending
from .checkpoints import Checkpoint
from .context import Contexts
from .loop import Append, Done, Emit, Spent, run_turn
from .patience import PatientStore
from .transcripts import Transcripts
from .turn_traces import attempt_span

if TYPE_CHECKING:
    from ..metrics import Metrics
    from ..store.base import Store
    from .events import EventHub
    from .plans import Runtime

log = logging.getLogger("corral.turns")


class TurnRunner:
    def __init__(self, store: Store, runtime: Runtime, hub: EventHub, metrics: Metrics, *,
                 storage_grace_s: float = 30.0):
        # a turn outlasts a short outage of the store (§7): it retries what it could not write
        self.store = cast("Store", PatientStore(store, storage_grace_s))
        self.runtime = runtime
        self.hub = hub
        self.metrics = metrics
        self.transcripts = Transcripts(store)
        self.spending = Spending(store)  # each conversation's tokens, for budgets per conversation
        self.contexts = Contexts(store, runtime, self.transcripts, hub)  # what each request carries
        self.steered: set[str] = set()  # turns here that may have steered messages to pick up
        self.unrecorded: list[Ending] = []  # endings the store could not take (see `finish`)

    def new_turn(self, conversation: ConversationRecord, closure: Closure, text: str,
                 key: str | None, turn_id: str, request_digest: str | None = None) -> TurnRecord:
        return TurnRecord(
            id=turn_id, conversation_id=conversation.id, agent=closure.agent.name,
            digest=closure.agent.digest, status="running", input=text, idempotency_key=key,
            request_digest=request_digest if key else None, started_at=time.time(),
        )

    async def never_ran(self, active: ActiveTurn) -> ActiveTurn:
        """Record a turn cancelled while it waited for its slot: started and cancelled, nothing run."""
        turn = active.record
        now = time.time()
        ending = ending_of(turn, active.final_outcome(), now)
        await self.store.create_turn(replace(turn, **ending.changes))
        events = [("turn.started", {"turn_id": turn.id, "digest": turn.digest, "agent": turn.agent,
                                    **TurnTrace.begin().fields()}),
                  (ending.event, ending.data)]
        seqs = await self.store.append(turn.conversation_id, turn.id, [], events, now)
        self.publish(turn.conversation_id, list(zip(seqs, events, strict=True)), now)
        active.begin(seqs[0])
        active.end(ending)
        self.metrics.turns.inc(turn.agent, ending.changes["status"])
        return active

    def publish(self, conversation_id: str, events: list[tuple[int, tuple[str, dict[str, Any]]]],
                now: float) -> None:
        """Committed events, to this replica's live readers (the store tells the other replicas)."""
        for seq, (name, data) in events:
            self.hub.publish(EventRecord(seq=seq, conversation_id=conversation_id, name=name, data=data,
                                         created_at=now))

    def publish_status(self, conversation_id: str, status: str) -> None:
        self.hub.publish_global("conversation.status",
                                {"conversation_id": conversation_id, "status": status})

    async def set_status(self, conversation_id: str, status: str) -> None:
        await self.store.set_conversation_status(conversation_id, status, time.time())
        self.publish_status(conversation_id, status)

    async def run(self, conversation: ConversationRecord, closure: Closure, active: ActiveTurn,
                  task_status: Any, *, resumed: Checkpoint | None = None) -> None:
        """Run a new turn, or (`resumed`) the next attempt of one taken over from a stopped replica."""
        turn = active.record
        if resumed is None:
            now = time.time()
            trace = TurnTrace.begin()  # the request's trace, if it named one; kept for every attempt
            started = ("turn.started", {"turn_id": turn.id, "digest": turn.digest, "agent": turn.agent,
                                        **trace.fields()})
            seq = await self.store.begin_turn(turn, started, now)
            self.publish_status(conversation.id, "busy")
            self.publish(conversation.id, [(seq, started)], now)
            active.begin(seq)
        else:
            trace = resumed.trace or TurnTrace.begin()
            active.begin(resumed.started_seq)
            assert active.messages is not None
            active.messages.extend(resumed.messages)
        self.metrics.busy.inc(amount=1)
        task_status.started()
        # errors are settled inside the task group, which would wrap them in an exception group
        async with attempt_span(trace, active, self.runtime.secrets.redactor), \
                anyio.create_task_group() as flushes:
            journal = Journal(self, conversation.id, active, flushes)
            try:
                await self._run(conversation, closure, active, journal, resumed)
                await journal.flush()
            except LeaseLost:
                active.stopped = "lost"
            except HandOff:
                active.stopped = "handed_over"
            except CorralError as exc:
                active.settle(Failed(exc.envelope()["error"], usage=active.usage))
            except Exception:  # a bug must fail this turn, not the task group every turn runs in
                log.exception("turn %s failed unexpectedly", turn.id)
                active.settle(Failed({"code": "internal", "message": "internal error during the turn"},
                                     usage=active.usage))
            finally:
                with anyio.CancelScope(shield=True):
                    try:
                        await journal.flush()  # deltas still waiting, also when cancelled
                    except LeaseLost:
                        active.stopped = "lost"
                    except StorageError as exc:
                        active.settle(Failed(exc.envelope()["error"]))
                if active.hand_off and active.outcome is None and active.stopped is None:
                    active.stopped = "handed_over"  # cut off at the grace's end: the next attempt goes on
                flushes.cancel_scope.cancel()

    async def _run(self, conversation: ConversationRecord, closure: Closure, active: ActiveTurn,
                   journal: Journal, resumed: Checkpoint | None) -> None:
        turn = active.record
        if resumed is None:
            history = await self.transcripts.history(conversation.id)
        else:
            history = list(resumed.history)
        context = ToolContext(conversation_id=conversation.id, turn_id=turn.id, agent=turn.agent,
                              digest=turn.digest, root=closure.root, environ=self.runtime.environ,
                              channel=_Channel(self, conversation.id, active, journal),
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
        plan = replace(plan, window=window, steers=lambda: self._steered(conversation.id, active, journal))
        async for event in run_turn(plan):
            await self._handle(active, journal, event)

    async def _steered(self, conversation_id: str, active: ActiveTurn, journal: Journal) -> list[Message]:
        """Messages steered into the turn since its last model request (`if_busy: steer`), now in its
        transcript with their `message.steered` events (one transaction, after what waited)."""
        if active.id not in self.steered:
            return []
        self.steered.discard(active.id)
        await journal.flush()
        now = time.time()
        taken = await self.store.take_steers(conversation_id, active.id, now, fence=active.fence)
        self.publish(conversation_id, [(seq, ("message.steered", {"turn_id": active.id, "content": content}))
                                       for content, seq in taken], now)
        messages: list[Message] = [UserMessage(content=content) for content, _ in taken]
        for message in messages:
            active.append(message)
        return messages

    async def _handle(self, active: ActiveTurn, journal: Journal, event: Any) -> None:
        if isinstance(event, Emit):
            # a delta waits for company; a tool's result goes with the message that follows it
            later = event.name in ("message.delta", "tool.finished")
            await journal.event(event.name, event.data, later=later)
            if event.name == "tool.finished":
                outcome = "error" if event.data["is_error"] else "ok"
                self.metrics.tool_calls.inc(event.data["name"], outcome)
        elif isinstance(event, Append):
            await journal.message(event.message)
            active.append(event.message)
            if active.hand_off:  # a checkpoint: a stopping replica hands the turn over here
                raise HandOff
        elif isinstance(event, Spent):
            active.usage = journal.usage = event.usage  # committed with the turn's next write
        elif isinstance(event, Done):
            active.settle(Completed(event.output, event.stop_reason, event.usage, event.structured))

    async def finish(self, conversation: ConversationRecord, active: ActiveTurn) -> None:
        """Record how the turn ended; runs shielded, whatever happened."""
        turn = active.record
        now = time.time()
        if active.stopped is not None:  # it goes on elsewhere: no ending here
            await self._stop_here(active)
            return
        ending = ending_of(turn, active.final_outcome(), now)
        ending.fence = active.fence
        try:
            await self._record(ending)
        except LeaseLost:  # taken over while it ended: the new holder writes the ending
            active.stopped = "lost"
            await self._stop_here(active)
            return
        except StorageError:
            log.error("could not record the end of turn %s: kept until the store is writable", turn.id)
            self.unrecorded.append(ending)
        except Exception:
            log.exception("could not record the end of turn %s", turn.id)
        finally:
            active.end(ending)
            self.metrics.busy.inc(amount=-1)
            self.metrics.turns.inc(turn.agent, ending.changes["status"])
            self.metrics.turn_duration.observe(now - turn.started_at, turn.agent)

    async def _stop_here(self, active: ActiveTurn) -> None:
        turn = active.record
        if active.stopped == "handed_over" and active.fence is not None:
            try:
                await self.store.hand_over(turn.conversation_id, turn.id, active.fence)
                log.info("turn %s handed over: another replica (or the next start) goes on with it", turn.id)
            except (StorageError, LeaseLost):
                log.warning("could not hand turn %s over; its lease lapses on its own", turn.id)
        else:
            log.warning("turn %s: another replica took it over (this one's lease lapsed)", turn.id)
        active.stop_here(active.stopped or "lost")
        self.metrics.busy.inc(amount=-1)

    async def _record(self, ending: Ending) -> None:
        """The ending's writes, one transaction (the conversation is released with them)."""
        now = time.time()
        event = (ending.event, ending.data)
        seq = await self.store.end_turn(ending.turn_id, ending.conversation_id, ending.changes, event, now,
                                        fence=ending.fence)
        ending.done = 1
        self.publish(ending.conversation_id, [(seq, event)], now)
        self.publish_status(ending.conversation_id, "idle")

    async def record_unrecorded(self) -> None:
        """The store is writable again: write the endings it could not take."""
        pending, self.unrecorded = self.unrecorded, []
        for ending in pending:
            try:
                await self._record(ending)
            except StorageError:
                self.unrecorded.append(ending)
            except LeaseLost:  # taken over meanwhile: the new holder writes its ending
                pass


class Journal:
    """A turn's writes, batched into as few transactions as a live stream allows.

    Text deltas wait, at most `WINDOW` seconds, to be committed with the next write: the step's
    message, or the next deltas once the window has passed. Everything else commits at once, with
    what waits. One lock orders the commits, so events keep the order they were made in.
    """

    WINDOW = 0.02

    def __init__(self, runner: TurnRunner, conversation_id: str, active: ActiveTurn, flushes: TaskGroup):
        self.runner = runner
        self.conversation_id = conversation_id
        self.active = active
        self.flushes = flushes
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.messages: list[Message] = []
        self.failed: StorageError | LeaseLost | None = None  # a timed flush that could not commit
        self.usage: Usage | None = None  # the turn's usage so far, once it changed
        self._written: Usage | None = None  # ... as last committed
        self._timer = False
        self._lock = anyio.Lock()

    async def event(self, name: str, data: dict[str, Any], *, later: bool = False) -> None:
        self.events.append((name, data))
        if not later:
            await self.flush()
        elif not self._timer:
            self._timer = True
            self.flushes.start_soon(self._flush_later)

    async def message(self, message: Message) -> None:
        self.messages.append(message)
        await self.flush()

    async def _flush_later(self) -> None:
        await anyio.sleep(self.WINDOW)
        self._timer = False
        try:
            await self.flush()
        except (StorageError, LeaseLost) as exc:  # the turn's next write fails with it
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
            seqs = await self.runner.store.append(self.conversation_id, self.active.id, messages, events, now,
                                                  fence=self.active.fence,
                                                  usage=None if usage is None else usage.to_json())
            self._written = usage or self._written
            self.runner.publish(self.conversation_id, list(zip(seqs, events, strict=True)), now)


class _Channel:
    """A turn's way back from its tool calls: events, the waiting status, and its lease."""

    def __init__(self, runner: TurnRunner, conversation_id: str, active: ActiveTurn, journal: Journal):
        self.runner = runner
        self.conversation_id = conversation_id
        self.active = active
        self.turn_id = active.id
        self.journal = journal

    async def emit(self, name: str, data: dict[str, Any]) -> None:
        await self.journal.event(name, data)
        if name == "permission.requested":
            self.active.ask(data)

    async def waiting(self, on: bool) -> None:
        await self.runner.store.update_turn(self.turn_id, status="waiting" if on else "running",
                                            fence=self.active.fence)
        await self.runner.set_status(self.conversation_id, "waiting" if on else "busy")

    async def confirm(self) -> None:
        """Right before a side effect (a tool call, a hook, acting on a permission decision): raise
        `LeaseLost` unless this replica still holds the turn under its fence (§9). Fenced writes
        alone would let a replica paused past its lease run a tool before its next write finds out
        that another replica took the turn over (and recorded that call's outcome as unknown). One
        process on the embedded store holds every turn it runs: nothing to ask."""
        store, fence = self.runner.store, self.active.fence
        if store.embedded or fence is None:
            return
        holder = await store.holder(self.conversation_id)
        if holder is None or (holder.turn_id, holder.replica, holder.fence) != (self.turn_id, store.replica,
                                                                                fence):
            raise LeaseLost(f"turn {self.turn_id} no longer holds conversation {self.conversation_id}"
                            f" under fence {fence}")
