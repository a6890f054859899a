"""SQLite tables of context management: compacted views, and messages steered into a running turn.

A part of `SQLiteStore` (same connection, same transaction rules). A view
and its `context.compacted` event commit together; steered messages move
from `steers` into the transcript, each with its `message.steered` event,
in one transaction, so a message is either pending or in the transcript,
never both and never lost.
"""

from __future__ import annotations

from typing import Any

from ...messages import UserMessage
from .. import rows
from ..records import ContextView
from ..statements import SQLITE as SQL
from .writes import Tables, check_fence, insert_events, insert_messages


class ContextTables(Tables):
    async def save_context_view(self, view: ContextView, turn_id: str, event: tuple[str, dict[str, Any]],
                                now: float, *, fence: int | None = None) -> int:
        v = view
        with self._write() as db:
            if fence is not None:
                check_fence(db, v.conversation_id, turn_id, fence, self.replica)
            db.execute(SQL.save_view, (v.conversation_id, v.number, v.upto_seq, v.cut_seq, v.summary,
                                       v.tokens, v.strategy, v.created_at))
            return insert_events(db, v.conversation_id, [event], now)[0]

    async def get_context_view(self, conversation_id: str) -> ContextView | None:
        return rows.view(self._db.execute(SQL.get_view, (conversation_id,)).fetchone())

    async def add_steer(self, conversation_id: str, turn_id: str, content: str, now: float,
                        *, key: str | None = None, request: str | None = None,
                        since: float = 0.0) -> int | None:
        with self._write() as db:
            if key is not None:
                db.execute(SQL.expire_steer_key, (conversation_id, key, since))
                recorded = db.execute(SQL.record_steer_key, (conversation_id, key, request, turn_id, now))
                if not recorded.fetchall():
                    return None  # a message was steered under this key already
            (steer_id,) = db.execute(SQL.add_steer, (conversation_id, turn_id, content, now)).fetchone()
            if key is not None:
                db.execute(SQL.key_steer, (conversation_id, key, steer_id))
            return steer_id

    async def steer_key(self, conversation_id: str, key: str, since: float) -> tuple[str, str | None] | None:
        row = self._db.execute(SQL.steer_key, (conversation_id, key, since)).fetchone()
        return None if row is None else (row[0], row[1])

    async def take_steers(self, conversation_id: str, turn_id: str, now: float,
                          *, fence: int | None = None) -> list[tuple[str, int]]:
        if not self._db.execute(SQL.steers_pending, (conversation_id, turn_id)).fetchone():
            return []  # the usual case: nothing, and no write lock taken
        with self._write() as db:
            taken = sorted(db.execute(SQL.take_steers, (conversation_id, turn_id)).fetchall(),
                           key=lambda row: row[0])
            if not taken:
                return []
            if fence is not None:  # refused: the transaction rolls back, and the messages stay pending
                check_fence(db, conversation_id, turn_id, fence, self.replica)
            contents = [content for _, content in taken]
            insert_messages(db, conversation_id, turn_id, [UserMessage(content=c) for c in contents], now)
            seqs = insert_events(db, conversation_id, [
                ("message.steered", {"turn_id": turn_id, "content": c}) for c in contents], now)
        return list(zip(contents, seqs, strict=True))

    async def drop_steers(self, conversation_id: str, turn_id: str,
                          steer_id: int | None = None) -> list[str]:
        with self._write() as db:
            if steer_id is None:
                dropped = db.execute(SQL.take_steers, (conversation_id, turn_id)).fetchall()
            else:
                dropped = db.execute("DELETE FROM steers WHERE conversation_id = ? AND turn_id = ?"
                                     " AND id = ? RETURNING id, content",
                                     (conversation_id, turn_id, steer_id)).fetchall()
            if steer_id is not None and dropped:  # it goes to a turn of its own, under its key if it has one
                db.execute("DELETE FROM steer_keys WHERE steer_id = ?", (steer_id,))
        # by id: rows are `sqlite3.Row`s, which do not compare with each other
        return [row[1] for row in sorted(dropped, key=lambda row: row[0])]
