"""A turn as the run stage holds it: its live state, how it ended, and its result.

`ActiveTurn` is one turn in progress on this process: its record, the cancel
scope it runs in, what it added to the transcript, the permission request it
waits on. Its lifecycle (`turn_lifecycle`) begins it (`begin`: its row is
written), runs it and ends it (`end`), once; `Conversations` cancels it
(`cancel`), the `TurnRunner` drives it (`append`, `ask`, `settle`), surfaces
wait on it (`done`, `attention`) and read what it ended with
(`Conversations.result` -> `TurnResult`).

How a turn ends is an `Outcome`, a tagged union: `Completed` (the answer),
`Failed` (an error envelope), `Cancelled` (a client or a later `interrupt`
stopped it), `Interrupted` (the server stopped first: recorded as failed with
code `interrupted`). `ending_of` turns an outcome into an `Ending`: the
turn's final columns and its last event. A turn that goes on elsewhere
(`Stop`: another replica took it over, or this one handed it over) has no
ending here.

This module runs nothing and persists nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio

from ..messages import Message, Usage
from ..statuses import ENDED_STATUSES, EndedStatus, TurnStatus
from ..store.base import TurnRecord
from ..tracing import TurnTrace
from ..turn_events import (
    ABSENT,
    PermissionRequested,
    TurnCancelled,
    TurnCompleted,
    TurnEnded,
    TurnFailed,
)
from .structured import MISSING, OutputSchema

TerminalEvent = Literal["turn.completed", "turn.failed", "turn.cancelled"]
Stop = Literal["lost", "handed_over"]  # why a turn goes on elsewhere: taken over, or handed over

TERMINAL_EVENTS: tuple[TerminalEvent, ...] = ("turn.completed", "turn.failed", "turn.cancelled")
_EVENTS: dict[EndedStatus, TerminalEvent] = dict(zip(ENDED_STATUSES, TERMINAL_EVENTS, strict=True))
CANCELLED_ERROR = {"code": "cancelled", "message": "the turn was cancelled"}
INTERRUPTED_ERROR = {"code": "interrupted", "message": "the server shut down during this turn"}


@dataclass(frozen=True)
class Completed:
    output: str
    stop_reason: str
    usage: Usage
    structured: Any = MISSING  # the output's value, when the turn had an output schema


@dataclass(frozen=True)
class Failed:
    error: Mapping[str, Any]  # the envelope's body: {"code", "message", "details"?}
    usage: Usage | None = None  # what its model requests used before it failed


@dataclass(frozen=True)
class Cancelled:
    pass


@dataclass(frozen=True)
class Interrupted:
    pass


Outcome = Completed | Failed | Cancelled | Interrupted


class HandOff(Exception):
    """A stopping replica's turn reached a checkpoint: it stops here and goes on elsewhere."""


@dataclass(frozen=True, kw_only=True)
class Ending:
    """How a turn ended: its final columns (`changes`) and its last event (`event`, `data`)."""

    conversation_id: str
    turn_id: str
    status: EndedStatus
    ended_at: float
    output: str | None = None
    stop_reason: str | None = None
    usage: Usage | None = None  # a failed turn's too: what it spent counts toward its conversation's budget
    error: Mapping[str, Any] | None = None  # the envelope's body, for a failed turn
    structured: Any = MISSING  # the output's value, when the turn had an output schema
    fence: int | None = None  # the turn's fencing token: an ending is written only while it holds

    @property
    def event(self) -> TerminalEvent:
        return _EVENTS[self.status]

    @property
    def changes(self) -> dict[str, Any]:
        """The turn row's new columns."""
        changes: dict[str, Any] = {"ended_at": self.ended_at, "status": self.status}
        if self.output is not None:
            changes["output"] = self.output
        if self.stop_reason is not None:
            changes["stop_reason"] = self.stop_reason
        if self.usage is not None:
            changes["usage"] = self.usage.to_json()
        if self.error is not None:
            changes["error"] = dict(self.error)
        return changes

    @property
    def terminal(self) -> TurnEnded:
        """Its terminal event."""
        match self.status:
            case "completed":
                assert self.usage is not None
                return TurnCompleted(turn_id=self.turn_id, output=self.output, stop_reason=self.stop_reason,
                                     usage=self.usage.to_json(),
                                     structured=ABSENT if self.structured is MISSING else self.structured)
            case "failed":
                return TurnFailed(turn_id=self.turn_id, error=dict(self.error or {}))
            case _:
                return TurnCancelled(turn_id=self.turn_id)

    @property
    def data(self) -> dict[str, Any]:
        """Its terminal event's data."""
        return self.terminal.to_json()

