"""PostgreSQL conversations and their transcripts: rows, reads, forks that share them, deletes.

A part of `PostgresStore`; how a fork shares its source's rows is `forks`.
A read is one statement: the chain (a recursive CTE over a few rows), then
each link's range through the primary key (`LATERAL`, each at most `limit`
rows), merged by seq.

Forks and deletes take BEGIN ... COMMIT, because what they decide must hold
until they commit: a fork takes `FOR KEY SHARE` on the rows it will share
from (the source, and the link it points at), which a delete's `FOR UPDATE`
waits for (and the other way round), so a conversation is never deleted
between a fork's reading it and its commit, and a delete sees every fork
that shares from it. A delete also takes `FOR KEY SHARE` on the
conversation it shares from first (the chain's order, up before down): a
parent's delete and its fork's delete, at once, then run one after the
other, and the second sees what the first handed over.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from ...messages import Message
from ...statuses import ConversationStatus
from .. import rows
from ..forks import CHAIN_LIMIT, chain_sql, fork_base, heir_place
from ..records import UNSET, ConversationRecord, MessageRecord
from ..statements import POSTGRES as SQL
from .journal import append_sql
from .pool import PostgresBase, Transaction

_READ = (
    "WITH RECURSIVE chain (id, base, upto, upper, depth) AS ("
    " SELECT id, shares_from, shared_upto, 9223372036854775807::bigint, 0 FROM conversations WHERE id = $1"
    " UNION ALL SELECT c.id, c.shares_from, c.shared_upto, LEAST(chain.upper, chain.upto), chain.depth + 1"
    f" FROM chain JOIN conversations c ON c.id = chain.base WHERE chain.depth < {CHAIN_LIMIT})"
    " SELECT m.seq, m.turn_id, m.body, m.created_at FROM chain, LATERAL (SELECT seq, turn_id, body,"
    " created_at FROM messages WHERE conversation_id = chain.id AND seq > GREATEST(chain.upto, $2)"
    " AND seq <= chain.upper ORDER BY seq LIMIT $3) m ORDER BY m.seq LIMIT $3"
)
# in one snapshot: the source's last seq, and the first message of a turn the fork leaves out (unended,
# or from the cut on: $2 the cut turn, $3 its started_at), found turn by turn
_POINT = (
    "SELECT c.message_seq, (SELECT MIN((SELECT MIN(seq) FROM messages m"
    " WHERE m.conversation_id = t.conversation_id AND m.turn_id = t.id)) FROM turns t"
    " WHERE t.conversation_id = c.id AND (t.status IN ('running', 'waiting')"
    " OR ($2::text IS NOT NULL AND (t.started_at, t.id) >= ($3::double precision, $2::text)))) AS first"
    " FROM conversations c WHERE c.id = $1"
)
_KEY_SHARE = "SELECT 1 FROM conversations WHERE id = $1 FOR KEY SHARE"
_INSERT = (f"INSERT INTO conversations ({rows.CONVERSATION_COLUMNS}, shares_from, shared_upto, message_seq)"
           " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)")


_APPEND_MESSAGES = append_sql(False)


class ConversationTables(PostgresBase):
    async def create_conversation(self, conversation: ConversationRecord) -> None:
        await self._write(SQL.insert_conversation, *rows.conversation_values(conversation), None, 0)

    async def get_conversation(self, conversation_id: str) -> ConversationRecord | None:
        row = await self._read_row(SQL.get_conversation, conversation_id)
        return None if row is None else rows.conversation(row)

    async def list_conversations(
        self, *, agent: str | None = None, digest: str | None = None,
        status: ConversationStatus | None = None,
        limit: int = 50, after: str | None = None, archived: bool = False,
    ) -> list[ConversationRecord]:
        """Newest first by (created_at, id); `after` is the last id of the previous page."""
        given = [(column, value) for column, value in (("agent_name", agent), ("digest", digest),
                                                       ("status", status)) if value is not None]
        params: list[Any] = [archived, *(value for _, value in given)]
        keyset = None
        if after is not None:
            at = await self._read_row(SQL.conversation_created, after)
            keyset, params = ("id", [*params, after]) if at is None else ("time", [*params, after, at[0]])
        sql = SQL.list_conversations(tuple(column for column, _ in given), keyset)
        return [rows.conversation(row) for row in await self._read(sql, *params, limit)]

    async def update_conversation(self, conversation_id: str, *, title: Any = UNSET, metadata: Any = UNSET,
                                  archived: Any = UNSET, now: float) -> bool:
        """Set the fields given (and `updated_at`); whether the conversation exists."""
        changes = {column: value for column, value in (
            ("title", title), ("metadata", metadata if metadata is UNSET else rows.dumps(metadata)),
            ("archived", archived if archived is UNSET else bool(archived))) if value is not UNSET}
        if not changes:
            return await self._read_row(SQL.conversation_exists, conversation_id) is not None
        # names from the tuple above
        return await self._write_status(SQL.update_conversation(tuple(changes)),
                                        conversation_id, now, *changes.values()) > 0

    async def append_messages(self, conversation_id: str, turn_id: str, messages: list[Message],
                              now: float) -> None:
        """Append to the transcript and touch the conversation's `updated_at` (one statement)."""
        if messages:
            bodies = [rows.dumps(m.to_json()) for m in messages]
            await self._write(_APPEND_MESSAGES, conversation_id, turn_id, bodies, [], [], now, self.replica)

    async def list_messages(self, conversation_id: str, *, limit: int = 1000,
                            after: int = 0) -> list[MessageRecord]:
        return rows.messages(conversation_id, await self._read(_READ, conversation_id, after, limit))

    async def turn_messages(self, conversation_id: str, turn_id: str) -> list[MessageRecord]:
        """A turn's messages, oldest first (an index lookup: a turn's rows are its conversation's own)."""
        return rows.messages(conversation_id, await self._read(SQL.turn_messages, conversation_id, turn_id))

    async def fork_conversation(self, source_id: str, new: ConversationRecord,
                                before_turn_id: str | None) -> bool:
        """`new`, sharing the source's transcript up to the fork point, in one transaction (see `Store`)."""
        async with self._transaction() as tx:
            if await tx.fetchrow(_KEY_SHARE, source_id) is None:
                return False
            started_at = None
            if before_turn_id is not None:
                cut = await tx.fetchrow(SQL.fork_cut, before_turn_id, source_id)
                if cut is None:
                    return False
                started_at = cut[0]
            last, first = await tx.fetchrow(_POINT, source_id, before_turn_id, started_at)
            point = last if first is None else first - 1
            base, upto = fork_base([tuple(row) for row in await tx.fetch(chain_sql("$1"), source_id)], point)
            if base is not None and base != source_id and await tx.fetchrow(_KEY_SHARE, base) is None:
                base = source_id  # deleted since the chain was read: the source (locked) still reads it
            await tx.execute(_INSERT, *rows.conversation_values(new), base, upto, point)
            return True

    async def delete_conversation(self, conversation_id: str) -> bool:
        """Delete it with its turns, messages, events, queue (ON DELETE CASCADE); the rows forks share
        from it go to one of them first (see `forks`)."""
        async with self._transaction() as tx:
            me = await _lock_for_delete(tx, conversation_id)
            if me is None:
                return False
            forks = await tx.fetch("SELECT id, shared_upto FROM conversations WHERE shares_from = $1"
                                   " ORDER BY shared_upto DESC, id FOR NO KEY UPDATE", conversation_id)
            if forks:
                heir, upto = forks[0]
                await tx.execute(SQL.hand_rows, heir, conversation_id, upto)
                await tx.execute(SQL.heir_place, heir, *heir_place(me[0], me[1], upto))
                await tx.execute(SQL.heir_forks, heir, conversation_id)
            await tx.execute(SQL.delete_conversation, conversation_id)
            return True


async def _lock_for_delete(tx: Transaction, conversation_id: str) -> asyncpg.Record | None:
    """Lock what the conversation shares from (FOR KEY SHARE), then the conversation (FOR UPDATE); its
    (shares_from, shared_upto), or None if it does not exist. The first may change before the second
    lock is had (its own source deleted meanwhile): then again, with the new one."""
    me = None
    for _ in range(5):
        row = await tx.fetchrow("SELECT shares_from FROM conversations WHERE id = $1", conversation_id)
        if row is None:
            return None
        if row[0] is not None:
            await tx.fetchrow(_KEY_SHARE, row[0])
        me = await tx.fetchrow("SELECT shares_from, shared_upto FROM conversations WHERE id = $1 FOR UPDATE",
                               conversation_id)
        if me is None or me[0] == row[0]:
            return me
    return me
