"""SQLite conversations and their transcripts: rows, reads, forks that share them, deletes.

A part of `SQLiteStore` (same connection, same transaction rules); how a
fork shares its source's rows is `forks`. Reads go link by link (one indexed
range query each): in-process, a statement costs microseconds, so the chain
is walked here rather than in one statement (PostgreSQL's read is one
statement: there, each is a round trip).
"""

from __future__ import annotations

from typing import Any

from ...messages import Message
from ...statuses import ConversationStatus
from .. import rows
from ..forks import chain_sql, fork_base, heir_place, segments
from ..records import UNSET, ConversationRecord, MessageRecord
from ..statements import SQLITE as SQL
from .writes import Tables, insert_conversation, insert_messages, last_seq

_CHAIN = chain_sql("?")
_ROWS = (f"SELECT {rows.MESSAGE_COLUMNS} FROM messages WHERE conversation_id = ? AND seq > ?"
         " AND seq <= ? ORDER BY seq LIMIT ?")
_NO_BOUND = 2**63 - 1


class ConversationTables(Tables):
    async def create_conversation(self, conversation: ConversationRecord) -> None:
        with self._write() as db:
            insert_conversation(db, conversation)

    async def get_conversation(self, conversation_id: str) -> ConversationRecord | None:
        row = self._db.execute(SQL.get_conversation, (conversation_id,)).fetchone()
        return None if row is None else rows.conversation(row)

    async def list_conversations(
        self, *, agent: str | None = None, digest: str | None = None,
        status: ConversationStatus | None = None,
        limit: int = 50, after: str | None = None, archived: bool = False,
    ) -> list[ConversationRecord]:
        """Newest first by (created_at, id); `after` is the last id of the previous page."""
        given = [(column, value) for column, value in (("agent_name", agent), ("digest", digest),
                                                       ("status", status)) if value is not None]
        params: list[Any] = [int(archived), *(value for _, value in given)]
        keyset = None
        if after is not None:
            at = self._db.execute(SQL.conversation_created, (after,)).fetchone()
            keyset, params = ("id", [*params, after]) if at is None else ("time", [*params, after, at[0]])
        sql = SQL.list_conversations(tuple(column for column, _ in given), keyset)
        return [rows.conversation(row) for row in self._db.execute(sql, (*params, limit))]

    async def update_conversation(self, conversation_id: str, *, title: Any = UNSET, metadata: Any = UNSET,
                                  archived: Any = UNSET, now: float) -> bool:
        """Set the fields given (and `updated_at`); whether the conversation exists."""
        changes = {column: value for column, value in (
            ("title", title), ("metadata", metadata if metadata is UNSET else rows.dumps(metadata)),
            ("archived", archived if archived is UNSET else int(archived))) if value is not UNSET}
        if not changes:
            return self._db.execute(SQL.conversation_exists, (conversation_id,)).fetchone() is not None
        with self._write() as db:
            return db.execute(SQL.update_conversation(tuple(changes)),
                              (conversation_id, now, *changes.values())).rowcount > 0

    async def append_messages(self, conversation_id: str, turn_id: str, messages: list[Message],
                              now: float) -> None:
        """Append to the transcript and touch the conversation's `updated_at`."""
        if not messages:
            return
        with self._write() as db:
            insert_messages(db, conversation_id, turn_id, messages, now)

    async def list_messages(self, conversation_id: str, *, limit: int = 1000,
                            after: int = 0) -> list[MessageRecord]:
        """Oldest first, each link of the chain in its range (see `forks`)."""
        db = self._db
        found: list[MessageRecord] = []
        chain = [(row[0], row[1], row[2]) for row in db.execute(_CHAIN, (conversation_id,))]
        for source, lower, upper in segments(chain):
            if len(found) >= limit:
                break
            if upper is not None and upper <= after:
                continue
            page = db.execute(_ROWS, (source, max(lower, after), _NO_BOUND if upper is None else upper,
                                      limit - len(found)))
            found += rows.messages(conversation_id, page)
        return found

    async def turn_messages(self, conversation_id: str, turn_id: str) -> list[MessageRecord]:
        """A turn's messages, oldest first (an index lookup: a turn's rows are its conversation's own)."""
        return rows.messages(conversation_id, self._db.execute(SQL.turn_messages, (conversation_id, turn_id)))

    async def fork_conversation(self, source_id: str, new: ConversationRecord,
                                before_turn_id: str | None) -> bool:
        """`new`, sharing the source's transcript up to the fork point, in one transaction (see `Store`)."""
        with self._write() as db:
            if db.execute(SQL.conversation_exists, (source_id,)).fetchone() is None:
                return False
            cut = ""
            params: list[Any] = [source_id]
            if before_turn_id is not None:
                row = db.execute(SQL.fork_cut, (before_turn_id, source_id)).fetchone()
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
            chain = [(row[0], row[1], row[2]) for row in db.execute(_CHAIN, (source_id,))]
            base, upto = fork_base(chain, point)
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
                db.execute(SQL.hand_rows, (heir[0], conversation_id, heir[1]))
                db.execute(SQL.heir_place, (heir[0], *heir_place(me[0], me[1], heir[1])))
                db.execute(SQL.heir_forks, (heir[0], conversation_id))
            db.execute(SQL.delete_conversation, (conversation_id,))
            return True
