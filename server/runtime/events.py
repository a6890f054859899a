"""Live fan-out of events to subscribers: per conversation, and server-wide.

Events are persisted before they are published (see `turn_runner`), so the hub may
drop: a subscriber that cannot keep up has its stream closed, and its reader
replays what it missed from the store. An event another replica persisted
arrives as a notice carrying only its id: `poke` tells this conversation's
subscribers to read the store (`POKE`), so live readers on every replica see
it without a polling interval. The server-wide stream (`GET /v1/events`:
swaps and conversation status of every replica) is live only, with ids that
increase within this process.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ..store.base import EventRecord

BUFFER = 256
HEARTBEAT_S = 15.0
POKE = object()  # "the store has news for this conversation": a reader replays from its last seq


class Subscription:
    def __init__(self) -> None:
        self.send: MemoryObjectSendStream
        self.receive: MemoryObjectReceiveStream
        self.send, self.receive = anyio.create_memory_object_stream(BUFFER)
        self.closed_by_hub = False

    def offer(self, item: Any) -> None:
        try:
            self.send.send_nowait(item)
        except anyio.WouldBlock:
            self.send.close()  # lagging: the reader replays from the store
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass

    async def next(self, timeout: float) -> Any:
        """The next item, `None` after `timeout` seconds of quiet; raises EndOfStream when closed."""
        item = None
        with anyio.move_on_after(timeout):
            item = await self.receive.receive()
        return item


class EventHub:
    def __init__(self) -> None:
        self._conversations: dict[str, set[Subscription]] = {}
        self._global: set[Subscription] = set()
        self._ids = itertools.count(1)

    @contextmanager
    def subscribe(self, conversation_id: str) -> Iterator[Subscription]:
        sub = Subscription()
        subs = self._conversations.setdefault(conversation_id, set())
        subs.add(sub)
        try:
            yield sub
        finally:
            subs.discard(sub)
            if not subs:
                self._conversations.pop(conversation_id, None)
            sub.send.close()
            sub.receive.close()

    def publish(self, event: EventRecord) -> None:
        for sub in list(self._conversations.get(event.conversation_id, ())):
            sub.offer(event)

    def committed(self, conversation_id: str, events: list[tuple[int, tuple[str, dict[str, Any]]]],
                  now: float) -> None:
        """Events the store committed (each with its seq), to this replica's live readers (the store
        tells the other replicas)."""
        for seq, (name, data) in events:
            self.publish(EventRecord(seq=seq, conversation_id=conversation_id, name=name, data=data,
                                     created_at=now))

    def status(self, conversation_id: str, status: str) -> None:
        """A conversation's new status, on `/v1/events`."""
        self.publish_global("conversation.status", {"conversation_id": conversation_id, "status": status})

    def poke(self, conversation_id: str) -> None:
        for sub in list(self._conversations.get(conversation_id, ())):
            sub.offer(POKE)

    def poke_all(self) -> None:
        """Notices may have been lost (a reconnected listener): every reader checks the store."""
        for conversation_id in list(self._conversations):
            self.poke(conversation_id)

    @contextmanager
    def subscribe_global(self) -> Iterator[Subscription]:
        sub = Subscription()
        self._global.add(sub)
        try:
            yield sub
        finally:
            self._global.discard(sub)
            sub.send.close()
            sub.receive.close()

    def publish_global(self, name: str, data: dict[str, Any]) -> None:
        event = EventRecord(seq=next(self._ids), conversation_id="", name=name, data=data,
                            created_at=time.time())
        for sub in list(self._global):
            sub.offer(event)

    def close_all(self) -> None:
        """End every live stream (shutdown)."""
        for sub in [*self._global, *(s for subs in self._conversations.values() for s in subs)]:
            sub.closed_by_hub = True
            sub.send.close()
