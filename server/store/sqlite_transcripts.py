"""SQLite transcripts: reading them, forks that share them, and deleting a conversation forks share from.

A mixin of `SQLiteStore` (same connection, same transaction rules); how a
fork shares its source's rows is `forks`. Reads go link by link (one indexed
range query each): in-process, a statement costs microseconds, so the chain
is walked here rather than in one statement.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import AbstractContextManager
from typing import Any

from ..messages import message_from_json
from .base import ConversationRecord, MessageRecord
from .forks import chain_sql, fork_base, heir_place, segments
from .sqlite_writes import insert_conversation, last_seq

_CHAIN = chain_sql("?")
_ROWS = ("SELECT seq, turn_id, body, created_at FROM messages WHERE conversation_id = ? AND seq > ?"
         " AND seq <= ? ORDER BY seq LIMIT ?")
_NO_BOUND = 2**63 - 1


def chain_of(db: sqlite3.Connection, conversation_id: str) -> list[tuple[str, str | None, int]]:
    """The conversation's row, then the one it shares from, and so on up (see `forks`)."""
    return [(row[0], row[1], row[2]) for row in db.execute(_CHAIN, (conversation_id,))]


def _records(conversation_id: str, rows: Any) -> list[MessageRecord]:
    return [MessageRecord(seq=seq, conversation_id=conversation_id, turn_id=turn_id,
                          message=message_from_json(json.loads(body)), created_at=created_at)
            for seq, turn_id, body, created_at in rows]


class TranscriptTables:
    _db: sqlite3.Connection

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:  # provided by SQLiteStore
        raise NotImplementedError

    async def list_messages(self, conversation_id: str, *, limit: int = 1000,
                            after: int = 0) -> list[MessageRecord]:
        """Oldest first, each link of the chain in its range (see `forks`)."""
        db = self._db
        found: list[MessageRecord] = []
        for source, lower, upper in segments(chain_of(db, conversation_id)):
            if len(found) >= limit:
                break
            if upper is not None and upper <= after:
                continue
            rows = db.execute(_ROWS, (source, max(lower, after), _NO_BOUND if upper is None else upper,
                                      limit - len(found)))
            found += _records(conversation_id, rows)
        return found

    async def turn_messages(self, conversation_id: str, turn_id: str) -> list[MessageRecord]:
        """A turn's messages, oldest first (an index lookup: a turn's rows are its conversation's own)."""
        rows = self._db.execute("SELECT seq, turn_id, body, created_at FROM messages"
                                " WHERE conversation_id = ? AND turn_id = ? ORDER BY seq",
                                (conversation_id, turn_id))
        return _records(conversation_id, rows)

    async def fork_conversation(self, source_id: str, new: ConversationRecord,
                                before_turn_id: str | None) -> bool:
        """`new`, sharing the source's transcript up to the fork point, in one transaction (see `Store`)."""

        with self._write() as db:
            if db.execute("SELECT 1 FROM conversations WHERE id = ?", (source_id,)).fetchone() is None:
                return False
            cut = ""
            params: list[Any] = [source_id]
            if before_turn_id is not None:
                row = db.execute("SELECT started_at FROM turns WHERE id = ? AND conversation_id = ?",
                                 (before_turn_id, source_id)).fetchone()
                if row is None:
                    return False
                cut = " OR (t.started_at, t.id) >= (?, ?)"
                params += [row[0], before_turn_id]
            # the first message of a turn left out (unended, or from the cut on), found turn by turn
            (first,) = db.execute(
                "SELECT MIN((SELECT MIN(seq) FROM messages m WHERE m.conversation_id = t.conversation_id"
                " AND m.turn_id = t.id)) FROM turns t WHERE t.conversation_id = ?"
                f" AND (t.status IN ('running', 'waiting'){cut})", params).fetchone()
            point = last_seq(db, source_id) if first is None else first - 1
            base, upto = fork_base(chain_of(db, source_id), point)
            insert_conversation(db, new, shares_from=base, shared_upto=upto)
            return True

    async def delete_conversation(self, conversation_id: str) -> bool:
        """Delete it with its turns, messages and events (ON DELETE CASCADE); the rows forks share
        from it go to one of them first (see `forks`)."""
        with self._write() as db:
            me = db.execute("SELECT shares_from, shared_upto FROM conversations WHERE id = ?",
                            (conversation_id,)).fetchone()
            if me is None:
                return False
            heir = db.execute("SELECT id, shared_upto FROM conversations WHERE shares_from = ?"
                              " ORDER BY shared_upto DESC, id LIMIT 1", (conversation_id,)).fetchone()
            if heir is not None:
                db.execute("UPDATE messages SET conversation_id = ? WHERE conversation_id = ? AND seq <= ?",
                           (heir[0], conversation_id, heir[1]))
                db.execute("UPDATE conversations SET shares_from = ?, shared_upto = ? WHERE id = ?",
                           (*heir_place(me[0], me[1], heir[1]), heir[0]))
                db.execute("UPDATE conversations SET shares_from = ? WHERE shares_from = ?",
                           (heir[0], conversation_id))
            db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
            return True
