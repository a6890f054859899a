"""Running one turn: drive the loop, persist as it goes, publish what was persisted.

Every event is written to the store first and published second, so a live
reader and a replaying one see the same sequence. A turn ends in exactly one
of `turn.completed`, `turn.failed` (with the error envelope) or
`turn.cancelled`; `finish` writes that ending even when the turn was
cancelled, under a shield.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from .definitions import Closure
from .errors import CorralError
from .loop import Append, Done, Emit, run_turn
from .messages import Message, repair_history
from .store.base import ConversationRecord, EventRecord, TurnRecord
from .tools.base import ToolContext

if TYPE_CHECKING:
    from .conversations import Running
    from .events import EventHub
    from .metrics import Metrics
    from .runtime import Runtime
    from .store.base import Store

log = logging.getLogger("corral.turns")


class TurnRunner:
    def __init__(self, store: Store, runtime: Runtime, hub: EventHub, metrics: Metrics):
        self.store = store
        self.runtime = runtime
        self.hub = hub
        self.metrics = metrics
        self.transcripts = Transcripts(store)

    def new_turn(self, conversation: ConversationRecord, closure: Closure, text: str,
                 key: str | None, turn_id: str) -> TurnRecord:
        return TurnRecord(
            id=turn_id, conversation_id=conversation.id, agent=closure.agent.name,
            digest=closure.agent.digest, status="running", input=text, idempotency_key=key,
            started_at=time.time(),
        )

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

    async def run(self, conversation: ConversationRecord, closure: Closure, running: Running,
                  task_status: Any) -> None:
        turn = running.turn
        await self.store.create_turn(turn)
        await self.set_status(conversation.id, "busy")
        self.metrics.busy.inc(amount=1)
        running.started_seq = await self.emit(conversation.id, "turn.started", {
            "turn_id": turn.id, "digest": turn.digest, "agent": turn.agent,
        })
        task_status.started()
        running.messages = []
        history = await self.transcripts.history(conversation.id)
        context = ToolContext(conversation_id=conversation.id, turn_id=turn.id, agent=turn.agent,
                              digest=turn.digest, root=closure.root, environ=self.runtime.environ,
                              channel=_Channel(self, conversation.id, running), files=self.runtime.files)
        try:
            plan = await self.runtime.plan(closure, tuple(repair_history(history)), turn.input, context)
            async for event in run_turn(plan):
                await self._handle(conversation.id, turn, running, event)
        except CorralError as exc:
            running.outcome = ("failed", exc.envelope()["error"])

    async def _handle(self, conversation_id: str, turn: TurnRecord, running: Running, event: Any) -> None:
        if isinstance(event, Emit):
            await self.emit(conversation_id, event.name, event.data)
            if event.name == "tool.finished":
                outcome = "error" if event.data["is_error"] else "ok"
                self.metrics.tool_calls.inc(event.data["name"], outcome)
        elif isinstance(event, Append):
            await self.store.append_messages(conversation_id, turn.id, [event.message], time.time())
            running.messages.append(event.message)
        elif isinstance(event, Done):
            running.outcome = ("completed", event)

    async def finish(self, conversation: ConversationRecord, running: Running) -> None:
        """Record how the turn ended; runs shielded, whatever happened."""
        turn = running.turn
        outcome = running.outcome
        now = time.time()
        changes: dict[str, Any] = {"ended_at": now}
        try:
            if outcome is None:
                if running.reason == "interrupted":
                    error = {"code": "interrupted", "message": "the server shut down during this turn"}
                    changes.update(status="failed", error=error)
                    await self.emit(conversation.id, "turn.failed", {"turn_id": turn.id, "error": error})
                else:
                    changes.update(status="cancelled", stop_reason="cancelled")
                    await self.emit(conversation.id, "turn.cancelled", {"turn_id": turn.id})
            elif outcome[0] == "failed":
                changes.update(status="failed", error=outcome[1])
                await self.emit(conversation.id, "turn.failed", {"turn_id": turn.id, "error": outcome[1]})
            else:
                done: Done = outcome[1]
                changes.update(status="completed", output=done.output, stop_reason=done.stop_reason,
                               usage=done.usage.to_json())
                await self.emit(conversation.id, "turn.completed", {
                    "turn_id": turn.id, "output": done.output, "stop_reason": done.stop_reason,
                    "usage": done.usage.to_json(),
                })
            await self.store.update_turn(turn.id, **changes)
            await self.set_status(conversation.id, "idle")
        except Exception:
            log.exception("could not record the end of turn %s", turn.id)
        finally:
            self.metrics.busy.inc(amount=-1)
            self.metrics.turns.inc(turn.agent, changes.get("status", "failed"))
            self.metrics.turn_duration.observe(now - turn.started_at, turn.agent)


class _Channel:
    """A turn's way back from its tool calls: events, and the waiting status."""

    def __init__(self, runner: TurnRunner, conversation_id: str, running: Running):
        self.runner = runner
        self.conversation_id = conversation_id
        self.running = running
        self.turn_id = running.turn.id

    async def emit(self, name: str, data: dict[str, Any]) -> None:
        await self.runner.emit(self.conversation_id, name, data)
        if name == "permission.requested":
            self.running.asked = data
            self.running.attention.set()

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