def ending_of(turn: TurnRecord, outcome: Outcome, now: float, fence: int | None = None) -> Ending:
    ended = {"conversation_id": turn.conversation_id, "turn_id": turn.id, "ended_at": now, "fence": fence}
    if isinstance(outcome, Interrupted):
        outcome = Failed(INTERRUPTED_ERROR)
    match outcome:
        case Completed(output=output, stop_reason=stop_reason, usage=usage, structured=structured):
            return Ending(status="completed", output=output, stop_reason=stop_reason, usage=usage,
                          structured=structured, **ended)
        case Failed(error=error, usage=usage):
            return Ending(status="failed", error=dict(error), usage=usage, **ended)
        case _:
            return Ending(status="cancelled", stop_reason="cancelled", **ended)


@dataclass
class ActiveTurn:
    """One turn in progress here; only its methods change it."""

    record: TurnRecord
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    done: anyio.Event = field(default_factory=anyio.Event)
    attention: anyio.Event = field(default_factory=anyio.Event)  # set when it asks a person, or ends
    started_seq: int = 0  # the seq of its `turn.started`: a stream of this turn replays from there
    outcome: Outcome | None = None
    messages: list[Message] | None = None  # what it added to the transcript, once it ran here
    asked: PermissionRequested | None = None  # the permission request it waits on
    ending: Ending | None = None  # once it ended (also when the store could not take it)
    recorded: bool = False  # its ending is in the store (and the conversation released with it)
    fence: int | None = None  # the fencing token its conversation is held under: every write names it
    stored: bool = False  # its row is in the store: begun here, or begun before and taken over
    stopped: Stop | None = None  # it goes on elsewhere: no ending here
    hand_off: bool = False  # a stopping replica asks it to stop at its next checkpoint
    usage: Usage | None = None  # what its model requests used so far (`loop.Spent`)
    trace: TurnTrace | None = None  # the trace its `turn.started` records: every attempt goes on in it
    output: OutputSchema | None = None  # the request's own output schema (the OpenAI route's), if any
    _interrupted: bool = False

    @property
    def id(self) -> str:
        return self.record.id

    def cancel(self, *, interrupted: bool = False) -> None:
        """Stop it: a client's cancel, or (`interrupted`) the server stopping."""
        self._interrupted = self._interrupted or interrupted
        self.scope.cancel()

    def goes_on_elsewhere(self, why: Stop) -> None:
        """It stops here and goes on elsewhere: this replica records no ending for it."""
        self.stopped = why

    def begin(self, started_seq: int, messages: Sequence[Message] = ()) -> None:
        """Its row and its `turn.started` are in the store: it runs here from now on (`messages`: what
        an earlier attempt of it added, for a turn taken over)."""
        self.stored = True
        self.started_seq = started_seq
        self.messages = list(messages)

    def append(self, message: Message) -> None:
        assert self.messages is not None
        self.messages.append(message)

    def ask(self, request: PermissionRequested) -> None:
        self.asked = request
        self.attention.set()

    def settle(self, outcome: Outcome) -> None:
        self.outcome = outcome

    def final_outcome(self) -> Outcome:
        """What it ended with: a run that produced no outcome was cancelled, or interrupted."""
        if self.outcome is not None:
            return self.outcome
        return Interrupted() if self._interrupted else Cancelled()

    def end(self, ending: Ending | None = None, *, recorded: bool = False) -> None:
        """It is over here: with its `ending` (`recorded` once the store took it), or none (it goes on
        elsewhere, or it never began); whoever waits wakes."""
        self.ending = ending
        self.recorded = recorded
        self.done.set()
        self.attention.set()


@dataclass(frozen=True)
class TurnResult:
    """The answer of a turn that ended, as every surface renders it."""

    turn_id: str
    conversation_id: str
    digest: str
    status: TurnStatus  # an ended one's, or running / waiting for one read as it runs (`waits.read`)
    output: str | None
    messages: tuple[Message, ...]
    usage: Mapping[str, int]
    error: Mapping[str, Any] | None = None
    structured: Any = MISSING  # the parsed output, when the turn ran with an output schema

    @property
    def completed(self) -> bool:
        return self.status == "completed"

    def failure(self) -> Mapping[str, Any]:
        """The error to show for a turn that did not complete (a cancelled one has no stored error)."""
        return self.error or CANCELLED_ERROR

    def to_json(self) -> dict[str, Any]:
        """The non-streaming HTTP answer (§8)."""
        body: dict[str, Any] = {"turn_id": self.turn_id, "digest": self.digest, "status": self.status,
                                "output": self.output, "messages": [m.to_json() for m in self.messages]}
        if self.structured is not MISSING:
            body["structured"] = self.structured
        if self.error:
            body["error"] = dict(self.error)
        return body
