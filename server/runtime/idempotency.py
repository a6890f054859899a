"""Idempotency keys: a retried request joins or returns the turn its key started.

A key is scoped to its conversation and remembered for `ttl_s` (24 h by
default). A key in flight is shared: concurrent duplicates wait for the first
request's turn. A key already stored returns its turn (ended, or still
running elsewhere in the store's view). The same key with a different
request (`request_digest`: the content and `if_busy`, not how the answer is
delivered) is 422 `idempotency_key_reused`.

Not responsible for starting the turn: the caller passes `start`.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio

from ..errors import CorralError, IdempotencyKeyReused
from ..store.base import TurnJournal, TurnRecord
from .active_turn import ActiveTurn


def request_digest(text: str, if_busy: str | None) -> str:
    """What an idempotent request asked for; how its answer is delivered (`stream`) is not part of it."""
    return "sha256:" + hashlib.sha256(json.dumps([text, if_busy]).encode()).hexdigest()


@dataclass
class _InFlight:
    """A request holding a key; duplicates wait for its turn and share it."""

    request: str
    ready: anyio.Event = field(default_factory=anyio.Event)
    turn: ActiveTurn | None = None
    error: BaseException | None = None

    async def joined(self, asked: str) -> ActiveTurn:
        if self.request != asked:
            raise _reused(None)
        await self.ready.wait()
        if self.turn is None:
            raise self.error or CorralError("the original request failed")
        return self.turn


class IdempotencyKeys:
    def __init__(self, store: TurnJournal, ttl_s: float = 86_400):
        self.store = store
        self.ttl_s = ttl_s
        self._in_flight: dict[tuple[str, str], _InFlight] = {}

    async def once(self, conversation_id: str, key: str, asked: str,
                   start: Callable[[], Awaitable[ActiveTurn]],
                   stored: Callable[[TurnRecord], Awaitable[ActiveTurn]]) -> ActiveTurn:
        """The turn this key names: joined, found in the store (`stored` wraps it), or `start()`ed."""
        slot = (conversation_id, key)
        # A key in flight first: its turn is in the store too, but still running, not a result yet.
        if slot in self._in_flight:
            return await self._in_flight[slot].joined(asked)
        found = await self._stored(conversation_id, key)
        if found is not None:
            if found.request_digest is not None and found.request_digest != asked:
                raise _reused(found.id)  # turns stored before request digests were kept cannot tell
            return await stored(found)
        # No await between this check and the reservation: a concurrent duplicate sees one or the other.
        if slot in self._in_flight:
            return await self._in_flight[slot].joined(asked)
        flight = self._in_flight[slot] = _InFlight(asked)
        try:
            flight.turn = await start()
            return flight.turn
        except BaseException as exc:
            flight.error = exc
            self._in_flight.pop(slot, None)
            raise
        finally:
            flight.ready.set()

    async def known(self, conversation_id: str, key: str) -> bool:
        """Whether the key names a turn (in flight here, or stored): a retry of its request."""
        if (conversation_id, key) in self._in_flight:
            return True
        return await self._stored(conversation_id, key) is not None

    def forget(self, conversation_id: str, key: str) -> None:
        """The key's turn ended: from now on the store answers for it."""
        self._in_flight.pop((conversation_id, key), None)

    async def _stored(self, conversation_id: str, key: str) -> TurnRecord | None:
        turn = await self.store.find_turn_by_key(conversation_id, key, 0.0)
        if turn is None:
            return None
        if turn.started_at < time.time() - self.ttl_s:
            # Expired: release the key so it can name a new turn (the store keeps keys unique).
            await self.store.update_turn(turn.id, idempotency_key=None)
            return None
        return turn


def _reused(turn_id: str | None) -> IdempotencyKeyReused:
    return IdempotencyKeyReused("this Idempotency-Key was used with a different request body",
                                details={"turn_id": turn_id} if turn_id else None)
