"""The result of a turn that ended, as every surface renders it (`TurnResult`).

A turn that ended here is read as it ended (what the store says may lag: an
ending it could not take yet); one that ended elsewhere, or that a retried
request found in the store, as the store has it. A turn that went on
elsewhere is followed to its end there (`lost`), or refused for now
(`handed_over`: this replica is stopping; 503 `overloaded`, read the
conversation or retry with the same key).

Not responsible for running or following turns (`turn_lifecycle`, `elsewhere`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..deployment.registry import Registry
from ..errors import CorralError, Overloaded
from ..messages import Message
from ..store.base import Store, TurnRecord
from .active_turn import ActiveTurn, TurnResult
from .elsewhere import TurnsElsewhere
from .structured import MISSING
from .structured import stored as stored_structured


class TurnResults:
    def __init__(self, store: Store, registry: Registry, elsewhere: TurnsElsewhere):
        self.store = store
        self.registry = registry
        self.elsewhere = elsewhere

    async def result(self, turn: ActiveTurn) -> TurnResult:
        """The answer of a turn, once it has ended (wherever it went on, for one taken over)."""
        await turn.done.wait()
        if turn.stopped == "handed_over":
            raise Overloaded("this replica is stopping: the turn goes on elsewhere; read the conversation,"
                             " or retry with the same Idempotency-Key", details={"turn_id": turn.id})
        if turn.stopped == "lost":
            await self.elsewhere.ended(turn.record.conversation_id, turn.id)
            turn.messages = None  # what this replica saw of it is not the whole turn
        ending = turn.ending
        if ending is not None and ending.usage is not None:  # ended here, all of it known: no read
            record = replace(turn.record, **ending.changes)
        else:
            stored = await self.store.get_turn(turn.id)
            assert stored is not None
            # ended here: what it ended with (what the store says may lag: a failed write)
            record = stored if ending is None else replace(stored, **ending.changes)
        messages = turn.messages if turn.messages is not None else await self._messages(record)
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
            return turn.ending.structured
        try:
            closure = await self.registry.resolve(f"{record.agent}@{record.digest}")
        except CorralError:
            return MISSING
        return stored_structured(closure.agent, record.output)

    async def _messages(self, turn: TurnRecord) -> list[Message]:
        return [r.message for r in await self.store.turn_messages(turn.conversation_id, turn.id)]
