"""A turn as a client that does not stream waits for it: its result, or the person it waits on.

A non-streaming answer must not hold its client while a tool call waits on a
person's yes (`permission: ask`, or a hook answering `ask`): `answer` returns
as soon as the turn ends or waits on a permission request (`Waiting`, which
HTTP answers 202 and the OpenAI route refuses with `permission_required`).
`read` is one turn as `GET …/turns/{turn_id}` shows it, optionally once it
has ended (`wait_s`). Both follow a turn wherever it runs: one running here
is read in memory, one running on another replica through the store, woken
by the conversation's events (`TurnsElsewhere.when`).

Not responsible for running turns or asking people (`conversations`,
`permissions`), nor for how a surface renders what it gets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from ..clock import iso
from ..errors import TurnNotFound
from ..statuses import ENDED_STATUSES
from ..store.base import PermissionStore, TurnJournal, TurnRecord
from .active_turn import ActiveTurn, TurnResult

if TYPE_CHECKING:
    from .conversations import Conversations


@dataclass(frozen=True, kw_only=True)
class PendingRequest:
    """A permission request nobody has answered yet, as a waiting turn's answer lists it (§8)."""

    request_id: str
    tool: str
    input: Any  # the tool call's arguments
    expires_at: str

    def to_json(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "tool": self.tool, "input": self.input,
                "expires_at": self.expires_at}


@dataclass(frozen=True)
class Waiting:
    """A turn paused on permission requests."""

    turn_id: str
    conversation_id: str
    digest: str
    requests: tuple[PendingRequest, ...]

    def to_json(self) -> dict[str, Any]:
        """The 202 answer of a non-streaming message (§8)."""
        return {"turn_id": self.turn_id, "digest": self.digest, "status": "waiting",
                "permission_requests": [r.to_json() for r in self.requests]}


@dataclass(frozen=True)
class TurnView:
    """One turn as it is now: its record, its result so far, and what it waits on (if it waits)."""

    record: TurnRecord
    result: TurnResult
    requests: tuple[PendingRequest, ...] | None  # None unless it waits on a person


async def pending_requests(store: PermissionStore, conversation_id: str,
                           turn_id: str) -> tuple[PendingRequest, ...]:
    """The permission requests of a turn that nobody has answered yet."""
    return tuple(PendingRequest(request_id=p.id, tool=p.tool, input=p.arguments, expires_at=iso(p.expires_at))
                 for p in await store.list_permissions(conversation_id)
                 if p.turn_id == turn_id and p.status == "pending")


async def answer(conversations: Conversations, turn: ActiveTurn) -> TurnResult | Waiting:
    """The turn's result once it ends, or `Waiting` as soon as it waits on a person."""
    follow = _Follow(conversations.store, turn)
    if follow.here:
        # Most turns run here and never ask anyone: their end is told by `attention` alone, without
        # re-reading the turn at each of its events (which a turn followed from elsewhere needs).
        await turn.attention.wait()
        if turn.done.is_set():
            return await conversations.result(turn)
    waiting: Waiting | None = None
    async with anyio.create_task_group() as tg:
        if follow.here:  # its end is seen at once, even one the store refused (then no event tells it)
            tg.start_soon(_cancel_when_done, turn, tg.cancel_scope)
        (waiting,) = await conversations.elsewhere.when(turn.record.conversation_id, follow.check)
        tg.cancel_scope.cancel()
    if waiting is not None:
        return waiting
    if not follow.here and not turn.done.is_set():
        await turn.done.wait()  # a turn followed from another replica: its watcher settles it
    return await conversations.result(turn)


async def _cancel_when_done(turn: ActiveTurn, scope: anyio.CancelScope) -> None:
    await turn.done.wait()
    scope.cancel()


class Followed(TurnJournal, PermissionStore, Protocol):
    """The store's ports a turn is followed through: its row, and its permission requests."""


class _Follow:
    """`answer`'s check, re-run on each of the conversation's events: (None,) once the turn has ended,
    (Waiting,) once it waits on a person, else None."""

    def __init__(self, store: Followed, turn: ActiveTurn):
        self.store = store
        self.turn = turn
        self.here = turn.messages is not None  # it runs (or ran) on this replica: its state is in memory
        self.answered: set[str] = set()  # its requests found answered: not read again at each event

    async def check(self) -> tuple[Waiting | None] | None:
        turn = self.turn
        asked = turn.asked.request_id if turn.asked is not None else None  # before the store is read
        if self.here:
            if turn.done.is_set():
                return (None,)
            if asked is None or asked in self.answered:  # nothing new to read
                return None
        else:  # followed through the store (`done` may be set on a stored turn that still runs)
            record = await self.store.get_turn(turn.id)
            if record is None or record.status in ENDED_STATUSES:
                return (None,)
            if record.status != "waiting":  # set before a request is announced, cleared after it
                return None
        conversation_id = turn.record.conversation_id
        requests = await pending_requests(self.store, conversation_id, turn.id)
        if requests:
            return (Waiting(turn.id, conversation_id, turn.record.digest, requests),)
        if asked is not None:
            self.answered.add(asked)
        return None


async def read(conversations: Conversations, conversation_id: str, turn_id: str,
               wait_s: float | None = None) -> TurnView:
    """One turn of the conversation; with `wait_s`, once it has ended or `wait_s` seconds have passed."""
    conversation = await conversations.get(conversation_id)
    store = conversations.store
    record = await store.get_turn(turn_id)
    if record is None or record.conversation_id != conversation.id:
        raise TurnNotFound(f"conversation {conversation.id!r} has no turn {turn_id!r}",
                           details={"conversation_id": conversation.id, "turn_id": turn_id})
    if wait_s and record.status not in ENDED_STATUSES:
        with anyio.move_on_after(wait_s):
            await conversations.elsewhere.ended(conversation.id, turn_id)
        record = await store.get_turn(turn_id) or record
    as_stored = ActiveTurn(record=record)  # read as the store has it, running or not
    as_stored.done.set()
    result = await conversations.result(as_stored)
    requests = None
    if record.status not in ENDED_STATUSES:
        requests = await pending_requests(store, conversation.id, turn_id)
        if not requests and record.status != "waiting":
            requests = None
    return TurnView(record=record, result=result, requests=requests)
