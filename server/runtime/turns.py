"""Running one turn: drive the loop, persist as it goes, publish what was persisted.

Every event is written to the store first and published second, so a live
reader and a replaying one see the same sequence. A turn ends in exactly one
of `turn.completed`, `turn.failed` (with the error envelope) or
`turn.cancelled`; `finish` writes that ending even when the turn was
cancelled, under a shield. Nothing a turn raises escapes it: a storage
failure fails the turn with `storage_error`, a bug with `internal`. An
ending the store could not take is kept (`ActiveTurn.ending`, so the waiting
client still gets it) and written once the store is writable again
(`record_unrecorded`).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..compiler.definitions import Closure
from ..errors import CorralError, StorageError
from ..messages import Message, repair_history
from ..store.base import ConversationRecord, EventRecord, TurnRecord
from ..tools.base import ToolContext
from .loop import Append, Done, Emit, run_turn
from .turn import ActiveTurn, Completed, Ending, Failed, ending_of

if TYPE_CHECKING:
    from ..metrics import Metrics
    from ..store.base import Store
    from .events import EventHub
    from .plans import Runtime

log = logging.getLogger("corral.turns")


class TurnRunner:
    def __init__(self, store: Store, runtime: Runtime, hub: EventHub, metrics: Metrics):
        self.store = store
        self.runtime = runtime
        self.hub = hub
        self.metrics = metrics
        self.transcripts = Transcripts(store)
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
        active.begin(await self.emit(turn.conversation_id, "turn.started", {
            "turn_id": turn.id, "digest": turn.digest, "agent": turn.agent,
        }))
        await self.emit(turn.conversation_id, ending.event, ending.data)
        active.end(ending)
        self.metrics.turns.inc(turn.agent, ending.changes["status"])
        return active

    async def emit(self, conversation_id: str, name: str, data: dict[str, Any]) -> int:
        now = time.time()
        seq = await self.store.append_event(conversation_id, name, data, now)
        self.hub.publish(EventRecord(seq=seq, conversation_id=conversation_id, name=name, data=data,
                                     created_at=now))
        return seq

    async def set_status(self, conversation_id: str, status: str) -> None:
        await self.store.set_conversation_status(conversation_id, status, time.time())
        self.hub.publish_global("conversation.status", {"conversation_id": conversation_id,
                                                        "status": status})

    async def run(self, conversation: ConversationRecord, closure: Closure, active: ActiveTurn,
                  task_status: Any) -> None:
        turn = active.record
        await self.store.create_turn(turn)
        await self.set_status(conversation.id, "busy")
        self.metrics.busy.inc(amount=1)
        active.begin(await self.emit(conversation.id, "turn.started", {
            "turn_id": turn.id, "digest": turn.digest, "agent": turn.agent,
        }))
        task_status.started()
        history = await self.transcripts.history(conversation.id)
        context = ToolContext(conversation_id=conversation.id, turn_id=turn.id, agent=turn.agent,
                              digest=turn.digest, root=closure.root, environ=self.runtime.environ,
                              channel=_Channel(self, conversation.id, active), files=self.runtime.files)
        try:
            past = tuple(repair_history(history))
            # transcript: the conversation so far, as hooks' transcript_path shows it while the turn runs
            plan = await self.runtime.plan(closure, past, turn.input, context,
                                           transcript=lambda: (*past, *(active.messages or ())))
            async for event in run_turn(plan):
                await self._handle(conversation.id, turn, active, event)
        except CorralError as exc:
            active.settle(Failed(exc.envelope()["error"]))
        except Exception:  # a bug must fail this turn, not the task group every turn runs in
            log.exception("turn %s failed unexpectedly", turn.id)
            active.settle(Failed({"code": "internal", "message": "internal error during the turn"}))

    async def _handle(self, conversation_id: str, turn: TurnRecord, active: ActiveTurn, event: Any) -> None:
        if isinstance(event, Emit):
            await self.emit(conversation_id, event.name, event.data)
            if event.name == "tool.finished":
                outcome = "error" if event.data["is_error"] else "ok"
                self.metrics.tool_calls.inc(event.data["name"], outcome)
        elif isinstance(event, Append):
            await self.store.append_messages(conversation_id, turn.id, [event.message], time.time())
            active.append(event.message)
        elif isinstance(event, Done):
            active.settle(Completed(event.output, event.stop_reason, event.usage))

    async def finish(self, conversation: ConversationRecord, active: ActiveTurn) -> None:
        """Record how the turn ended; runs shielded, whatever happened."""
        turn = active.record
        now = time.time()
        ending = ending_of(turn, active.final_outcome(), now)
        try:
            await self._record(ending)
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

    async def _record(self, ending: Ending) -> None:
        """The ending's writes, in order; a retry after a failure goes on from the first not done."""
        steps = (
            lambda: self.store.update_turn(ending.turn_id, **ending.changes),
            lambda: self.emit(ending.conversation_id, ending.event, ending.data),
            lambda: self.set_status(ending.conversation_id, "idle"),
        )
        for step in steps[ending.done:]:
            await step()
            ending.done += 1

    async def record_unrecorded(self) -> None:
        """The store is writable again: write the endings it could not take."""
        pending, self.unrecorded = self.unrecorded, []
        for ending in pending:
            try:
                await self._record(ending)
            except StorageError:
                self.unrecorded.append(ending)


class _Channel:
    """A turn's way back from its tool calls: events, and the waiting status."""

    def __init__(self, runner: TurnRunner, conversation_id: str, active: ActiveTurn):
        self.runner = runner
        self.conversation_id = conversation_id
        self.active = active
        self.turn_id = active.id

    async def emit(self, name: str, data: dict[str, Any]) -> None:
        await self.runner.emit(self.conversation_id, name, data)
        if name == "permission.requested":
            self.active.ask(data)

    async def waiting(self, on: bool) -> None:
        await self.runner.store.update_turn(self.turn_id, status="waiting" if on else "running")
        await self.runner.set_status(self.conversation_id, "waiting" if on else "busy")


class Transcripts:
    """Recent conversations' transcripts, so a turn need not decode its whole history again.

    The store stays the source of truth: each use fetches what was appended after the last
    message seen (by this process or any other), so the cache is never stale, only shorter.
    """

    SIZE = 1000

    def __init__(self, store: Store):
        self.store = store
        self._cache: OrderedDict[str, tuple[int, list[Message]]] = OrderedDict()

    async def history(self, conversation_id: str) -> list[Message]:
        last, messages = self._cache.pop(conversation_id, (0, []))
        while True:
            page = await self.store.list_messages(conversation_id, after=last, limit=1000)
            messages += [r.message for r in page]
            last = page[-1].seq if page else last
            if len(page) < 1000:
                break
        self._cache[conversation_id] = (last, messages)
        if len(self._cache) > self.SIZE:
            self._cache.popitem(last=False)
        return list(messages)
