"""Live event streams of a conversation: replay from the store, then follow the hub.

Every event is persisted before it is published, so a reader replays what
the store has after its last seen `seq`, then follows live events; a gap
(a lagging reader the hub dropped, or events published while it replayed)
sends it back to the store. So `Last-Event-ID` resumes without loss or
duplicates. A stream can end after a given turn ends (`until_turn`), as the
answer to a streamed message does.

Not responsible for producing events (`turn_runner`) or fanning them out (`events`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio

from ..store.base import EventRecord, TurnJournal
from ..turn_events import TurnStarted, ends, turn_of
from .events import HEARTBEAT_S, POKE, EventHub

PAGE = 500


class EventStreams:
    def __init__(self, store: TurnJournal, hub: EventHub):
        self.store = store
        self.hub = hub

    async def events(self, conversation_id: str, after: int = 0,
                     until_turn: str | None = None) -> AsyncIterator[EventRecord | None]:
        """Replay from the store after `after`, then follow live; ends after `until_turn` ends.

        Yields `None` as a heartbeat when nothing happened for a while.
        """
        last = after
        while True:
            with self.hub.subscribe(conversation_id) as live:
                async for event in self.replay(conversation_id, last):
                    last = event.seq
                    yield event
                    if until_turn and _ends(event, until_turn):
                        return
                async for event in _follow(live, last):
                    if event is None:
                        yield None
                        continue
                    last = event.seq
                    yield event
                    if until_turn and _ends(event, until_turn):
                        return
                if live.closed_by_hub:
                    return

    async def replay(self, conversation_id: str, after: int) -> AsyncIterator[EventRecord]:
        while True:
            page = await self.store.list_events(conversation_id, after=after, limit=PAGE)
            for event in page:
                after = event.seq
                yield event
            if len(page) < PAGE:
                return

    async def started_seq(self, conversation_id: str, turn_id: str) -> int:
        """The seq of a stored turn's `turn.started` (a scan, but only idempotent retries need it)."""
        async for event in self.replay(conversation_id, 0):
            if event.name == TurnStarted.name and turn_of(event.event) == turn_id:
                return event.seq
        return 0


async def _follow(live, last: int) -> AsyncIterator[EventRecord | None]:
    """Live events after `last`, in order; stops at a gap or when the hub drops us."""
    while True:
        try:
            event = await live.next(HEARTBEAT_S)
        except anyio.EndOfStream:
            return
        if event is None:
            yield None
        elif event is POKE:
            return  # another replica wrote: the caller replays from the store
        elif event.seq > last + 1:
            return  # a gap: the caller replays it from the store
        elif event.seq == last + 1:
            last = event.seq
            yield event


def _ends(record: EventRecord, turn_id: str) -> bool:
    return ends(record.event, turn_id)
