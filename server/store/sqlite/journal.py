"""SQLite tables of a turn's life: turns, the event log, and a turn's batched writes.

A part of `SQLiteStore` (same connection, same transaction rules). Each
batched write (`begin_turn`, `append`, `end_turn`) is one transaction of a
few plain statements; with `fence`, the holder is checked first, in the same
transaction, so a write either commits under the fence or writes nothing.
"""

from __future__ import annotations

from typing import Any

from ...messages import Message
from ...statuses import ConversationStatus
from .. import rows
from ..records import EventRecord, TurnRecord
from ..statements import SQLITE as SQL
from .writes import (
    Tables,
    check_fence,
    insert_events,
    insert_messages,
    insert_turn,
    release_turn,
    set_status,
    update_turn,
)


class JournalTables(Tables):
    async def create_turn(self, turn: TurnRecord) -> None:
        """Insert a turn; raise `DuplicateIdempotencyKey` if its key is taken in the conversation."""
        with self._write() as db:
            insert_turn(db, turn)

    async def update_turn(self, turn_id: str, *, fence: int | None = None, **changes: Any) -> None:
        """Set only the given columns, each one of `rows.TURN_UPDATES`."""
        columns, values = rows.turn_changes(changes)
        if not columns:
            return
        with self._write() as db:
            if fence is not None:
                row = db.execute("SELECT conversation_id FROM turns WHERE id = ?", (turn_id,)).fetchone()
                check_fence(db, row[0] if row else "", turn_id, fence, self.replica)
            update_turn(db, turn_id, columns, values)

    async def get_turn(self, turn_id: str) -> TurnRecord | None:
        row = self._db.execute(SQL.get_turn, (turn_id,)).fetchone()
        return None if row is None else rows.turn(row)

    async def list_turns(self, conversation_id: str, *, limit: int = 50,
                         after: str | None = None) -> list[TurnRecord]:
        """Oldest first by (started_at, id); `after` is the last turn id of the previous page."""
        params: list[Any] = [conversation_id]
        keyset = None
        if after is not None:
            at = self._db.execute(SQL.turn_started, (after,)).fetchone()
            keyset, params = ("id", [*params, after]) if at is None else ("time", [*params, after, at[0]])
        return [rows.turn(row) for row in self._db.execute(SQL.list_turns(keyset), (*params, limit))]

    async def find_turn_by_key(self, conversation_id: str, key: str, since: float) -> TurnRecord | None:
        row = self._db.execute(SQL.find_turn_by_key, (conversation_id, key, since)).fetchone()
        return None if row is None else rows.turn(row)

    async def running_turns(self) -> list[TurnRecord]:
        return [rows.turn(row) for row in self._db.execute(SQL.running_turns)]

    async def set_conversation_status(self, conversation_id: str, status: ConversationStatus,
                                      now: float) -> None:
        with self._write() as db:
            set_status(db, conversation_id, status, now)

    async def list_events(self, conversation_id: str, *, after: int = 0,
                          limit: int = 1000) -> list[EventRecord]:
        found = self._db.execute(SQL.list_events, (conversation_id, after, limit))
        return rows.events(conversation_id, found)

    async def append_event(self, conversation_id: str, name: str, data: dict[str, Any], now: float) -> int:
        """One event on its own (for tests and benchmarks: the server appends through `append`)."""
        with self._write() as db:
            return insert_events(db, conversation_id, [(name, data)], now)[0]

    # a turn's writes, batched

    async def begin_turn(self, turn: TurnRecord, event: tuple[str, dict[str, Any]], now: float) -> int:
        with self._write() as db:
            insert_turn(db, turn)
            set_status(db, turn.conversation_id, "busy", now)
            return insert_events(db, turn.conversation_id, [event], now)[0]

    async def append(self, conversation_id: str, turn_id: str, messages: list[Message],
                     events: list[tuple[str, dict[str, Any]]], now: float,
                     *, fence: int | None = None, usage: dict[str, int] | None = None) -> list[int]:
        if not messages and not events:
            return []
        with self._write() as db:
            if fence is not None:
                check_fence(db, conversation_id, turn_id, fence, self.replica)
            if usage is not None:
                db.execute("UPDATE turns SET usage = ? WHERE id = ?", (rows.dumps(usage), turn_id))
            if messages:
                insert_messages(db, conversation_id, turn_id, messages, now)
            return insert_events(db, conversation_id, events, now) if events else []

    async def end_turn(self, turn_id: str, conversation_id: str, changes: dict[str, Any],
                       event: tuple[str, dict[str, Any]], now: float, *, fence: int | None = None) -> int:
        columns, values = rows.turn_changes(changes)
        with self._write() as db:
            if fence is not None:
                check_fence(db, conversation_id, turn_id, fence, self.replica)
            if columns:
                update_turn(db, turn_id, columns, values)
            seq = insert_events(db, conversation_id, [event], now)[0]
            set_status(db, conversation_id, "idle", now)
            release_turn(db, conversation_id, turn_id)
            return seq
