"""What every part of `SQLiteStore` writes through: its connection, and the writes several parts share.

Each function runs inside its caller's transaction (`Tables._write`). The
store's parts (`conversations`, `journal`, `context`, `coordination`) write
rows of the same tables with the same numbering and the same fencing; they
take these from here, so none imports another's privates.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from ...errors import DuplicateIdempotencyKey, LeaseLost
from ...messages import Message
from ..records import ConversationRecord, TurnRecord
from ..rows import conversation_values, dumps, turn_values
from ..statements import SQLITE as SQL


class Tables:
    """The connection and the transaction every part uses; `SQLiteStore` provides both."""

    _db: sqlite3.Connection
    replica: str
    embedded: bool

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError


def last_seq(db: sqlite3.Connection, conversation_id: str) -> int:
    """The seq of the conversation's last message, shared ones included (0: none)."""
    row = db.execute("SELECT MAX(shared_upto, COALESCE((SELECT MAX(seq) FROM messages"
                     " WHERE conversation_id = c.id), 0)) FROM conversations c WHERE id = ?",
                     (conversation_id,)).fetchone()
    return 0 if row is None else row[0]


def insert_conversation(db: sqlite3.Connection, c: ConversationRecord, *, shares_from: str | None = None,
                        shared_upto: int = 0) -> None:
    """A conversation's row; a fork's names the transcript it shares (see `forks`)."""
    db.execute(SQL.insert_conversation, (*conversation_values(c), shares_from, shared_upto))


def insert_turn(db: sqlite3.Connection, t: TurnRecord) -> None:
    """Insert a turn; raise `DuplicateIdempotencyKey` if its key is taken in the conversation."""
    if t.idempotency_key is not None and db.execute(
        "SELECT 1 FROM turns WHERE conversation_id = ? AND idempotency_key = ?",
        (t.conversation_id, t.idempotency_key),
    ).fetchone():
        raise DuplicateIdempotencyKey(t.idempotency_key)
    db.execute(SQL.insert_turn, turn_values(t))


def update_turn(db: sqlite3.Connection, turn_id: str, columns: Sequence[str], values: Sequence[Any]) -> None:
    db.execute(SQL.update_turn(tuple(columns)), (turn_id, *values))


def set_status(db: sqlite3.Connection, conversation_id: str, status: str, now: float) -> None:
    db.execute("UPDATE conversations SET status = ?, updated_at = ? WHERE id = ?",
               (status, now, conversation_id))


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
    (last,) = db.execute("SELECT COALESCE(MAX(seq), 0) FROM events WHERE conversation_id = ?",
                         (conversation_id,)).fetchone()
    seqs = list(range(last + 1, last + 1 + len(events)))
    db.executemany(
        "INSERT INTO events (conversation_id, seq, name, data, created_at) VALUES (?, ?, ?, ?, ?)",
        [(conversation_id, seq, name, dumps(data), now)
         for seq, (name, data) in zip(seqs, events, strict=True)],
    )
    return seqs


def check_fence(db: sqlite3.Connection, conversation_id: str, turn_id: str, fence: int,
                replica: str) -> None:
    """Raise `LeaseLost` unless the conversation's holder is still this turn, here, under `fence`."""
    row = db.execute("SELECT holder_turn, holder_replica, fence FROM conversations WHERE id = ?",
                     (conversation_id,)).fetchone()
    if row is None or tuple(row) != (turn_id, replica, fence):
        raise LeaseLost(f"turn {turn_id} no longer holds conversation {conversation_id} under fence {fence}")


def release_turn(db: sqlite3.Connection, conversation_id: str, turn_id: str) -> None:
    """The turn leaves the queue, and the conversation's holder if it is."""
    db.execute("DELETE FROM admissions WHERE turn_id = ?", (turn_id,))
    db.execute("UPDATE conversations SET holder_turn = NULL, holder_replica = NULL, lease_until = NULL"
               " WHERE id = ? AND holder_turn = ?", (conversation_id, turn_id))
