"""What the store keeps, as frozen values: the records every port reads and writes.

Rows come back as these (`rows` decodes them, for both dialects); callers
never see a row. `Notice` is what replicas tell each other through the store.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ..messages import Message
from ..statuses import ConversationStatus, PermissionStatus, TurnStatus
from ..turn_events import TurnEvent, read


@dataclass(frozen=True, kw_only=True)
class ConversationRecord:
    id: str
    agent: str  # as requested: "name", "name@sha256:...", or "name@alias"
    agent_name: str
    digest: str  # the digest resolved at creation (pinned conversations keep it)
    pinned: bool
    title: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    status: ConversationStatus = "idle"
    created_at: float = 0.0
    updated_at: float = 0.0
    archived: bool = False  # lists leave it out unless asked for archived ones
    forked_from: dict[str, Any] | None = None  # {"conversation_id", "turn_id" (None: all of it)}


class _Unset:
    """An argument not given (where None is a value: a title may be set to null)."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


@dataclass(frozen=True, kw_only=True)
class TurnRecord:
    id: str
    conversation_id: str
    agent: str
    digest: str
    status: TurnStatus
    input: str = ""
    output: str | None = None
    stop_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    error: dict[str, Any] | None = None  # {"code", "message"}
    idempotency_key: str | None = None
    request_digest: str | None = None  # of the request that held the idempotency key
    started_at: float = 0.0
    ended_at: float | None = None
    attempts: int = 1  # how many times it has run: a turn resumed after a crash runs again


@dataclass(frozen=True, kw_only=True)
class MessageRecord:
    seq: int
    conversation_id: str
    turn_id: str
    message: Message
    created_at: float


@dataclass(frozen=True, kw_only=True)
class EventRecord:
    """One event as stored and published: `(name, data)` as the wire carries it, and its `seq`."""

    seq: int
    conversation_id: str
    name: str
    data: dict[str, Any]
    created_at: float

    @cached_property
    def event(self) -> TurnEvent:
        """The typed value (`turn_events.read`), read once however many streams relay it."""
        return read(self.name, self.data)


@dataclass(frozen=True, kw_only=True)
class StoredDefinition:
    kind: str
    name: str
    digest: str
    spec: dict[str, Any]
    first_seen: float


@dataclass(frozen=True, kw_only=True)
class PermissionRecord:
    id: str
    conversation_id: str
    turn_id: str
    tool_call_id: str
    tool: str
    arguments: dict[str, Any]
    reason: str | None
    status: PermissionStatus  # `cancelled`: its turn ended first
    requested_at: float
    expires_at: float
    decided_by: str | None = None
    decided_at: float | None = None


@dataclass(frozen=True, kw_only=True)
class Holder:
    """The turn that holds a conversation: the one running (or about to) on `replica`."""

    turn_id: str
    replica: str
    fence: int  # increases with every claim of the conversation: a stale holder can be told apart
    lease_until: float


@dataclass(frozen=True, kw_only=True)
class Admitted:
    """What `admit` decided. At most one of `busy` and `joined` is set; with either, nothing was queued."""

    busy: str | None = None  # reject: the turn holding the conversation (or first in its queue)
    joined: str | None = None  # the turn the idempotency key already names (queued, running or ended)
    joined_request: str | None = None  # ... and the request digest it was sent with
    cancel: Holder | None = None  # interrupt: the holder to cancel (queued turns were superseded)
    fence: int | None = None  # queued first and the conversation free: claimed at once (no `claim` needed)


@dataclass(frozen=True, kw_only=True)
class Claim:
    fence: int | None = None  # the conversation is ours with this fencing token; None: not yet
    superseded: bool = False  # an `interrupt` cancelled this queued turn (its queue entry is gone)


@dataclass(frozen=True, kw_only=True)
class Recovered:
    """A turn whose holder's lease lapsed: taken over to run again here (`resumed`, under `fence`;
    `seq` is its `turn.resumed`), or, out of attempts, failed/interrupted (`seq`: its `turn.failed`)."""

    turn: TurnRecord
    seq: int
    resumed: bool = False
    fence: int = 0


@dataclass(frozen=True, kw_only=True)
class ReplicaRecord:
    id: str
    started_at: float
    heartbeat_at: float
    set_digest: str
    running_turns: int


@dataclass(frozen=True, kw_only=True)
class ContextView:
    """What a conversation's model requests carry instead of its older messages (a compaction, §10).

    The transcript keeps every message; a request sends, in order, `summary` (if any), then the
    messages after `upto_seq`, those up to `cut_seq` with their tool results' content cut. The
    latest view of a conversation is the one in force; `number` counts its compactions from 1.
    """

    conversation_id: str
    number: int
    upto_seq: int  # messages with seq <= upto_seq are left out (summarized, or dropped)
    cut_seq: int = 0  # tool results with seq <= cut_seq go with their content cut (truncate)
    summary: str | None = None  # what the model is told of the messages left out
    tokens: int = 0  # the tokens of a request with this view, when it was made
    strategy: str = "summarize"  # summarize | truncate
    created_at: float = 0.0


@dataclass(frozen=True, kw_only=True)
class StoredFile:
    """A file a definition points to, by the digest of its content (the file vault's shared copy)."""

    digest: str
    data: bytes
    mode: int  # permission bits (a script stays executable)


# Notices (dicts with "t" and "r", the sending replica). Sent by the store itself, in the transaction
# that makes them true: {"t": "event", "c": conversation, "s": seq, "n": name} (the last event each
# write appends, and the `turn.failed` of recover_lapsed); {"t": "status", "c": conversation,
# "st": status} (set_conversation_status, begin_turn, end_turn, recover_lapsed); {"t": "queue", "c":
# conversation} (release, end_turn, an `interrupt` admit, recover_lapsed, expired queue entries);
# {"t": "swap", "id": swap_id} (record_swap). Sent by callers through `notify`: whatever else
# replicas tell each other (cancel a turn, a permission decided, reload). A listener that lost its
# connection delivers {"t": "resync"} once back: it may have missed notices. `subscribe` handlers get
# only other replicas' notices, on the event loop.
Notice = dict[str, Any]
