"""Admission: which turn of a conversation may run now.

One turn runs per conversation at a time. A new turn enters under a busy
policy: `reject` (409 `conversation_busy` naming the turn that holds the
conversation), `enqueue` (wait in order), `interrupt` (cancel the running
turn and every turn queued before this one: those raise `Superseded` and end
without running). Beyond the concurrent-turn cap, 503 `overloaded`.

`Admission` is the port; `LocalAdmission` keeps it in this process's memory.
A database-backed one (several replicas on one database) answers the same
calls with leases instead of semaphores.

Not responsible for running, persisting or cancelling a turn's work: it
hands out the slot and tells the running turn to stop (`ActiveTurn.cancel`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

import anyio

from ..errors import ConversationBusy, CorralError, RequestError
from .turn import ActiveTurn

BUSY_POLICIES = ("reject", "enqueue", "interrupt")


class Superseded(Exception):
    """A turn that a later `interrupt` cancelled before it could run."""


class Admission(Protocol):
    def check_capacity(self) -> None: ...  # raises `overloaded` when no further turn may start here
    async def enter(self, conversation_id: str, turn_id: str, policy: str) -> None: ...
    # ^ returns holding the conversation; raises ConversationBusy (reject) or Superseded
    def start(self, conversation_id: str, turn: ActiveTurn) -> None: ...  # raises Superseded
    def leave(self, conversation_id: str, turn_id: str) -> None: ...  # the slot goes to the next
    def running(self, conversation_id: str) -> ActiveTurn | None: ...
    def queue(self, conversation_id: str) -> tuple[str, ...]: ...  # the turn holding it, then those waiting
    def running_turns(self) -> list[ActiveTurn]: ...


@dataclass
class _Slot:
    """One conversation's admission state."""

    lock: anyio.Semaphore = field(default_factory=lambda: anyio.Semaphore(1))
    running: ActiveTurn | None = None
    # Ids of the turn holding the slot (first) and of those waiting for it, in order. Set before
    # any await, so a rejected request always names a turn, even one that is still starting.
    queue: deque[str] = field(default_factory=deque)
    waiting: dict[str, anyio.CancelScope] = field(default_factory=dict)  # turns waiting for the slot
    superseded: set[str] = field(default_factory=set)  # queued turns an `interrupt` cancelled


class LocalAdmission:
    """`Admission` in memory: a semaphore and a queue per conversation."""

    def __init__(self, max_turns: int = 1000):
        self.max_turns = max_turns
        self._slots: dict[str, _Slot] = {}

    def check_capacity(self) -> None:
        if len(self.running_turns()) >= self.max_turns:
            raise CorralError(f"too many turns in progress (limit {self.max_turns}); retry shortly",
                              code="overloaded")

    def running(self, conversation_id: str) -> ActiveTurn | None:
        slot = self._slots.get(conversation_id)
        return slot.running if slot is not None else None

    def queue(self, conversation_id: str) -> tuple[str, ...]:
        slot = self._slots.get(conversation_id)
        return tuple(slot.queue) if slot is not None else ()

    def running_turns(self) -> list[ActiveTurn]:
        return [slot.running for slot in self._slots.values() if slot.running is not None]

    async def enter(self, conversation_id: str, turn_id: str, policy: str) -> None:
        if policy not in BUSY_POLICIES:
            raise RequestError(f"if_busy must be one of {', '.join(BUSY_POLICIES)}")
        slot = self._slots.setdefault(conversation_id, _Slot())
        if slot.queue and policy == "reject":
            busy_with = slot.queue[0]
            raise ConversationBusy(f"the conversation is busy with turn {busy_with}",
                                   details={"turn_id": busy_with})
        if policy == "interrupt":
            _supersede(slot)
        slot.queue.append(turn_id)
        waited = slot.waiting[turn_id] = anyio.CancelScope()
        try:
            with waited:
                await slot.lock.acquire()
        except BaseException:
            self._forget(conversation_id, slot, turn_id)
            raise
        finally:
            slot.waiting.pop(turn_id, None)
        if turn_id in slot.superseded:
            if not waited.cancelled_caught:  # the slot came before the cancellation: pass it on
                slot.lock.release()
            self._forget(conversation_id, slot, turn_id)
            raise Superseded

    def start(self, conversation_id: str, turn: ActiveTurn) -> None:
        slot = self._slots[conversation_id]
        if turn.id in slot.superseded:  # an `interrupt` came while it was starting
            raise Superseded
        slot.running = turn

    def leave(self, conversation_id: str, turn_id: str) -> None:
        slot = self._slots[conversation_id]
        if slot.running is not None and slot.running.id == turn_id:
            slot.running = None
        self._forget(conversation_id, slot, turn_id)
        slot.lock.release()

    def _forget(self, conversation_id: str, slot: _Slot, turn_id: str) -> None:
        slot.superseded.discard(turn_id)
        if turn_id in slot.queue:
            slot.queue.remove(turn_id)
        if not slot.queue and not slot.waiting:
            self._slots.pop(conversation_id, None)


def _supersede(slot: _Slot) -> None:
    """`interrupt`: cancel the running turn and every turn queued before the new one."""
    if slot.running is not None:
        slot.running.cancel()
    for turn_id in slot.queue:
        if slot.running is None or turn_id != slot.running.id:
            slot.superseded.add(turn_id)
            if turn_id in slot.waiting:
                slot.waiting[turn_id].cancel()
