"""A turn as the run stage holds it: its live state, how it ended, and its result.

`ActiveTurn` is one turn in progress on this process: its record, the cancel
scope it runs in, what it added to the transcript, the permission request it
waits on. `Conversations` cancels it (`cancel`), the `TurnRunner` drives it
(`begin`, `append`, `ask`, `end`), surfaces wait on it (`done`, `attention`)
and read what it ended with (`Conversations.result` -> `TurnResult`).

How a turn ends is an `Outcome`, a tagged union: `Completed` (the answer),
`Failed` (an error envelope), `Cancelled` (a client or a later `interrupt`
stopped it), `Interrupted` (the server stopped first: recorded as failed with
code `interrupted`). `ending_of` turns an outcome into the turn's final
columns and its last event, `Ending`.

This module runs nothing and persists nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio

from ..messages import Message, Usage
from ..statuses import TurnStatus
from ..store.base import TurnRecord
from ..turn_events import (
    ABSENT,
    PermissionRequested,
    TurnCancelled,
    TurnCompleted,
    TurnEnded,
    TurnFailed,
)
from .structured import MISSING, OutputSchema

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


@dataclass
class Ending:
    """How a turn ended: the turn's new columns and its last event, and how much is written."""

    conversation_id: str
    turn_id: str
    changes: dict[str, Any]
    event: str
    data: dict[str, Any]
    done: int = 0  # 1 once `TurnRunner._record` committed it
    fence: int | None = None  # the turn's fencing token: an ending is written only while it holds


def ending_of(turn: TurnRecord, outcome: Outcome, now: float) -> Ending:
    changes: dict[str, Any] = {"ended_at": now}
    if isinstance(outcome, Interrupted):
        outcome = Failed(INTERRUPTED_ERROR)
    event: TurnEnded
    match outcome:
        case Completed(output=output, stop_reason=stop_reason, usage=usage, structured=structured):
            changes.update(status="completed", output=output, stop_reason=stop_reason, usage=usage.to_json())
            event = TurnCompleted(turn_id=turn.id, output=output, stop_reason=stop_reason,
                                  usage=usage.to_json(),
                                  structured=ABSENT if structured is MISSING else structured)
        case Failed(error=error, usage=usage):
            changes.update(status="failed", error=dict(error))
            if usage is not None:  # spent all the same: a conversation's budget counts it
                changes["usage"] = usage.to_json()
            event = TurnFailed(turn_id=turn.id, error=dict(error))
        case _:
            changes.update(status="cancelled", stop_reason="cancelled")
            event = TurnCancelled(turn_id=turn.id)
    return Ending(turn.conversation_id, turn.id, changes, event.name, event.to_json())


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
    fence: int | None = None  # the fencing token its conversation is held under: every write names it
    stopped: str | None = None  # "lost" (another replica took it over) or "handed_over": it goes on elsewhere
    hand_off: bool = False  # a stopping replica asks it to stop at its next checkpoint
    usage: Usage | None = None  # what its model requests used so far (`loop.Spent`)
    output: OutputSchema | None = None  # the request's own output schema (the OpenAI route's), if any
    _interrupted: bool = False

    @property
    def id(self) -> str:
        return self.record.id

    def cancel(self, *, interrupted: bool = False) -> None:
        """Stop it: a client's cancel, or (`interrupted`) the server stopping."""
        self._interrupted = self._interrupted or interrupted
        self.scope.cancel()

    def stop_here(self, why: str) -> None:
        """It goes on elsewhere (`lost`, `handed_over`): this replica records no ending for it."""
        self.stopped = why
        self.done.set()
        self.attention.set()

    def abandon(self) -> None:
        """It never began (its first write failed): nothing of it is stored; whoever waits wakes."""
        self.done.set()
        self.attention.set()

    def begin(self, started_seq: int) -> None:
        self.started_seq = started_seq
        self.messages = []

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

    def end(self, ending: Ending) -> None:
        self.ending = ending
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
