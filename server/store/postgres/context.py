"""PostgreSQL tables of context management: compacted views, and messages steered into a running turn.

A part of `PostgresStore`. Both writes that go with the transcript or the
event log are rare (a compaction, a steered message picked up), so they take
BEGIN ... COMMIT: the conversation's row lock first (the store's lock order,
see `coordination`), which also checks the fence, then their rows,
then the event (and messages) through the same statement `append` uses, so
numbering and notices are the ones every other append gets.
"""

from __future__ import annotations

from typing import Any

from ...messages import UserMessage
from .. import rows
from ..records import ContextView
from ..rows import dumps
from ..statements import POSTGRES as SQL
from .journal import APPEND
from .pool import PostgresBase, Transaction, lease_lost

_LOCK = "SELECT holder_turn, holder_replica, fence FROM conversations WHERE id = $1 FOR NO KEY UPDATE"


class ContextTables(PostgresBase):
    async def _locked(self, tx: Transaction, conversation_id: str, turn_id: str, fence: int | None) -> None:
        """Lock the conversation's row; with `fence`, raise `LeaseLost` unless the turn still holds it."""
        row = await tx.fetchrow(_LOCK, conversation_id)
        if fence is not None and (row is None or tuple(row) != (turn_id, self.replica, fence)):
            raise lease_lost(turn_id, conversation_id, fence)

    async def _append(self, tx: Transaction, conversation_id: str, turn_id: str, messages: list[str],
                      events: list[tuple[str, dict[str, Any]]], now: float) -> list[int]:
        stored = await tx.fetch(APPEND, conversation_id, turn_id, messages, [n for n, _ in events],
                                [dumps(d) for _, d in events], now, self.replica)
        return [row["seq"] for row in stored]

    async def save_context_view(self, view: ContextView, turn_id: str, event: tuple[str, dict[str, Any]],
                                now: float, *, fence: int | None = None) -> int:
        v = view
        async with self._transaction() as tx:
            await self._locked(tx, v.conversation_id, turn_id, fence)
            await tx.execute(SQL.save_view, v.conversation_id, v.number, v.upto_seq, v.cut_seq, v.summary,
                             v.tokens, v.strategy, v.created_at)
            (seq,) = await self._append(tx, v.conversation_id, turn_id, [], [event], now)
        return seq

    async def get_context_view(self, conversation_id: str) -> ContextView | None:
        return rows.view(await self._read_row(SQL.get_view, conversation_id))

    async def add_steer(self, conversation_id: str, turn_id: str, content: str, now: float,
                        *, key: str | None = None, request: str | None = None,
                        since: float = 0.0) -> int | None:
        if key is None:
            added = await self._write(SQL.add_steer, conversation_id, turn_id, content, now)
            return added[0]["id"]
        async with self._transaction() as tx:
            await tx.execute(SQL.expire_steer_key, conversation_id, key, since)
            recorded = await tx.fetch(SQL.record_steer_key, conversation_id, key, request, turn_id, now)
            if not recorded:
                return None  # a message was steered under this key already
            row = await tx.fetchrow(SQL.add_steer, conversation_id, turn_id, content, now)
            assert row is not None
            steer_id = row["id"]
            await tx.execute(SQL.key_steer, conversation_id, key, steer_id)
        return steer_id

    async def steer_key(self, conversation_id: str, key: str, since: float) -> tuple[str, str | None] | None:
        row = await self._read_row(SQL.steer_key, conversation_id, key, since)
        return None if row is None else (row["turn_id"], row["request_digest"])

    async def take_steers(self, conversation_id: str, turn_id: str, now: float,
                          *, fence: int | None = None) -> list[tuple[str, int]]:
        if await self._read_row(SQL.steers_pending, conversation_id, turn_id) is None:
            return []  # the usual case: one read, no transaction
        async with self._transaction() as tx:
            await self._locked(tx, conversation_id, turn_id, fence)
            taken = sorted(await tx.fetch(SQL.take_steers, conversation_id, turn_id),
                           key=lambda row: row["id"])
            if not taken:
                return []
            contents = [row["content"] for row in taken]
            seqs = await self._append(
                tx, conversation_id, turn_id, [dumps(UserMessage(content=c).to_json()) for c in contents],
                [("message.steered", {"turn_id": turn_id, "content": c}) for c in contents], now)
        return list(zip(contents, seqs, strict=True))

    async def drop_steers(self, conversation_id: str, turn_id: str,
                          steer_id: int | None = None) -> list[str]:
        if steer_id is None:
            dropped = await self._write(SQL.take_steers, conversation_id, turn_id)
        else:  # it goes to a turn of its own, under its key if it has one
            dropped = await self._write("WITH gone AS (DELETE FROM steers WHERE conversation_id = $1"
                                     " AND turn_id = $2 AND id = $3 RETURNING id, content),"
                                     " unkeyed AS (DELETE FROM steer_keys"
                                     " WHERE steer_id IN (SELECT id FROM gone)) SELECT id, content FROM gone",
                                     conversation_id, turn_id, steer_id)
        return [row["content"] for row in sorted(dropped, key=lambda row: row["id"])]
