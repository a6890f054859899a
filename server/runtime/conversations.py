"""Conversations: turns one at a time, run server-side, persisted as they go.

Responsible for: creating conversations on a resolved agent; accepting a
message under the busy policy (`reject` answers 409 naming the running turn,
`enqueue` waits its turn in order, `interrupt` cancels the running turn and
every turn queued before it: those end cancelled without running);
idempotency keys (a key reused with another body is refused); running each
turn in the service's task group (so a client that disconnects cancels
nothing); persisting the transcript and
every event before publishing it; and live event streams that replay from
the store, so `Last-Event-ID` resumes without loss or duplicates.

Not responsible for: what a turn does (`loop`), how it is built (`runtime`),
or which definitions are current (`registry`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

import anyio
from anyio.abc import TaskGroup

from ..deployment.registry import Registry, split_ref
from ..errors import CorralError, RequestError
from ..ids import new_id
from ..messages import Message
from ..metrics import Metrics
from ..store.base import ConversationRecord, EventRecord, Store, TurnRecord
from .events import HEARTBEAT_S, EventHub
from .plans import Runtime
from .turns import Ending, TurnRunner

log = logging.getLogger("corral.conversations")

TERMINAL_EVENTS = ("turn.completed", "turn.failed", "turn.cancelled")
BUSY_POLICIES = ("reject", "enqueue", "interrupt")


class ConversationNotFound(RequestError):
    code = "conversation_not_found"


class ConversationBusy(RequestError):
    code = "conversation_busy"


class IdempotencyKeyReused(RequestError):
    code = "idempotency_key_reused"


class _Superseded(Exception):
    """A queued turn that a later `interrupt` cancelled before it could start."""


def request_digest(text: str, if_busy: str | None) -> str:
    """What an idempotent request asked for; how its answer is delivered (`stream`) is not part of it."""
    return "sha256:" + hashlib.sha256(json.dumps([text, if_busy]).encode()).hexdigest()


@dataclass
class Running:
    turn: TurnRecord
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    done: anyio.Event = field(default_factory=anyio.Event)
    started_seq: int = 0
    outcome: tuple[str, Any] | None = None  # ("completed", Done) | ("failed", error envelope)
    messages: list[Message] | None = None  # what this turn added to the transcript, once it ran here
    asked: dict[str, Any] | None = None  # the permission request it is waiting on, if any
    attention: anyio.Event = field(default_factory=anyio.Event)  # set when it asks, or ends
    reason: str | None = None  # why it was cancelled: "interrupted" by shutdown, else a client
    ending: Ending | None = None  # how it ended, once it has (also when the store could not take it)


@dataclass
class _Pending:
    """A request holding an idempotency key; duplicates wait for its outcome and share it."""

    request: str
    ready: anyio.Event = field(default_factory=anyio.Event)
    running: Running | None = None
    error: BaseException | None = None

    async def outcome(self) -> Running:
        await self.ready.wait()
        if self.running is None:
            raise self.error or CorralError("the original request failed")
        return self.running


@dataclass
class _Live:
    """In-memory state of one conversation on this process."""

    slot: anyio.Semaphore = field(default_factory=lambda: anyio.Semaphore(1))
    running: Running | None = None
    keys: dict[str, _Pending] = field(default_factory=dict)  # idempotency keys in flight
    # Ids of the turn holding the slot (first) and of those waiting for it, in order. Set before
    # any await, so a rejected request always names a turn, even one that is still starting.
    queue: deque[str] = field(default_factory=deque)
    waiting: dict[str, anyio.CancelScope] = field(default_factory=dict)  # turns waiting for the slot
    superseded: set[str] = field(default_factory=set)  # queued turns an `interrupt` cancelled


class Conversations:
    def __init__(self, store: Store, registry: Registry, runtime: Runtime, hub: EventHub,
                 metrics: Metrics, *, idempotency_ttl_s: float = 86_400, max_turns: int = 1000):
        self.store = store
        self.registry = registry
        self.hub = hub
        self.metrics = metrics
        self.runner = TurnRunner(store, runtime, hub, metrics)
        self.idempotency_ttl_s = idempotency_ttl_s
        self.max_turns = max_turns
        self._live: dict[str, _Live] = {}
        self._tg: TaskGroup | None = None
        self.accepting = True

    # --- lifecycle -----------------------------------------------------------

    async def run(self, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """Own the task group turns run in, until cancelled."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            task_status.started()
            await anyio.sleep_forever()

    def running_turns(self) -> list[Running]:
        return [live.running for live in self._live.values() if live.running is not None]

    async def running_records(self) -> list[TurnRecord]:
        """The turns in progress here (what a swap report's `busy` is made of)."""
        return [running.turn for running in self.running_turns()]

    async def drain(self, grace_s: float) -> None:
        """Stop accepting turns; give running ones `grace_s`, then cancel the rest."""
        self.accepting = False
        with anyio.move_on_after(grace_s):
            for running in self.running_turns():
                await running.done.wait()
        for running in self.running_turns():
            running.reason = "interrupted"
            running.scope.cancel()
        with anyio.move_on_after(5):
            for running in self.running_turns():
                await running.done.wait()

    # --- conversations -------------------------------------------------------

    async def create(self, agent: str, title: str | None, metadata: dict[str, Any]) -> ConversationRecord:
        closure = await self.registry.resolve(agent)
        now = time.time()
        record = ConversationRecord(
            id=new_id("conv"), agent=agent, agent_name=closure.agent.name, digest=closure.agent.digest,
            pinned=split_ref(agent)[1] is not None, title=title, metadata=metadata,
            status="idle", created_at=now, updated_at=now,
        )
        await self.store.create_conversation(record)
        return record

    async def get(self, conversation_id: str) -> ConversationRecord:
        record = await self.store.get_conversation(conversation_id)
        if record is None:
            raise ConversationNotFound(f"no conversation {conversation_id!r}",
                                       details={"conversation_id": conversation_id})
        return record

    async def delete(self, conversation_id: str) -> None:
        live = self._live.get(conversation_id)
        if live is not None and live.running is not None:
            raise ConversationBusy("the conversation has a turn running; interrupt it first",
                                   details={"turn_id": live.running.turn.id})
        if not await self.store.delete_conversation(conversation_id):
            raise ConversationNotFound(f"no conversation {conversation_id!r}")
        self._live.pop(conversation_id, None)

    # --- turns ---------------------------------------------------------------

    async def send(self, conversation_id: str, text: str, *, if_busy: str | None = None,
                   idempotency_key: str | None = None) -> Running:
        """Start a turn (or find the one this idempotency key started); returns once it is running."""
        conversation = await self.get(conversation_id)
        if not self.accepting:
            raise CorralError("the server is shutting down", code="overloaded")
        if len(self.running_turns()) >= self.max_turns:
            raise CorralError(f"too many turns in progress (limit {self.max_turns}); retry shortly",
                              code="overloaded")
        live = self._live.setdefault(conversation_id, _Live())
        if not idempotency_key:
            return await self._start(live, conversation, text, if_busy, None)
        asked = request_digest(text, if_busy)
        # A key in flight first: its turn is in the store too, but still running, not a result yet.
        if idempotency_key in live.keys:
            return await self._same_request(live.keys[idempotency_key], asked)
        found = await self._stored_turn(conversation_id, idempotency_key)
        if found is not None:
            _check_reuse(found.turn, asked)
            return found
        # No await between this check and the reservation: a concurrent duplicate sees one or the other.
        if idempotency_key in live.keys:
            return await self._same_request(live.keys[idempotency_key], asked)
        pending = live.keys[idempotency_key] = _Pending(asked)
        try:
            pending.running = await self._start(live, conversation, text, if_busy, idempotency_key, asked)
            return pending.running
        except BaseException as exc:
            pending.error = exc
            live.keys.pop(idempotency_key, None)
            raise
        finally:
            pending.ready.set()

    @staticmethod
    async def _same_request(pending: _Pending, asked: str) -> Running:
        if pending.request != asked:
            raise _reused(None)
        return await pending.outcome()

    async def _start(self, live: _Live, conversation: ConversationRecord, text: str,
                     if_busy: str | None, key: str | None, asked: str | None = None) -> Running:
        closure = await self.registry.resolve(conversation.agent)
        policy = if_busy or closure.agent.on_busy
        if policy not in BUSY_POLICIES:
            raise RequestError(f"if_busy must be one of {', '.join(BUSY_POLICIES)}")
        turn_id = new_id("turn")
        try:
            await self._take_slot(live, policy, turn_id)
        except _Superseded:
            turn = self.runner.new_turn(conversation, closure, text, key, turn_id, asked)
            return await self.runner.never_ran(Running(turn=turn))
        try:
            if not self.accepting:  # shutdown began while this turn waited for its slot
                raise CorralError("the server is shutting down", code="overloaded")
            conversation = await self.get(conversation.id)
            # what is current now that it is our turn
            closure = await self.registry.resolve(conversation.agent)
            turn = self.runner.new_turn(conversation, closure, text, key, turn_id, asked)
            if turn_id in live.superseded:  # an `interrupt` came while this turn was starting
                live.superseded.discard(turn_id)
                raise _Superseded
            running = Running(turn=turn)
            live.running = running
            assert self._tg is not None
            await self._tg.start(self._run_turn, live, conversation, closure, running)
            return running
        except _Superseded:
            self._leave(live, turn_id)
            return await self.runner.never_ran(Running(turn=turn))
        except BaseException:
            self._leave(live, turn_id)
            raise

    def _leave(self, live: _Live, turn_id: str) -> None:
        """A turn that held the slot gives it up without having run."""
        live.running = None
        live.queue.remove(turn_id)
        live.slot.release()

    async def _take_slot(self, live: _Live, policy: str, turn_id: str) -> None:
        """Wait for the conversation's one slot; raises `_Superseded` if an interrupt cancels the wait."""
        if live.queue and policy == "reject":
            busy_with = live.queue[0]
            raise ConversationBusy(f"the conversation is busy with turn {busy_with}",
                                   details={"turn_id": busy_with})
        if policy == "interrupt":
            self._supersede(live)
        live.queue.append(turn_id)
        waited = live.waiting[turn_id] = anyio.CancelScope()
        try:
            with waited:
                await live.slot.acquire()
        except BaseException:
            live.queue.remove(turn_id)
            raise
        finally:
            live.waiting.pop(turn_id, None)
        if turn_id in live.superseded:
            if not waited.cancelled_caught:  # the slot came before the cancellation: pass it on
                live.slot.release()
            live.superseded.discard(turn_id)
            live.queue.remove(turn_id)
            raise _Superseded

    @staticmethod
    def _supersede(live: _Live) -> None:
        """`interrupt`: cancel the running turn and every turn queued before the new one."""
        if live.running is not None:
            live.running.scope.cancel()
        for turn_id in live.queue:
            if live.running is None or turn_id != live.running.turn.id:
                live.superseded.add(turn_id)
                if turn_id in live.waiting:
                    live.waiting[turn_id].cancel()

    async def _stored_turn(self, conversation_id: str, key: str) -> Running | None:
        turn = await self.store.find_turn_by_key(conversation_id, key, 0.0)
        if turn is None:
            return None
        if turn.started_at < time.time() - self.idempotency_ttl_s:
            # Expired: release the key so it can name a new turn (the store keeps keys unique).
            await self.store.update_turn(turn.id, idempotency_key=None)
            return None
        # A streamed retry replays from here, not from the conversation's first event.
        done = Running(turn=turn, started_seq=await self._started_seq(turn))
        done.done.set()
        return done

    async def _started_seq(self, turn: TurnRecord) -> int:
        """The seq of a stored turn's `turn.started` (a scan, but only idempotent retries need it)."""
        async for event in self._replay(turn.conversation_id, 0):
            if event.name == "turn.started" and event.data.get("turn_id") == turn.id:
                return event.seq
        return 0

    async def _run_turn(self, live: _Live, conversation: ConversationRecord, closure, running: Running,
                        task_status=anyio.TASK_STATUS_IGNORED) -> None:
        try:
            with running.scope:
                await self.runner.run(conversation, closure, running, task_status)
        finally:
            with anyio.CancelScope(shield=True):
                await self.runner.finish(conversation, running)
                live.running = None
                if running.turn.idempotency_key:
                    live.keys.pop(running.turn.idempotency_key, None)
                running.done.set()
                running.attention.set()
                live.queue.remove(running.turn.id)
                live.slot.release()
                if not live.queue:
                    self._live.pop(conversation.id, None)

    async def interrupt(self, conversation_id: str) -> str | None:
        """Cancel the running turn; returns its id, or None when idle."""
        await self.get(conversation_id)
        live = self._live.get(conversation_id)
        if live is None or live.running is None:
            return None
        running = live.running
        running.scope.cancel()
        with anyio.fail_after(10):
            await running.done.wait()
        return running.turn.id

    async def result(self, running: Running) -> dict[str, Any]:
        """The non-streaming answer of a turn, once it has ended."""
        await running.done.wait()
        turn = await self.store.get_turn(running.turn.id)
        assert turn is not None
        if running.ending is not None:  # ended here: what the store says may lag (a failed write)
            turn = replace(turn, **running.ending.changes)
        messages = running.messages if running.messages is not None else await self._turn_messages(turn)
        body: dict[str, Any] = {
            "turn_id": turn.id, "digest": turn.digest, "status": turn.status,
            "output": turn.output, "messages": [m.to_json() for m in messages],
        }
        if turn.error:
            body["error"] = turn.error
        return body

    async def _turn_messages(self, turn: TurnRecord) -> list[Message]:
        records = await self.store.list_messages(turn.conversation_id, limit=100_000)
        return [r.message for r in records if r.turn_id == turn.id]

    # --- events ----------------------------------------------------------------

    async def events(self, conversation_id: str, after: int = 0,
                     until_turn: str | None = None) -> AsyncIterator[EventRecord | None]:
        """Replay from the store after `after`, then follow live; ends after `until_turn` ends.

        Yields `None` as a heartbeat when nothing happened for a while.
        """
        last = after
        while True:
            with self.hub.subscribe(conversation_id) as live:
                async for event in self._replay(conversation_id, last):
                    last = event.seq
                    yield event
                    if until_turn and _ends(event, until_turn):
                        return
                async for event in self._follow(live, last):
                    if event is None:
                        yield None
                        continue
                    last = event.seq
                    yield event
                    if until_turn and _ends(event, until_turn):
                        return
                if live.closed_by_hub:
                    return

    async def _follow(self, live, last: int) -> AsyncIterator[EventRecord | None]:
        """Live events after `last`, in order; stops at a gap or when the hub drops us."""
        while True:
            try:
                event = await live.next(HEARTBEAT_S)
            except anyio.EndOfStream:
                return
            if event is None:
                yield None
            elif event.seq > last + 1:
                return  # a gap: the caller replays it from the store
            elif event.seq == last + 1:
                last = event.seq
                yield event

    async def _replay(self, conversation_id: str, after: int) -> AsyncIterator[EventRecord]:
        while True:
            page = await self.store.list_events(conversation_id, after=after, limit=500)
            for event in page:
                after = event.seq
                yield event
            if len(page) < 500:
                return


def _reused(turn_id: str | None) -> IdempotencyKeyReused:
    return IdempotencyKeyReused("this Idempotency-Key was used with a different request body",
                                details={"turn_id": turn_id} if turn_id else None)


def _check_reuse(turn: TurnRecord, asked: str) -> None:
    # turns stored before request digests were kept have none: they cannot be told apart
    if turn.request_digest is not None and turn.request_digest != asked:
        raise _reused(turn.id)


def _ends(event: EventRecord, turn_id: str) -> bool:
    return event.name in TERMINAL_EVENTS and event.data.get("turn_id") == turn_id
