"""The store port: everything that must survive a restart.

Conversations, their turns (each with the agent digest it ran on), the
transcript, the event log with per-conversation sequence numbers (what SSE
replays with `Last-Event-ID`), idempotency keys, and every definition spec
ever served (content-addressed, so a pinned digest resolves after edits and
restarts).

A store is responsible for atomicity of each call and for ordering
(sequence numbers strictly increasing within a conversation). It is not
responsible for busy/idle state in memory, for fan-out to live subscribers,
or for deciding what a turn does.

Lists are keyset-paginated: `after` is the last id/seq the caller saw, and
the caller asks for `limit + 1` rows to know whether there is a next page.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import DuplicateIdempotencyKey  # noqa: F401  (re-exported: what `create_turn` raises)
from ..messages import Message


@dataclass(frozen=True, kw_only=True)
class ConversationRecord:
    id: str
    agent: str  # as requested: "name", "name@sha256:...", or "name@alias"
    agent_name: str
    digest: str  # the digest resolved at creation (pinned conversations keep it)
    pinned: bool
    title: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    status: str = "idle"  # idle | busy | waiting
    created_at: float = 0.0
    updated_at: float = 0.0


@dataclass(frozen=True, kw_only=True)
class TurnRecord:
    id: str
    conversation_id: str
    agent: str
    digest: str
    status: str  # running | waiting | completed | failed | cancelled
    input: str = ""
    output: str | None = None
    stop_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    error: dict[str, Any] | None = None  # {"code", "message"}
    idempotency_key: str | None = None
    request_digest: str | None = None  # of the request that held the idempotency key
    started_at: float = 0.0
    ended_at: float | None = None


@dataclass(frozen=True, kw_only=True)
class MessageRecord:
    seq: int
    conversation_id: str
    turn_id: str
    message: Message
    created_at: float


@dataclass(frozen=True, kw_only=True)
class EventRecord:
    seq: int
    conversation_id: str
    name: str
    data: dict[str, Any]
    created_at: float


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
    status: str  # pending | allowed | denied | expired | cancelled (its turn ended first)
    requested_at: float
    expires_at: float
    decided_by: str | None = None
    decided_at: float | None = None


class Store(Protocol):
    """Every write either commits or raises `StorageError` (and tells `on_failure` first)."""

    on_failure: Callable[[BaseException], None]  # a write failed: the store may be unwritable

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def probe(self) -> None: ...  # a small write; raises StorageError when it cannot commit

    # conversations
    async def create_conversation(self, conversation: ConversationRecord) -> None: ...
    async def get_conversation(self, conversation_id: str) -> ConversationRecord | None: ...
    async def list_conversations(
        self, *, agent: str | None = None, digest: str | None = None, status: str | None = None,
        limit: int = 50, after: str | None = None,
    ) -> list[ConversationRecord]: ...  # newest first; `after` is a conversation id
    async def delete_conversation(self, conversation_id: str) -> bool: ...  # with its turns, messages, events
    async def set_conversation_status(self, conversation_id: str, status: str, now: float) -> None: ...

    # turns
    async def create_turn(self, turn: TurnRecord) -> None: ...  # raises DuplicateIdempotencyKey
    async def update_turn(self, turn_id: str, **changes: Any) -> None: ...  # status, output, ...
    async def get_turn(self, turn_id: str) -> TurnRecord | None: ...
    async def list_turns(self, conversation_id: str, *, limit: int = 50,
                         after: str | None = None) -> list[TurnRecord]: ...  # oldest first
    async def find_turn_by_key(self, conversation_id: str, key: str, since: float) -> TurnRecord | None: ...
    async def recover_interrupted(self, now: float) -> list[TurnRecord]: ...
    # ^ turns left running/waiting by a crash become failed/interrupted; their conversations idle

    # transcript and events
    async def append_messages(self, conversation_id: str, turn_id: str, messages: list[Message],
                              now: float) -> None: ...
    async def list_messages(self, conversation_id: str, *, limit: int = 1000,
                            after: int = 0) -> list[MessageRecord]: ...  # oldest first
    async def append_event(self, conversation_id: str, name: str, data: dict[str, Any],
                           now: float) -> int: ...  # returns the event's seq (1, 2, ...)
    async def list_events(self, conversation_id: str, *, after: int = 0,
                          limit: int = 1000) -> list[EventRecord]: ...

    # definitions ever served (content-addressed)
    # save_definitions ignores digests already stored
    async def save_definitions(self, definitions: list[StoredDefinition]) -> None: ...
    async def get_definition(self, digest: str) -> StoredDefinition | None: ...
    async def find_definitions(self, kind: str, name: str) -> list[StoredDefinition]: ...

    # swap history (newest first; `after` is a swap id) and agent aliases
    async def record_swap(self, swap_id: str, at: float, status: str, report: dict[str, Any]) -> None: ...
    async def list_swaps(self, *, limit: int = 50, after: str | None = None) -> list[dict[str, Any]]: ...
    async def set_alias(self, agent: str, alias: str, digest: str, now: float) -> None: ...
    async def get_alias(self, agent: str, alias: str) -> str | None: ...
    async def list_aliases(self, agent: str) -> list[dict[str, Any]]: ...
    async def delete_alias(self, agent: str, alias: str) -> bool: ...

    # permission requests and decisions (audit)
    async def create_permission(self, record: PermissionRecord) -> None: ...
    async def decide_permission(self, request_id: str, status: str, decided_by: str, now: float) -> bool: ...
    # ^ only a pending request changes; returns whether it did
    async def cancel_pending_permissions(self, now: float) -> int: ...  # at start-up, after a crash
    async def get_permission(self, request_id: str) -> PermissionRecord | None: ...
    async def list_permissions(self, conversation_id: str) -> list[PermissionRecord]: ...
