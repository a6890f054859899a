"""Rows into records and records into rows, for both stores: the one place a column meets a field.

A row is a `sqlite3.Row` or an `asyncpg.Record`; both read by name and by
position, and `dict(row)` of either maps column names to values, so one
function decodes each record for both dialects. Statements name their
columns (`*_COLUMNS`), never `*`: the conversation's row also carries what
no record shows (its holder, its counters, where its transcript is shared
from). JSON is stored as text in both (see `postgres.migrations`), written
by `dumps`; SQLite's booleans are integers, read back with `bool`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from ..canonical import thaw
from ..messages import message_from_json
from .records import (
    ContextView,
    ConversationRecord,
    EventRecord,
    Holder,
    MessageRecord,
    PermissionRecord,
    ReplicaRecord,
    StoredDefinition,
    StoredFile,
    TurnRecord,
)

Row = Any  # a sqlite3.Row or an asyncpg.Record: read by name, by position, and with dict()

CONVERSATION_COLUMNS = ("id, agent, agent_name, digest, pinned, title, metadata, status, created_at,"
                        " updated_at, archived, forked_from_conversation, forked_from_turn")
TURN_COLUMNS = ("id, conversation_id, agent, digest, status, input, output, stop_reason, usage, error,"
                " idempotency_key, request_digest, started_at, ended_at, attempts")
PERMISSION_COLUMNS = ("id, conversation_id, turn_id, tool_call_id, tool, arguments, reason, status,"
                      " requested_at, expires_at, decided_by, decided_at")
DEFINITION_COLUMNS = "kind, name, digest, spec, first_seen"
VIEW_COLUMNS = "conversation_id, number, upto_seq, cut_seq, summary, tokens, strategy, created_at"
MESSAGE_COLUMNS = "seq, turn_id, body, created_at"
HOLDER_COLUMNS = "holder_turn, holder_replica, fence, lease_until"

# what update_turn may change; the JSON ones are encoded on the way in
TURN_UPDATES = frozenset({"status", "output", "stop_reason", "usage", "error", "ended_at", "idempotency_key"})
TURN_JSON = frozenset({"usage", "error"})


def dumps(value: Any) -> str:
    """JSON as both stores write it: compact, Unicode kept."""
    return json.dumps(thaw(value), ensure_ascii=False, separators=(",", ":"))


# records from rows

def conversation(row: Row) -> ConversationRecord:
    fields = dict(row)
    fields["pinned"] = bool(fields["pinned"])
    fields["archived"] = bool(fields["archived"])
    fields["metadata"] = json.loads(fields["metadata"])
    source, turn_id = fields.pop("forked_from_conversation"), fields.pop("forked_from_turn")
    fields["forked_from"] = None if source is None else {"conversation_id": source, "turn_id": turn_id}
    return ConversationRecord(**fields)


def turn(row: Row) -> TurnRecord:
    fields = dict(row)
    fields["usage"] = json.loads(fields["usage"])
    if fields["error"] is not None:
        fields["error"] = json.loads(fields["error"])
    return TurnRecord(**fields)


def messages(conversation_id: str, rows: Iterable[Row]) -> list[MessageRecord]:
    """Rows of `MESSAGE_COLUMNS`."""
    return [MessageRecord(seq=seq, conversation_id=conversation_id, turn_id=turn_id,
                          message=message_from_json(json.loads(body)), created_at=created_at)
            for seq, turn_id, body, created_at in rows]


def events(conversation_id: str, rows: Iterable[Row]) -> list[EventRecord]:
    """Rows of (seq, name, data, created_at)."""
    return [EventRecord(seq=seq, conversation_id=conversation_id, name=name, data=json.loads(data),
                        created_at=created_at)
            for seq, name, data, created_at in rows]


def definition(row: Row) -> StoredDefinition:
    fields = dict(row)
    fields["spec"] = json.loads(fields["spec"])
    return StoredDefinition(**fields)


def permission(row: Row) -> PermissionRecord:
    fields = dict(row)
    fields["arguments"] = json.loads(fields["arguments"])
    return PermissionRecord(**fields)


def holder(row: Row | None) -> Holder | None:
    """A row of `HOLDER_COLUMNS`; None when nobody holds the conversation (or it does not exist)."""
    if row is None or row["holder_turn"] is None:
        return None
    return Holder(turn_id=row["holder_turn"], replica=row["holder_replica"], fence=row["fence"],
                  lease_until=row["lease_until"])


def view(row: Row | None) -> ContextView | None:
    return None if row is None else ContextView(**dict(row))


def replica(row: Row) -> ReplicaRecord:
    return ReplicaRecord(**dict(row))


def stored_file(row: Row | None) -> StoredFile | None:
    return None if row is None else StoredFile(digest=row[0], data=bytes(row[1]), mode=row[2])


# rows from records: the values of an INSERT, in their columns' order

def conversation_values(c: ConversationRecord) -> tuple[Any, ...]:
    """`CONVERSATION_COLUMNS`' values (SQLite stores the booleans as 0 and 1)."""
    forked = c.forked_from or {}
    return (c.id, c.agent, c.agent_name, c.digest, c.pinned, c.title, dumps(c.metadata), c.status,
            c.created_at, c.updated_at, c.archived, forked.get("conversation_id"), forked.get("turn_id"))


def turn_values(t: TurnRecord) -> tuple[Any, ...]:
    """`TURN_COLUMNS`' values."""
    return (t.id, t.conversation_id, t.agent, t.digest, t.status, t.input, t.output, t.stop_reason,
            dumps(t.usage), None if t.error is None else dumps(t.error), t.idempotency_key,
            t.request_digest, t.started_at, t.ended_at, t.attempts)


def permission_values(r: PermissionRecord) -> tuple[Any, ...]:
    """The values of a new request (its first ten columns: no decision yet)."""
    return (r.id, r.conversation_id, r.turn_id, r.tool_call_id, r.tool, json.dumps(r.arguments), r.reason,
            r.status, r.requested_at, r.expires_at)


def turn_changes(changes: dict[str, Any]) -> tuple[list[str], list[Any]]:
    """The columns `update_turn` sets (each one of `TURN_UPDATES`) and their values, JSON encoded."""
    unknown = changes.keys() - TURN_UPDATES
    if unknown:
        raise ValueError(f"update_turn cannot change {', '.join(sorted(unknown))}")
    values = [dumps(value) if column in TURN_JSON and value is not None else value
              for column, value in changes.items()]
    return list(changes), values
