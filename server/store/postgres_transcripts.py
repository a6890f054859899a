"""PostgreSQL transcripts: reading them, forks that share them, and deleting a conversation forks share from.

A mixin of `PostgresStore`; how a fork shares its source's rows is `forks`.
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

import json
from typing import Any

import asyncpg

from ..messages import message_from_json
from .base import ConversationRecord, MessageRecord
from .forks import CHAIN_LIMIT, chain_sql, fork_base, heir_place
from .postgres_pool import PostgresBase, Transaction, dumps
from .postgres_rows import CONVERSATION_COLUMNS

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
_INSERT = (f"INSERT INTO conversations ({CONVERSATION_COLUMNS}, shares_from, shared_upto, message_seq)"
           " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)")


def _records(conversation_id: str, rows: list[asyncpg.Record]) -> list[MessageRecord]:
    return [MessageRecord(seq=seq, conversation_id=conversation_id, turn_id=turn_id,
                          message=message_from_json(json.loads(body)), created_at=created_at)
            for seq, turn_id, body, created_at in rows]


def _values(c: ConversationRecord) -> tuple[Any, ...]:
    forked = c.forked_from or {}
    return (c.id, c.agent, c.agent_name, c.digest, c.pinned, c.title, dumps(c.metadata), c.status,
            c.created_at, c.updated_at, c.archived, forked.get("conversation_id"), forked.get("turn_id"))


class TranscriptTables(PostgresBase):
    async def list_messages(self, conversation_id: str, *, limit: int = 1000,
                            after: int = 0) -> list[MessageRecord]:
        return _records(conversation_id, await self._read(_READ, conversation_id, after, limit))

    async def turn_messages(self, conversation_id: str, turn_id: str) -> list[MessageRecord]:
        """A turn's messages, oldest first (an index lookup: a turn's rows are its conversation's own)."""
        rows = await self._read("SELECT seq, turn_id, body, created_at FROM messages"
                                " WHERE conversation_id = $1 AND turn_id = $2 ORDER BY seq",
                                conversation_id, turn_id)
        return _records(conversation_id, rows)

    async def fork_conversation(self, source_id: str, new: ConversationRecord,
                                before_turn_id: str | None) -> bool:
        """`new`, sharing the source's transcript up to the fork point, in one transaction (see `Store`)."""
        async with self._transaction() as tx:
            if await tx.fetchrow(_KEY_SHARE, source_id) is None:
                return False
            started_at = None
            if before_turn_id is not None:
                cut = await tx.fetchrow("SELECT started_at FROM turns WHERE id = $1 AND conversation_id = $2",
                                        before_turn_id, source_id)
                if cut is None:
                    return False
                started_at = cut[0]
            last, first = await tx.fetchrow(_POINT, source_id, before_turn_id, started_at)
            point = last if first is None else first - 1
            base, upto = fork_base([tuple(row) for row in await tx.fetch(chain_sql("$1"), source_id)], point)
            if base is not None and base != source_id and await tx.fetchrow(_KEY_SHARE, base) is None:
                base = source_id  # deleted since the chain was read: the source (locked) still reads it
            await tx.execute(_INSERT, *_values(new), base, upto, point)
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
                await tx.execute("UPDATE messages SET conversation_id = $1 WHERE conversation_id = $2"
                                 " AND seq <= $3", heir, conversation_id, upto)
                await tx.execute("UPDATE conversations SET shares_from = $2, shared_upto = $3 WHERE id = $1",
                                 heir, *heir_place(me[0], me[1], upto))
                await tx.execute("UPDATE conversations SET shares_from = $1 WHERE shares_from = $2",
                                 heir, conversation_id)
            await tx.execute("DELETE FROM conversations WHERE id = $1", conversation_id)
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
