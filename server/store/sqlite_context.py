"""SQLite tables of context management: compacted views, and messages steered into a running turn.

A mixin of `SQLiteStore` (same connection, same transaction rules). A view
and its `context.compacted` event commit together; steered messages move
from `steers` into the transcript, each with its `message.steered` event,
in one transaction, so a message is either pending or in the transcript,
never both and never lost.
"""

from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager
from typing import Any

from ..messages import UserMessage
from .base import ContextView
from .sqlite_coordination import check_fence
from .sqlite_writes import insert_events, insert_messages


class ContextTables:
    _db: sqlite3.Connection
    replica: str

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:  # provided by SQLiteStore
        raise NotImplementedError

    async def save_context_view(self, view: ContextView, turn_id: str, event: tuple[str, dict[str, Any]],
                                now: float, *, fence: int | None = None) -> int:

        v = view
        with self._write() as db:
            if fence is not None:
                check_fence(db, v.conversation_id, turn_id, fence, self.replica)
            db.execute(
                "INSERT INTO context_views (conversation_id, number, upto_seq, cut_seq, summary, tokens,"
                " strategy, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (v.conversation_id, v.number, v.upto_seq, v.cut_seq, v.summary, v.tokens, v.strategy,
                 v.created_at))
            return insert_events(db, v.conversation_id, [event], now)[0]

    async def get_context_view(self, conversation_id: str) -> ContextView | None:
        row = self._db.execute(
            "SELECT conversation_id, number, upto_seq, cut_seq, summary, tokens, strategy, created_at"
            " FROM context_views WHERE conversation_id = ? ORDER BY number DESC LIMIT 1",
            (conversation_id,)).fetchone()
        return None if row is None else ContextView(**dict(row))

    async def add_steer(self, conversation_id: str, turn_id: str, content: str, now: float,
                        *, key: str | None = None, request: str | None = None,
                        since: float = 0.0) -> int | None:
        with self._write() as db:
            if key is not None:
                db.execute("DELETE FROM steer_keys WHERE conversation_id = ? AND key = ? AND created_at < ?",
                           (conversation_id, key, since))
                if db.execute("INSERT INTO steer_keys (conversation_id, key, request_digest, turn_id,"
                              " created_at) VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                              (conversation_id, key, request, turn_id, now)).rowcount == 0:
                    return None  # a message was steered under this key already
            cursor = db.execute("INSERT INTO steers (conversation_id, turn_id, content, created_at)"
                                " VALUES (?, ?, ?, ?)", (conversation_id, turn_id, content, now))
            assert cursor.lastrowid is not None
            if key is not None:
                db.execute("UPDATE steer_keys SET steer_id = ? WHERE conversation_id = ? AND key = ?",
                           (cursor.lastrowid, conversation_id, key))
            return cursor.lastrowid

    async def steer_key(self, conversation_id: str, key: str, since: float) -> tuple[str, str | None] | None:
        row = self._db.execute("SELECT turn_id, request_digest FROM steer_keys WHERE conversation_id = ?"
                               " AND key = ? AND created_at >= ?", (conversation_id, key, since)).fetchone()
        return None if row is None else (row[0], row[1])

    async def take_steers(self, conversation_id: str, turn_id: str, now: float,
                          *, fence: int | None = None) -> list[tuple[str, int]]:

        pending = ("SELECT id, content FROM steers WHERE conversation_id = ? AND turn_id = ? ORDER BY id",
                   (conversation_id, turn_id))
        if not self._db.execute(*pending).fetchone():  # the usual case: nothing, and no write lock taken
            return []
        with self._write() as db:
            rows = db.execute(*pending).fetchall()
            if not rows:
                return []
            if fence is not None:
                check_fence(db, conversation_id, turn_id, fence, self.replica)
            contents = [content for _, content in rows]
            insert_messages(db, conversation_id, turn_id, [UserMessage(content=c) for c in contents], now)
            seqs = insert_events(db, conversation_id, [
                ("message.steered", {"turn_id": turn_id, "content": c}) for c in contents], now)
            db.executemany("DELETE FROM steers WHERE id = ?", [(steer_id,) for steer_id, _ in rows])
        return list(zip(contents, seqs, strict=True))

    async def drop_steers(self, conversation_id: str, turn_id: str,
                          steer_id: int | None = None) -> list[str]:
        only = "" if steer_id is None else " AND id = ?"
        params = (conversation_id, turn_id) if steer_id is None else (conversation_id, turn_id, steer_id)
        with self._write() as db:
            rows = db.execute(f"DELETE FROM steers WHERE conversation_id = ? AND turn_id = ?{only}"
                              " RETURNING id, content", params).fetchall()
            if steer_id is not None and rows:  # it goes to a turn of its own, under its key if it has one
                db.execute("DELETE FROM steer_keys WHERE steer_id = ?", (steer_id,))
        # by id: rows are `sqlite3.Row`s, which do not compare with each other
        return [row[1] for row in sorted(rows, key=lambda row: row[0])]
