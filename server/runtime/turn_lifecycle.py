"""A turn's lifecycle on this replica: admitted, begun, run in the service's task group, ended once.

A new turn first enters its conversation (`admission`: one at a time, under
the busy policy), then is *begun*: its row and its `turn.started` are
written in one transaction (`begin`). Only then does it exist: it gets a
task in the service's task group (so a client that disconnects cancels
nothing), counts in `corral_busy_conversations`, and publishes events. A
turn whose first write fails never existed: the caller gets the error, the
conversation is let go, and there is no task, gauge or event to undo. A
turn taken over from a stopped replica (`resume`) is begun from its
checkpoint; one superseded by a later `interrupt` before it could run is
recorded as started and cancelled at once (`_never_ran`).

Every turn ends in `end`, once, whatever stopped it (its outcome, a cancel,
a failed write, a stop): the only cleanup shielded from cancellation. It
writes what the turn still had waiting and its terminal event (or hands it
over, when it goes on elsewhere), lets the conversation go, and leaves each
message steered into it and not picked up a turn of its own. An ending the
store could not take is kept (`ActiveTurn.ending`, so the waiting client
still gets it) and written once the store is writable again
(`record_unrecorded`).

Not responsible for what a turn does (`turn_runner`, `loop`), for requests'
keys and steering decisions (`conversations`), or for reading results.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING

import anyio
from anyio.abc import TaskGroup

from ..compiler.definitions import Closure
from ..errors import (
    ConversationNotFound,
    IdempotencyKeyReused,
    LeaseLost,
    Overloaded,
    StorageError,
)
from ..ids import new_id
from ..store.base import ConversationRecord, TurnRecord
from ..tracing import TurnTrace
from ..turn_events import TurnStarted
from .active_turn import ActiveTurn, Ending, Failed, ending_of
from .admission import KeyTaken, Superseded
from .checkpoints import Checkpoint, checkpoint_of
from .structured import OutputSchema
from .turn_runner import Journal, TurnRunner

if TYPE_CHECKING:
    from ..deployment.registry import Registry
    from ..metrics import Metrics
    from ..store.base import Store
    from .admission import Admission
    from .elsewhere import TurnsElsewhere
    from .events import EventHub
    from .idempotency import IdempotencyKeys
    from .steering import Steering

log = logging.getLogger("corral.conversations")


class TurnLifecycle:
    """Turns on this replica, from admission to their one ending (collaborators from the composition root)."""

    def __init__(self, store: Store, registry: Registry, runner: TurnRunner, admission: Admission,
                 keys: IdempotencyKeys, steering: Steering, elsewhere: TurnsElsewhere, hub: EventHub,
                 metrics: Metrics, *, turn_store: Store):
        self.store = store
        self.turn_store = turn_store  # what a turn writes (patient, as the runner's: `patience`)
        self.registry = registry
        self.runner = runner
        self.admission = admission
        self.keys = keys
        self.steering = steering
        self.elsewhere = elsewhere
        self.hub = hub
        self.metrics = metrics
        self.accepting = True
        self.unrecorded: list[Ending] = []  # endings the store could not take (see `_record_end`)
        self._tg: TaskGroup | None = None

    async def run(self, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """Own the task group turns run in, until cancelled."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            task_status.started()
            await anyio.sleep_forever()

    @property
    def tg(self) -> TaskGroup:
        assert self._tg is not None, "turns run once `run` has started"
        return self._tg

    def running_turns(self) -> list[ActiveTurn]:
        return self.admission.running_turns()

    def check_open(self) -> None:
        """Refuse a new turn while the server stops, or beyond this replica's cap (503 `overloaded`)."""
        if not self.accepting:
            raise Overloaded("the server is shutting down")
        self.admission.check_capacity()

    # --- a new turn ----------------------------------------------------------

    async def start(self, conversation: ConversationRecord, text: str, if_busy: str | None,
                    key: str | None = None, asked: str | None = None,
                    output: OutputSchema | None = None) -> ActiveTurn:
        """Admit, begin and run a new turn; returns once it is begun (or found to have been superseded,
        or, for a key another request holds, joined)."""
        closure = await self.registry.resolve(conversation.agent)
        turn = ActiveTurn(record=_new_record(conversation, closure, text, key, new_id("turn"), asked),
                          output=output)
        try:
            policy = if_busy or closure.agent.on_busy
            turn.fence = await self.admission.enter(conversation.id, turn.id, policy, key=key, request=asked)
        except Superseded:  # admission let the conversation go
            turn.record = _new_record(conversation, closure, text, key, turn.id, asked)
            await self.end(conversation.id, turn, superseded=True)
            return turn
        except KeyTaken as taken:  # another replica's request holds the key, or it just ended
            if taken.request is not None and taken.request != asked:
                raise IdempotencyKeyReused("this Idempotency-Key was used with a different request body",
                                           details={"turn_id": taken.turn_id}) from None
            return await self.elsewhere.joined(conversation.id, taken.turn_id, self.tg)
        try:
            if not self.accepting:  # shutdown began while this turn waited for its slot
                raise Overloaded("the server is shutting down")
            conversation = await self._current(conversation.id)
            # what is current now that it is our turn
            closure = await self.registry.resolve(conversation.agent)
            turn.record = _new_record(conversation, closure, text, key, turn.id, asked)
            self.admission.start(conversation.id, turn)
            await self.begin(conversation.id, turn)
        except Superseded:
            await self.end(conversation.id, turn, superseded=True)
            return turn
        except BaseException:
            await self.end(conversation.id, turn)  # never begun: only the conversation is let go
            raise
        self.tg.start_soon(self._lifetime, conversation, closure, turn)
        return turn

    async def begin(self, conversation_id: str, turn: ActiveTurn) -> None:
        """Write the turn's row and its `turn.started` (one transaction); from here on it exists."""
        record = turn.record
        now = time.time()
        turn.trace = TurnTrace.begin()  # the request's trace, if it named one; kept for every attempt
        started = TurnStarted(turn_id=record.id, digest=record.digest, agent=record.agent,
                              **turn.trace.fields()).wire()
        seq = await self.turn_store.begin_turn(record, started, now)
        self.hub.status(conversation_id, "busy")
        self.hub.committed(conversation_id, [(seq, started)], now)
        turn.begin(seq)
        self.metrics.busy.inc(amount=1)

    async def resume(self, conversation: ConversationRecord, record: TurnRecord, fence: int) -> None:
        """Run the next attempt of a turn this replica took over (its replica stopped or died)."""
        turn = ActiveTurn(record=record, fence=fence, stored=True)
        self.admission.adopt(conversation.id, turn)
        try:
            closure = await self.registry.resolve(f"{record.agent}@{record.digest}")
            checkpoint = await checkpoint_of(self.store, record)
        except BaseException as exc:
            log.error("turn %s cannot be resumed: %s", record.id, exc)
            turn.settle(Failed({"code": "interrupted", "message": f"the turn could not be resumed: {exc}"}))
            await self.end(conversation.id, turn)
            if not isinstance(exc, Exception):
                raise
            return
        log.warning("turn %s of conversation %s resumed (attempt %d)", record.id, conversation.id,
                    record.attempts)
        turn.begin(checkpoint.started_seq, checkpoint.messages)
        turn.trace = checkpoint.trace or TurnTrace.begin()
        self.metrics.busy.inc(amount=1)
        self.steering.resumed(turn.id)
        self.tg.start_soon(self._lifetime, conversation, closure, turn, checkpoint)

    async def _lifetime(self, conversation: ConversationRecord, closure: Closure, turn: ActiveTurn,
                        resumed: Checkpoint | None = None) -> None:
        """A begun turn's task: it runs (its own cancel scope), then ends. Its journal's delayed flushes
        run beside it, outside its scope, so a cancelled turn still writes what it had waiting."""
        async with anyio.create_task_group() as timers:
            journal = self.runner.journal(conversation.id, turn, timers)
            try:
                with turn.scope:
                    await self.runner.run(conversation, closure, turn, journal, resumed)
            finally:
                try:
                    await self.end(conversation.id, turn, journal)
                finally:
                    timers.cancel_scope.cancel()

    # --- the end ---------------------------------------------------------------

    async def end(self, conversation_id: str, turn: ActiveTurn, journal: Journal | None = None, *,
                  superseded: bool = False) -> None:
        """The one place a turn ends, once, shielded: a cancelled caller still ends it whole."""
        with anyio.CancelScope(shield=True):
            if superseded:
                await self._leave(conversation_id, turn)
                await self._never_ran(turn)
                return
            if not turn.stored:  # it never began: nothing of it is stored
                turn.end()
            else:
                if journal is not None:
                    await self._last_writes(turn, journal)
                if turn.stopped is not None:
                    await self._stop_here(turn)
                else:
                    await self._record_end(turn)
            await self._leave(conversation_id, turn)

    async def _last_writes(self, turn: ActiveTurn, journal: Journal) -> None:
        """Deltas still waiting, also when the turn was cancelled; a turn cut off at a stopping replica's
        grace goes on elsewhere."""
        try:
            await journal.flush()
        except LeaseLost:
            turn.goes_on_elsewhere("lost")
        except StorageError as exc:
            turn.settle(Failed(exc.envelope()["error"]))
        except Exception:  # a bug fails this turn, and it still ends
            log.exception("turn %s: its last writes failed unexpectedly", turn.id)
            turn.settle(Failed({"code": "internal", "message": "internal error during the turn"}))
        if turn.hand_off and turn.outcome is None and turn.stopped is None:
            turn.goes_on_elsewhere("handed_over")  # the next attempt goes on

    async def _record_end(self, turn: ActiveTurn) -> None:
        record = turn.record
        now = time.time()
        ending = ending_of(record, turn.final_outcome(), now, turn.fence)
        recorded = False
        try:
            await self._record(ending)
            recorded = True
        except LeaseLost:  # taken over while it ended: the new holder writes the ending
            turn.goes_on_elsewhere("lost")
            await self._stop_here(turn)
            return
        except StorageError:
            log.error("could not record the end of turn %s: kept until the store is writable", record.id)
            self.unrecorded.append(ending)
        except Exception:
            log.exception("could not record the end of turn %s", record.id)
        turn.end(ending, recorded=recorded)
        if turn.messages is not None:  # it ran here (not a resume that could not start)
            self.metrics.busy.inc(amount=-1)
        self.metrics.turns.inc(record.agent, ending.status)
        self.metrics.turn_duration.observe(now - record.started_at, record.agent)

    async def _stop_here(self, turn: ActiveTurn) -> None:
        record = turn.record
        if turn.stopped == "handed_over" and turn.fence is not None:
            try:
                await self.turn_store.hand_over(record.conversation_id, record.id, turn.fence)
                log.info("turn %s handed over: another replica (or the next start) goes on with it",
                         record.id)
            except (StorageError, LeaseLost):
                log.warning("could not hand turn %s over; its lease lapses on its own", record.id)
        else:
            log.warning("turn %s: another replica took it over (this one's lease lapsed)", record.id)
        turn.end()
        self.metrics.busy.inc(amount=-1)

    async def _never_ran(self, turn: ActiveTurn) -> None:
        """A turn cancelled while it waited for its slot: recorded as started and cancelled, nothing run."""
        record = turn.record
        now = time.time()
        ending = ending_of(record, turn.final_outcome(), now)
        await self.turn_store.create_turn(replace(record, **ending.changes))
        events = [TurnStarted(turn_id=record.id, digest=record.digest, agent=record.agent,
                              **TurnTrace.begin().fields()).wire(),
                  (ending.event, ending.data)]
        seqs = await self.turn_store.append(record.conversation_id, record.id, [], events, now)
        self.hub.committed(record.conversation_id, list(zip(seqs, events, strict=True)), now)
        turn.begin(seqs[0])
        turn.end(ending)
        self.metrics.turns.inc(record.agent, ending.status)

    async def _leave(self, conversation_id: str, turn: ActiveTurn) -> None:
        """The conversation let go (by the store with the ending, or here), and what the turn leaves."""
        if turn.fence is None:  # it never held the conversation
            return
        ran = turn.messages is not None  # it ran here (begun here, or resumed from its checkpoint)
        if ran and turn.record.idempotency_key:
            self.keys.forget(conversation_id, turn.record.idempotency_key)
        released = turn.recorded or turn.stopped is not None  # with its ending; or it goes on elsewhere
        await self.admission.leave(conversation_id, turn.id, released=released)
        if ran and turn.stopped is None:
            self.steering.left_over(conversation_id, turn.id, self._tg, self._left_turn)

    async def _record(self, ending: Ending) -> None:
        """The ending's writes, one transaction (the conversation is released with them)."""
        now = time.time()
        event = (ending.event, ending.data)
        seq = await self.turn_store.end_turn(ending.turn_id, ending.conversation_id, ending.changes, event,
                                             now, fence=ending.fence)
        self.hub.committed(ending.conversation_id, [(seq, event)], now)
        self.hub.status(ending.conversation_id, "idle")

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

    async def _left_turn(self, conversation_id: str, text: str) -> None:
        """A message steered into a turn that ended without it: a turn of its own, after the others."""
        conversation = await self._current(conversation_id)
        self.check_open()
        await self.start(conversation, text, "enqueue")

    # --- shutdown --------------------------------------------------------------

    async def drain(self, grace_s: float, *, hand_off: bool = False) -> None:
        """Stop accepting turns and hand the running ones over, none of them failed by the stop.

        With other replicas to go on (`hand_off`), each turn stops at its next checkpoint within
        `grace_s` and its lease lapses at once, so another replica continues it. Alone, a turn
        gets `grace_s` to finish. Either way, a turn still running when the grace ends is cut off
        and handed over: the next replica to take it, or this one's next start, resumes it.
        """
        self.accepting = False
        for turn in self.running_turns():
            turn.hand_off = hand_off
        with anyio.move_on_after(grace_s):
            for turn in self.running_turns():
                await turn.done.wait()
        for turn in self.running_turns():
            turn.hand_off = True
            turn.cancel()
        with anyio.move_on_after(5):
            for turn in self.running_turns():
                await turn.done.wait()

    async def _current(self, conversation_id: str) -> ConversationRecord:
        record = await self.store.get_conversation(conversation_id)
        if record is None:
            raise ConversationNotFound(f"no conversation {conversation_id!r}",
                                       details={"conversation_id": conversation_id})
        return record


def _new_record(conversation: ConversationRecord, closure: Closure, text: str, key: str | None, turn_id: str,
                asked: str | None) -> TurnRecord:
    return TurnRecord(id=turn_id, conversation_id=conversation.id, agent=closure.agent.name,
                      digest=closure.agent.digest, status="running", input=text, idempotency_key=key,
                      request_digest=asked if key else None, started_at=time.time())
