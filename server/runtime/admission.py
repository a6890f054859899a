"""Admission: which turn of a conversation may run now, across every replica.

One turn runs per conversation at a time, wherever it runs. The store
decides (`Store.admit`, `claim`, `release`): a new turn enters the
conversation's queue under a busy policy — `reject` (409
`conversation_busy` naming the turn that holds the conversation, on any
replica), `enqueue` (wait in arrival order), `interrupt` (cancel the holder
and every turn queued before this one: those raise `Superseded` and end
without running) — and runs once it is first in the queue and the
conversation is free; it then holds the conversation under a lease that
this replica's heartbeat renews. An Idempotency-Key the queue or a stored
turn already names raises `KeyTaken`. Beyond this replica's concurrent-turn
cap, 503 `overloaded` (the cap is per replica).

Waiting is woken, not polled: a release here wakes this replica's waiters
directly, one elsewhere arrives as a "queue" notice (`on_notice`); a wait
still retries after a lease period, in case a notice was lost.

Not responsible for running, persisting or cancelling a turn's work: it
hands out the slot and tells the running turn to stop (`ActiveTurn.cancel`,
here or through a "cancel" notice to the replica that holds it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio

from ..errors import ConversationBusy, Overloaded, RequestError, StorageError
from ..store.base import Coordination, Holder, Notice
from .active_turn import ActiveTurn

BUSY_POLICIES = ("reject", "enqueue", "interrupt")

log = logging.getLogger("corral.admission")


class Superseded(Exception):
    """A turn that a later `interrupt` cancelled before it could run."""


class KeyTaken(Exception):
    """The request's Idempotency-Key already names a turn (queued, running or ended, on any replica)."""

    def __init__(self, turn_id: str, request: str | None):
        super().__init__(turn_id)
        self.turn_id = turn_id
        self.request = request


@dataclass
class _Wakeup:
    event: anyio.Event = field(default_factory=anyio.Event)
    waiters: int = 0


