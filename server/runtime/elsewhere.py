"""Turns this replica does not run: waiting for one to end, following one another request started.

With several replicas a turn may run anywhere: `POST …/interrupt` on one
replica waits for a turn on another to end, and a request whose
Idempotency-Key another replica's request already holds follows that turn
as if it were its own (`joined`; a retried request's turn the store has is
`found`: one that ended as `stored` presents it, one still running followed).
Both wait on the conversation's events, which arrive from every replica
(persisted, then announced), and re-check the store every second in case a
notice was lost: no polling interval when notices flow.

Not responsible for running, cancelling or recording turns (`turn_lifecycle`,
`turn_runner`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
from anyio.abc import TaskGroup

from ..statuses import ENDED_STATUSES
from ..store.base import TurnJournal, TurnRecord
from .active_turn import ActiveTurn
from .admission import Admission
from .bounds import waited
from .streams import EventStreams

T = TypeVar("T")
log = logging.getLogger("corral.conversations")


class TurnsElsewhere:
    def __init__(self, store: TurnJournal, admission: Admission, streams: EventStreams):
        self.store = store
        self.admission = admission
        self.streams = streams

    async def ended(self, conversation_id: str, turn_id: str) -> TurnRecord | None:
        """Wait until a turn running elsewhere has ended; None if it never ran (superseded, or lost)."""

        async def check() -> tuple[TurnRecord | None] | None:
            record = await self.store.get_turn(turn_id)
            if record is not None and record.status in ENDED_STATUSES:
                return (record,)
            if record is None and await self.admission.holder(conversation_id) is None:
                return (None,)
            return None

        (record,) = await self.when(conversation_id, check)
        return record

    async def found(self, turn: TurnRecord, tg: TaskGroup) -> ActiveTurn:
        """The turn the store has under a retried request's key: one that ended, as `stored` presents
        it; one still running (on another replica, or resumed here), followed until it ends (watched in
        `tg`), as the first request waits for it (§9)."""
        if turn.status in ENDED_STATUSES:
            return await self.stored(turn)
        log.info("a retried request follows turn %s of conversation %s until it ends", turn.id,
                 turn.conversation_id)
        return await self.joined(turn.conversation_id, turn.id, tg)

    async def stored(self, turn: TurnRecord) -> ActiveTurn:
        """A turn the store holds, as one that ended (a streamed retry replays from its start)."""
        started_seq = await self.streams.started_seq(turn.conversation_id, turn.id)
        found = ActiveTurn(record=turn, started_seq=started_seq, stored=True)
        found.end()
        return found

    async def joined(self, conversation_id: str, turn_id: str, tg: TaskGroup) -> ActiveTurn:
        """A turn another request started (maybe on another replica): once it has started, as it
        runs (watched in `tg` until it ends); one that already ended, as `stored` presents it."""

        async def started() -> TurnRecord | None:
            return await self.store.get_turn(turn_id)

        with waited(60, f"turn {turn_id}, started by another request with this key, has not begun",
                    turn_id=turn_id):
            record = await self.when(conversation_id, started)
        if record.status in ENDED_STATUSES:
            return await self.stored(record)
        turn = ActiveTurn(record=record, started_seq=await self.streams.started_seq(conversation_id, turn_id),
                          stored=True)
        tg.start_soon(self._watch, turn)
        return turn

    async def _watch(self, turn: ActiveTurn) -> None:
        try:
            ended = await self.ended(turn.record.conversation_id, turn.id)
            if ended is not None:
                turn.record = ended
        finally:
            turn.done.set()
            turn.attention.set()

    async def when(self, conversation_id: str, check: Callable[[], Awaitable[T | None]]) -> T:
        """`check()` once it is not None: re-run on the conversation's news (its events, from any
        replica), and every second in case a notice was lost. (Also how `waits` follows a turn.)"""
        while True:
            with self.streams.hub.subscribe(conversation_id) as live:
                while True:
                    found = await check()
                    if found is not None:
                        return found
                    try:
                        await live.next(1.0)
                    except anyio.EndOfStream:  # dropped (lagging): subscribe again
                        break
            await anyio.sleep(0.05)
