"""The SQLite statements that several of the store's writes share, each inside its caller's transaction.

The store's modules (`sqlite`, `sqlite_transcripts`, `sqlite_context`) all write rows of the same
tables with the same numbering; they take these from here, so none imports another's privates.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from ..canonical import thaw
from ..errors import DuplicateIdempotencyKey
from ..messages import Message
from .base import ConversationRecord, TurnRecord

# what update_turn may change; the JSON ones are encoded on the way in
TURN_COLUMNS = frozenset(
    {"status", "output", "stop_reason", "usage", "error", "ended_at", "idempotency_key"}
)
TURN_JSON = frozenset({"usage", "error"})


def dumps(value: Any) -> str:
    return json.dumps(thaw(value), ensure_ascii=False, separators=(",", ":"))


def last_seq(db: sqlite3.Connection, conversation_id: str) -> int:
    """The seq of the conversation's last message, shared ones included (0: none)."""
    row = db.execute("SELECT MAX(shared_upto, COALESCE((SELECT MAX(seq) FROM messages"
                     " WHERE conversation_id = c.id), 0)) FROM conversations c WHERE id = ?",
                     (conversation_id,)).fetchone()
    return 0 if row is None else row[0]


def check_turn_changes(changes: dict[str, Any]) -> None:
    unknown = changes.keys() - TURN_COLUMNS
    if unknown:
        raise ValueError(f"update_turn cannot change {', '.join(sorted(unknown))}")


def insert_conversation(db: sqlite3.Connection, c: ConversationRecord, *, shares_from: str | None = None,
                         shared_upto: int = 0) -> None:
    """A conversation's row; a fork's names the transcript it shares (see `forks`)."""
    forked = c.forked_from or {}
    db.execute(
        "INSERT INTO conversations (id, agent, agent_name, digest, pinned, title, metadata, status,"
        " created_at, updated_at, archived, forked_from_conversation, forked_from_turn, shares_from,"
        " shared_upto) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (c.id, c.agent, c.agent_name, c.digest, int(c.pinned), c.title, dumps(c.metadata), c.status,
         c.created_at, c.updated_at, int(c.archived), forked.get("conversation_id"), forked.get("turn_id"),
         shares_from, shared_upto),
    )


def insert_turn(db: sqlite3.Connection, t: TurnRecord) -> None:
    """Insert a turn; raise `DuplicateIdempotencyKey` if its key is taken in the conversation."""
    if t.idempotency_key is not None and db.execute(
        "SELECT 1 FROM turns WHERE conversation_id = ? AND idempotency_key = ?",
        (t.conversation_id, t.idempotency_key),
    ).fetchone():
        raise DuplicateIdempotencyKey(t.idempotency_key)
    db.execute(
        "INSERT INTO turns (id, conversation_id, agent, digest, status, input, output, stop_reason,"
        " usage, error, idempotency_key, request_digest, started_at, ended_at, attempts)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (t.id, t.conversation_id, t.agent, t.digest, t.status, t.input, t.output, t.stop_reason,
         dumps(t.usage), None if t.error is None else dumps(t.error), t.idempotency_key,
         t.request_digest, t.started_at, t.ended_at, t.attempts),
    )


def update_turn(db: sqlite3.Connection, turn_id: str, changes: dict[str, Any]) -> None:
    values = [dumps(value) if column in TURN_JSON and value is not None else value
              for column, value in changes.items()]
    assignments = ", ".join(f"{column} = ?" for column in changes)  # names come from the whitelist
    db.execute(f"UPDATE turns SET {assignments} WHERE id = ?", (*values, turn_id))


def set_status(db: sqlite3.Connection, conversation_id: str, status: str, now: float) -> None:
    db.execute("UPDATE conversations SET status = ?, updated_at = ? WHERE id = ?",
               (status, now, conversation_id))


def next_seq(db: sqlite3.Connection, table: str, conversation_id: str) -> int:
    (last,) = db.execute(
        f"SELECT COALESCE(MAX(seq), 0) FROM {table} WHERE conversation_id = ?", (conversation_id,)
    ).fetchone()
    return last + 1


def insert_messages(db: sqlite3.Connection, conversation_id: str, turn_id: str, messages: list[Message],
                     now: float) -> None:
    """Append to the transcript and touch the conversation's `updated_at`."""
    first = last_seq(db, conversation_id) + 1  # after the shared messages of a fork, too
    db.executemany(
        "INSERT INTO messages (conversation_id, seq, turn_id, body, created_at) VALUES (?, ?, ?, ?, ?)",
        [(conversation_id, seq, turn_id, dumps(m.to_json()), now)
         for seq, m in enumerate(messages, start=first)],
    )
    db.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (now, conversation_id))


def insert_events(db: sqlite3.Connection, conversation_id: str,
                   events: list[tuple[str, dict[str, Any]]], now: float) -> list[int]:
    first = next_seq(db, "events", conversation_id)
    seqs = list(range(first, first + len(events)))
    db.executemany(
        "INSERT INTO events (conversation_id, seq, name, data, created_at) VALUES (?, ?, ?, ?, ?)",
        [(conversation_id, seq, name, dumps(data), now)
         for seq, (name, data) in zip(seqs, events, strict=True)],
    )
    return seqs
