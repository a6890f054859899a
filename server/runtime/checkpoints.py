"""What a turn had committed when its replica stopped: where its next attempt starts.

A turn's checkpoint is what the store holds of it: its input (the turn row),
each model step (an assistant message, with the text deltas committed with
it), and each tool result (with its `tool.finished`, in one transaction).
`Journal` (in `turn_runner`) commits a call's `tool.started` before the call runs,
so a call whose start is committed but whose result is not may have run, in
part or whole: its outcome is unknown. A call still waiting on a person (its
permission request pending), or refused, never ran, whatever the events say.

Not responsible for deciding what to do with an unknown outcome (the loop
asks the tool whether it is `replay_safe`) or for taking the turn over (the
store's `recover_lapsed`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from ..messages import Message, Usage
from ..statuses import PermissionStatus
from ..store.base import ConversationStore, PermissionStore, TurnJournal, TurnRecord
from ..tracing import TurnTrace
from ..turn_events import ToolFinished, ToolStarted, TurnStarted, turn_of

# permission states in which the call did not run
NEVER_RAN: tuple[PermissionStatus, ...] = ("pending", "denied", "expired", "cancelled")


class Records(ConversationStore, TurnJournal, PermissionStore, Protocol):
    """The store's ports a checkpoint reads: the transcript, the event log, the permission requests."""


@dataclass(frozen=True)
class Checkpoint:
    history: tuple[Message, ...]  # the conversation before this turn
    messages: tuple[Message, ...]  # what this turn had added to the transcript
    started: frozenset[str]  # tool calls whose `tool.started` is committed
    unknown: frozenset[str]  # ... that may have run, with no result committed
    started_seq: int  # the seq of the turn's `turn.started`: its stream replays from there
    usage: Usage = field(default_factory=Usage)  # what its model requests used, committed with its steps
    trace: TurnTrace | None = None  # the trace its `turn.started` recorded: every attempt goes on in it


async def checkpoint_of(store: Records, turn: TurnRecord) -> Checkpoint:
    """Read the turn's checkpoint (a resumed turn's one-off cost: the transcript and the events)."""
    own = await store.turn_messages(turn.conversation_id, turn.id)
    history = await _history(store, turn.conversation_id, own[0].seq if own else None)
    messages = tuple(r.message for r in own)
    started: set[str] = set()
    finished: set[str] = set()
    started_seq = 0
    trace = None
    after = 0
    while True:
        page = await store.list_events(turn.conversation_id, after=after, limit=1000)
        for record in page:
            after = record.seq
            event = record.event
            if event.name == TurnStarted.name and turn_of(event) == turn.id:  # typed or not
                started_seq = record.seq
                trace = TurnTrace.of_event(record.data)
                started.clear()
                finished.clear()
            elif started_seq and isinstance(event, ToolStarted):
                started.add(event.tool_call_id)
            elif started_seq and isinstance(event, ToolFinished):
                finished.add(event.tool_call_id)
        if len(page) < 1000:
            break
    held_back = {p.tool_call_id for p in await store.list_permissions(turn.conversation_id)
                 if p.turn_id == turn.id and p.status in NEVER_RAN}
    return Checkpoint(history=history, messages=messages, started=frozenset(started),
                      unknown=frozenset(started - finished - held_back), started_seq=started_seq,
                      usage=Usage(int(turn.usage.get("input_tokens") or 0),
                                  int(turn.usage.get("output_tokens") or 0)), trace=trace)


async def _history(store: ConversationStore, conversation_id: str, before: int | None) -> tuple[Message, ...]:
    """The transcript before seq `before` (None: all of it), page by page: a conversation's turns run
    one at a time, so what precedes a turn's first message is what it had as history."""
    history: list[Message] = []
    after = 0
    while True:
        page = await store.list_messages(conversation_id, after=after, limit=1000)
        for record in page:
            if before is not None and record.seq >= before:
                return tuple(history)
            history.append(record.message)
            after = record.seq
        if len(page) < 1000:
            return tuple(history)
