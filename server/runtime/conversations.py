"""Conversations: turns one at a time, run server-side, persisted as they go.

Responsible for: creating, reading, updating (title, metadata, archived),
forking and deleting conversations; starting a turn when `admission` lets
it in (one at a time, under the busy policy) and
`idempotency` finds no turn the request's key already names; running each
turn in the service's task group (so a client that disconnects cancels
nothing); interrupting it; draining at shutdown; and the result of a turn
that ended (`TurnResult`). Event streams are `streams`'. `if_busy: steer`
hands a message to the running turn (`steering`; one that ends first leaves
it a turn of its own); `context` and `compact` answer and act on the
conversation's context (`context`).

Not responsible for: what a turn does (`loop`, driven by `turn_runner`), how it is
built (`plans`), or which definitions are current (`registry`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import anyio
from anyio.abc import TaskGroup

from ..compiler.definitions import Closure
from ..deployment import canaries
from ..deployment.registry import Registry, split_ref
from ..errors import (
    ConversationBusy,
    ConversationNotFound,
    CorralError,
    IdempotencyKeyReused,
    RequestError,
    StorageError,
    TurnNotFound,
)
from ..ids import new_id
from ..messages import Message
from ..metrics import Metrics
from ..store.base import ConversationRecord, EventRecord, Store, TurnRecord
from .active_turn import ENDED_STATUSES, ActiveTurn, Failed, TurnResult
from .admission import Admission, KeyTaken, Superseded
from .bounds import waited
from .checkpoints import Checkpoint, checkpoint_of
from .elsewhere import TurnsElsewhere
from .events import EventHub
from .idempotency import IdempotencyKeys, request_digest
from .plans import Runtime
from .steering import Steering
from .streams import EventStreams
from .structured import MISSING, OutputSchema
from .structured import stored as stored_structured
from .turn_runner import TurnRunner

log = logging.getLogger("corral.conversations")


class Conversations:
    def __init__(self, store: Store, registry: Registry, runtime: Runtime, hub: EventHub,
                 metrics: Metrics, *, idempotency_ttl_s: float = 86_400, max_turns: int = 1000,
                 lease_s: float = 10.0, storage_grace_s: float = 30.0):
        self.store = store
        self.registry = registry
        self.runner = TurnRunner(store, runtime, hub, metrics, storage_grace_s=storage_grace_s)
        self.admission = Admission(store, lease_s=lease_s, max_turns=max_turns)
        self.keys = IdempotencyKeys(store, idempotency_ttl_s)
        self.streams = EventStreams(store, hub)
        self.elsewhere = TurnsElsewhere(store, self.admission, self.streams)
        self.steering = Steering(store, registry, runtime, self.runner, self.admission, idempotency_ttl_s)
        self._tg: TaskGroup | None = None
        self.accepting = True

    # --- lifecycle -----------------------------------------------------------

    async def run(self, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """Own the task group turns run in, until cancelled."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            task_status.started()
            await anyio.sleep_forever()

    def running_turns(self) -> list[ActiveTurn]:
        return self.admission.running_turns()

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

    async def resume(self, turn: TurnRecord, fence: int) -> None:
        """Run the next attempt of a turn this replica took over (its replica stopped or died)."""
        conversation = await self.get(turn.conversation_id)
        active = ActiveTurn(record=turn, fence=fence)
        self.admission.adopt(conversation.id, active)
        try:
            closure = await self.registry.resolve(f"{turn.agent}@{turn.digest}")
            checkpoint = await checkpoint_of(self.store, turn)
        except BaseException as exc:
            log.error("turn %s cannot be resumed: %s", turn.id, exc)
            active.settle(Failed({"code": "interrupted",
                                  "message": f"the turn could not be resumed: {exc}"}))
            with anyio.CancelScope(shield=True):
                await self.runner.finish(conversation, active)
                await self.admission.leave(conversation.id, turn.id, released=True)
            if not isinstance(exc, Exception):
                raise
            return
        log.warning("turn %s of conversation %s resumed (attempt %d)", turn.id, conversation.id,
                    turn.attempts)
        self.runner.steered.add(turn.id)  # messages steered into it before the stop wait in the store
        assert self._tg is not None
        await self._tg.start(self._run_turn, conversation, closure, active, checkpoint)

    # --- conversations -------------------------------------------------------

    async def create(self, agent: str, title: str | None, metadata: dict[str, Any]) -> ConversationRecord:
        if title is not None and "\x00" in title:
            raise RequestError("the title must not contain NUL characters")
        drawn = await canaries.draw(self.store, agent)  # an alias with a canary: pinned to the side drawn
        agent = drawn.ref if drawn is not None else agent
        closure = await self.registry.resolve(agent)
        now = time.time()
        record = ConversationRecord(
            id=new_id("conv"), agent=agent, agent_name=closure.agent.name, digest=closure.agent.digest,
            pinned=split_ref(agent)[1] is not None, title=title, metadata=metadata,
            status="idle", created_at=now, updated_at=now,
        )
        await self.store.create_conversation(record)
        if drawn is not None:
            await drawn.record(self.store, record.id)
        return record

    async def get(self, conversation_id: str) -> ConversationRecord:
        record = await self.store.get_conversation(conversation_id)
        if record is None:
            raise ConversationNotFound(f"no conversation {conversation_id!r}",
                                       details={"conversation_id": conversation_id})
        return record

    async def update(self, conversation_id: str, **fields: Any) -> ConversationRecord:
        """Rename, replace the metadata, archive or unarchive (`fields`: title, metadata, archived)."""
        title = fields.get("title")
        if title is not None and "\x00" in title:
            raise RequestError("the title must not contain NUL characters")
        if not await self.store.update_conversation(conversation_id, now=time.time(), **fields):
            raise ConversationNotFound(f"no conversation {conversation_id!r}",
                                       details={"conversation_id": conversation_id})
        return await self.get(conversation_id)

    async def fork(self, conversation_id: str, *, before_turn_id: str | None = None, agent: str | None = None,
                   title: str | None = None) -> ConversationRecord:
        """A new conversation holding the transcript up to (not including) `before_turn_id`, or all of it.

        Only turns that ended are shared (a running turn's messages are not), and no turn or event:
        the fork starts with an empty event log (see `Store.fork_conversation`). It runs on `agent`
        (any reference, resolved as at creation), else on the source's reference as it was asked
        for (a pinned source's fork stays pinned); it keeps the source's metadata, and its title
        unless one is given; it is not archived. `forked_from` names the source and the turn.
        """
        if title is not None and "\x00" in title:
            raise RequestError("the title must not contain NUL characters")
        source = await self.get(conversation_id)
        if before_turn_id is not None:
            turn = await self.store.get_turn(before_turn_id)
            if turn is None or turn.conversation_id != source.id:
                raise _turn_not_found(source.id, before_turn_id)
        ref = agent or source.agent
        closure = await self.registry.resolve(ref)
        now = time.time()
        record = ConversationRecord(
            id=new_id("conv"), agent=ref, agent_name=closure.agent.name, digest=closure.agent.digest,
            pinned=split_ref(ref)[1] is not None, title=source.title if title is None else title,
            metadata=source.metadata, status="idle", created_at=now, updated_at=now,
            forked_from={"conversation_id": source.id, "turn_id": before_turn_id},
        )
        if not await self.store.fork_conversation(source.id, record, before_turn_id):
            await self.get(source.id)  # deleted meanwhile: conversation_not_found
            raise _turn_not_found(source.id, before_turn_id or "")
        return record

    async def delete(self, conversation_id: str) -> None:
        holder = await self.admission.holder(conversation_id)
        if holder is not None:
            raise ConversationBusy("the conversation has a turn running; interrupt it first",
                                   details={"turn_id": holder.turn_id})
        if not await self.store.delete_conversation(conversation_id):
            raise ConversationNotFound(f"no conversation {conversation_id!r}")
        await self.forget(conversation_id)
        try:  # the other replicas' hooks may have a transcript file of it too
            await self.store.notify({"t": "deleted", "c": conversation_id})
        except StorageError as exc:  # it is deleted all the same: a file left behind is all that is lost
            log.warning("replicas were not told conversation %s was deleted: %s", conversation_id, exc)

    async def forget(self, conversation_id: str) -> None:
        """Remove what this replica keeps of a deleted conversation outside the store: the transcript
        file hooks read (`transcript_path`)."""
        await self.runner.runtime.forget_transcript(conversation_id)

    # --- turns ---------------------------------------------------------------

    async def send(self, conversation_id: str, text: str, *, if_busy: str | None = None,
                   idempotency_key: str | None = None, output: OutputSchema | None = None) -> ActiveTurn:
        """Start a turn (or find the one this idempotency key started); returns once it is running.

        `output`: the JSON this turn's answer must be, instead of the agent's `output_schema` (the
        OpenAI route's `response_format`); held in memory only, so a turn resumed elsewhere after a
        crash runs on the agent's own."""
        if "\x00" in text:  # no store keeps it as text (PostgreSQL refuses it), and no model reads it
            raise RequestError("the message must not contain NUL characters")
        conversation = await self.get(conversation_id)
        if not self.accepting:
            raise CorralError("the server is shutting down", code="overloaded")
        self.admission.check_capacity()
        asked = request_digest(text, if_busy) if idempotency_key else None
        if if_busy == "steer" or (if_busy is None and await self.steering.wanted(conversation)):
            if not idempotency_key or not await self.keys.known(conversation_id, idempotency_key):
                # raises Steered, unless no turn runs to take it
                await self.steering.steer(conversation, text, idempotency_key, asked)
            if_busy = "enqueue"  # a turn of its own, as `enqueue` would start it
        if not idempotency_key:
            return await self._start(conversation, text, if_busy, None, None, output)
        return await self.keys.once(
            conversation_id, idempotency_key, asked,
            start=lambda: self._start(conversation, text, if_busy, idempotency_key, asked, output),
            stored=self._found)

    async def _found(self, turn: TurnRecord) -> ActiveTurn:
        """The turn the store has under a retried request's key: one that ended, as `_stored` presents
        it; one still running (on another replica, or resumed here), followed until it ends, as the
        first request waits for it (§9)."""
        if turn.status in ENDED_STATUSES:
            return await self._stored(turn)
        log.info("a retried request follows turn %s of conversation %s until it ends", turn.id,
                 turn.conversation_id)
        assert self._tg is not None
        return await self.elsewhere.joined(turn.conversation_id, turn.id, self._tg, self._stored)

    async def _stored(self, turn: TurnRecord) -> ActiveTurn:
        """A turn the store holds, as one that ended (a streamed retry replays from its start)."""
        started_seq = await self.streams.started_seq(turn.conversation_id, turn.id)
        found = ActiveTurn(record=turn, started_seq=started_seq)
        found.done.set()
        found.attention.set()
        return found

    async def _start(self, conversation: ConversationRecord, text: str, if_busy: str | None,
                     key: str | None, asked: str | None, output: OutputSchema | None = None) -> ActiveTurn:
        closure = await self.registry.resolve(conversation.agent)
        turn_id = new_id("turn")
        try:
            fence = await self.admission.enter(conversation.id, turn_id, if_busy or closure.agent.on_busy,
                                               key=key, request=asked)
        except Superseded:
            return await self.runner.never_ran(self._turn(conversation, closure, text, key, turn_id, asked))
        except KeyTaken as taken:  # another replica's request holds the key, or it just ended
            if taken.request is not None and taken.request != asked:
                raise IdempotencyKeyReused("this Idempotency-Key was used with a different request body",
                                           details={"turn_id": taken.turn_id}) from None
            assert self._tg is not None
            return await self.elsewhere.joined(conversation.id, taken.turn_id, self._tg, self._stored)
        try:
            if not self.accepting:  # shutdown began while this turn waited for its slot
                raise CorralError("the server is shutting down", code="overloaded")
            conversation = await self.get(conversation.id)
            # what is current now that it is our turn
            closure = await self.registry.resolve(conversation.agent)
            turn = self._turn(conversation, closure, text, key, turn_id, asked)
            turn.fence = fence
            turn.output = output
            self.admission.start(conversation.id, turn)
            assert self._tg is not None
            await self._tg.start(self._run_turn, conversation, closure, turn)
            return turn
        except Superseded:
            with anyio.CancelScope(shield=True):
                await self.admission.leave(conversation.id, turn_id)
            return await self.runner.never_ran(turn)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.admission.leave(conversation.id, turn_id)
            raise

    def _turn(self, conversation: ConversationRecord, closure: Closure, text: str, key: str | None,
              turn_id: str, asked: str | None) -> ActiveTurn:
        return ActiveTurn(record=self.runner.new_turn(conversation, closure, text, key, turn_id, asked))

    async def _run_turn(self, conversation: ConversationRecord, closure: Closure, turn: ActiveTurn,
                        resumed: Checkpoint | None = None, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        try:
            with turn.scope:
                await self.runner.run(conversation, closure, turn, task_status, resumed=resumed)
        finally:
            with anyio.CancelScope(shield=True):
                await self._ended(conversation, turn)

    async def _ended(self, conversation: ConversationRecord, turn: ActiveTurn) -> None:
        """After a turn ran here (shielded): its ending recorded, the conversation left to the next."""
        if turn.messages is None:  # its first write failed: no row, no event to end; `_start` leaves
            turn.abandon()
            return
        await self.runner.finish(conversation, turn)
        if turn.record.idempotency_key:
            self.keys.forget(conversation.id, turn.record.idempotency_key)
        # released with its ending; or not ours to release (it goes on elsewhere)
        recorded = turn.ending is not None and turn.ending.done > 0
        await self.admission.leave(conversation.id, turn.id, released=recorded or bool(turn.stopped))
        if turn.stopped is None:
            self.steering.left_over(conversation.id, turn.id, self._tg, self._left_turn)

    async def _left_turn(self, conversation_id: str, text: str) -> None:
        """A message steered into a turn that ended without it: a turn of its own, after the others."""
        await self.send(conversation_id, text, if_busy="enqueue")

    def on_notice(self, notice: dict[str, Any]) -> None:
        """A replica's notice: a message steered into a turn running here, or a resync."""
        self.steering.on_notice(notice)

    # --- context (§10) -----------------------------------------------------------

    async def context(self, conversation_id: str) -> dict[str, Any]:
        """What the conversation's next model request will carry: window, tokens used and their source."""
        conversation = await self.get(conversation_id)
        closure = await self.registry.resolve(conversation.agent)
        return await self.runner.contexts.usage(conversation.id, closure)

    async def compact(self, conversation_id: str) -> dict[str, Any]:
        """Compact the conversation's context now (under the threshold too); 409 while a turn runs.

        The compaction holds the conversation as a turn would (no turn starts meanwhile), and commits
        its view with its `context.compacted` event under that hold."""
        conversation = await self.get(conversation_id)
        closure = await self.registry.resolve(conversation.agent)
        holder = new_id("compact")
        fence = await self.admission.enter(conversation.id, holder, "reject")
        try:
            return await self.runner.contexts.compact_now(conversation.id, closure, holder, fence)
        finally:
            with anyio.CancelScope(shield=True):
                await self.admission.leave(conversation.id, holder)

    async def interrupt(self, conversation_id: str) -> str | None:
        """Cancel the running turn, on whichever replica it runs; returns its id, or None when idle."""
        await self.get(conversation_id)
        turn = self.admission.running(conversation_id)
        if turn is not None:
            turn.cancel()
            with waited(10, f"turn {turn.id} was told to stop but has not ended", turn_id=turn.id):
                await turn.done.wait()
            return turn.id
        holder = await self.admission.holder(conversation_id)
        if holder is None:
            return None
        await self.admission.cancel(holder)
        with waited(10, f"turn {holder.turn_id} was told to stop but has not ended", turn_id=holder.turn_id):
            await self.elsewhere.ended(conversation_id, holder.turn_id)
        return holder.turn_id

    async def result(self, turn: ActiveTurn) -> TurnResult:
        """The answer of a turn, once it has ended (wherever it went on, for one taken over)."""
        await turn.done.wait()
        if turn.stopped == "handed_over":
            raise CorralError("this replica is stopping: the turn goes on elsewhere; read the conversation,"
                              " or retry with the same Idempotency-Key", code="overloaded",
                              details={"turn_id": turn.id})
        if turn.stopped == "lost":
            await self.elsewhere.ended(turn.record.conversation_id, turn.id)
            turn.messages = None  # what this replica saw of it is not the whole turn
        record = await self.store.get_turn(turn.id)
        assert record is not None
        if turn.ending is not None:  # ended here: what the store says may lag (a failed write)
            record = replace(record, **turn.ending.changes)
        messages = turn.messages if turn.messages is not None else await self._turn_messages(record)
        return TurnResult(turn_id=record.id, conversation_id=record.conversation_id, digest=record.digest,
                          status=record.status, output=record.output, messages=tuple(messages),
                          usage=record.usage, error=record.error,
                          structured=await self._structured(turn, record))

    async def _structured(self, turn: ActiveTurn, record: TurnRecord) -> Any:
        """The parsed output of a turn that ran with an output schema (`structured.MISSING` if none):
        as it ended here, else (a stored turn, one that ended elsewhere) its agent's schema says."""
        if record.status != "completed":
            return MISSING
        if turn.ending is not None:
            return turn.ending.data.get("structured", MISSING)
        try:
            closure = await self.registry.resolve(f"{record.agent}@{record.digest}")
        except CorralError:
            return MISSING
        return stored_structured(closure.agent, record.output)

    async def _turn_messages(self, turn: TurnRecord) -> list[Message]:
        return [r.message for r in await self.store.turn_messages(turn.conversation_id, turn.id)]

    def events(self, conversation_id: str, after: int = 0,
               until_turn: str | None = None) -> AsyncIterator[EventRecord | None]:
        """See `EventStreams.events`."""
        return self.streams.events(conversation_id, after, until_turn)


def _turn_not_found(conversation_id: str, turn_id: str) -> TurnNotFound:
    return TurnNotFound(f"conversation {conversation_id!r} has no turn {turn_id!r}",
                        details={"conversation_id": conversation_id, "turn_id": turn_id})