class Admission:
    def __init__(self, store: Coordination, *, lease_s: float = 10.0, max_turns: int = 1000):
        self.store = store
        self.lease_s = lease_s
        self.max_turns = max_turns
        self._held: dict[str, str] = {}  # turn id -> conversation, for turns holding one here
        self._running: dict[str, ActiveTurn] = {}  # conversation -> the turn running here
        self._cancelled: set[str] = set()  # held here, cancelled before they started
        self._wakeups: dict[str, _Wakeup] = {}

    def check_capacity(self) -> None:
        if len(self._running) >= self.max_turns:
            raise Overloaded(f"too many turns in progress (limit {self.max_turns}); retry shortly")

    def running(self, conversation_id: str) -> ActiveTurn | None:
        """The conversation's turn running on this replica."""
        return self._running.get(conversation_id)

    def running_turns(self) -> list[ActiveTurn]:
        return list(self._running.values())

    def waiting_here(self, conversation_id: str) -> int:
        """How many turns of the conversation wait on this replica for it to be free."""
        wakeup = self._wakeups.get(conversation_id)
        return wakeup.waiters if wakeup is not None else 0

    async def holder(self, conversation_id: str) -> Holder | None:
        """The turn holding the conversation, on whichever replica."""
        return await self.store.holder(conversation_id)

    async def enter(self, conversation_id: str, turn_id: str, policy: str, *, key: str | None = None,
                    request: str | None = None) -> int:
        """Return holding the conversation (its fencing token); raise ConversationBusy (reject),
        Superseded or KeyTaken."""
        if policy not in BUSY_POLICIES:
            raise RequestError(f"if_busy must be one of {', '.join(BUSY_POLICIES)}")
        now = time.time()
        admitted = await self.store.admit(conversation_id, turn_id, policy, now, now + self.lease_s,
                                          key=key, request_digest=request)
        if admitted.joined is not None:
            raise KeyTaken(admitted.joined, admitted.joined_request)
        if admitted.busy is not None:
            raise ConversationBusy(f"the conversation is busy with turn {admitted.busy}",
                                   details={"turn_id": admitted.busy})
        try:
            if policy == "interrupt":
                self.wake(conversation_id)  # turns queued here find themselves superseded
                if admitted.cancel is not None:
                    await self.cancel(admitted.cancel)
            fence = admitted.fence
            if fence is None:  # not claimed at once: wait for our turn in the queue
                fence = await self._claim(conversation_id, turn_id)
            self._held[turn_id] = conversation_id
            return fence
        except BaseException:
            self._held.pop(turn_id, None)
            await self._release(conversation_id, turn_id)
            raise

    @asynccontextmanager
    async def holding(self, conversation_id: str, holder: str) -> AsyncIterator[tuple[str, int]]:
        """Hold the conversation as a turn would, for work that is not a turn (a compaction): (the
        holder's id, its fencing token) while the block runs; 409 `conversation_busy` while one runs."""
        fence = await self.enter(conversation_id, holder, "reject")
        try:
            yield holder, fence
        finally:
            await self.leave(conversation_id, holder)

    async def _claim(self, conversation_id: str, turn_id: str) -> int:
        wakeup = self._wakeups.setdefault(conversation_id, _Wakeup())
        wakeup.waiters += 1
        try:
            while True:
                now = time.time()
                claim = await self.store.claim(conversation_id, turn_id, now, now + self.lease_s)
                if claim.superseded:
                    raise Superseded
                if claim.fence is not None:
                    return claim.fence
                # woken by a release (here, or a notice from elsewhere); the timeout covers a lost notice
                with anyio.move_on_after(self.lease_s):
                    await wakeup.event.wait()
                wakeup = self._wakeups.setdefault(conversation_id, wakeup)
        finally:
            wakeup.waiters -= 1
            if wakeup.waiters <= 0 and self._wakeups.get(conversation_id) is wakeup:
                del self._wakeups[conversation_id]

    def wake(self, conversation_id: str) -> None:
        """The conversation's queue may have moved: its waiters here try their claim again."""
        wakeup = self._wakeups.pop(conversation_id, None)
        if wakeup is not None:
            wakeup.event.set()
            if wakeup.waiters > 0:  # a fresh event for the waiters that find they must wait again
                self._wakeups[conversation_id] = _Wakeup(waiters=wakeup.waiters)

    def adopt(self, conversation_id: str, turn: ActiveTurn) -> None:
        """A turn this replica took over from one that stopped: it holds the conversation already."""
        self._held[turn.id] = conversation_id
        self._running[conversation_id] = turn

    def start(self, conversation_id: str, turn: ActiveTurn) -> None:
        if turn.id in self._cancelled:  # an `interrupt` came while it was starting
            self._cancelled.discard(turn.id)
            raise Superseded
        self._running[conversation_id] = turn

    async def leave(self, conversation_id: str, turn_id: str, *, released: bool = False) -> None:
        """The turn is over: the next one in the conversation's queue may run.
        `released`: the store already let the conversation go, with the turn's ending."""
        self._held.pop(turn_id, None)
        self._cancelled.discard(turn_id)
        running = self._running.get(conversation_id)
        if running is not None and running.id == turn_id:
            del self._running[conversation_id]
        if released:
            self.wake(conversation_id)
        else:
            await self._release(conversation_id, turn_id)

    async def _release(self, conversation_id: str, turn_id: str) -> None:
        """Let the conversation go in the store, even for a cancelled caller: a slot is never kept."""
        try:
            with anyio.CancelScope(shield=True):
                await self.store.release(conversation_id, turn_id)
        except StorageError:
            # its lease lapses without the heartbeat's renewal, and recovery frees the conversation
            log.error("could not release conversation %s from turn %s", conversation_id, turn_id)
        finally:
            self.wake(conversation_id)

    async def cancel(self, holder: Holder, *, interrupted: bool = False) -> None:
        """Stop the turn holding a conversation, on this replica or on the one that runs it."""
        if holder.replica == self.store.replica:
            self.cancel_here(holder.turn_id, interrupted=interrupted)
        else:
            await self.store.notify({"t": "cancel", "turn": holder.turn_id, "to": holder.replica})

    def cancel_here(self, turn_id: str, *, interrupted: bool = False) -> None:
        for turn in self._running.values():
            if turn.id == turn_id:
                turn.cancel(interrupted=interrupted)
                return
        if turn_id in self._held:
            self._cancelled.add(turn_id)

    def on_notice(self, notice: Notice) -> None:
        kind = notice.get("t")
        if kind == "queue":
            self.wake(str(notice.get("c")))
        elif kind == "cancel" and notice.get("to") == self.store.replica:
            self.cancel_here(str(notice.get("turn")))
        elif kind == "resync":
            for conversation_id in list(self._wakeups):
                self.wake(conversation_id)
