"""PostgreSQL tables of a turn's life: turns, the event log, and a turn's batched writes.

A part of `PostgresStore`. Its writes are its own on purpose (SQLite's are
a few plain statements in one in-process transaction, numbered by
`MAX(seq) + 1`, with no notices): every write here is ONE statement (one round
trip, its own transaction), notices included: the counters on the
conversation's row number messages and events (`UPDATE ... RETURNING`, which
also takes the row's lock, so concurrent appenders queue there), and the
rows and their `pg_notify` follow in the same statement's CTEs.

A statement that writes several tables keeps the store's lock order
(conversation row first, see `coordination`): its other writes are
made to depend on the counter's row (`EXISTS (SELECT FROM counter)`), so they
run once that row is locked.

Fencing (`fence=`) stays one statement: the guard is the conversation's row
itself, `WHERE id = ... AND holder_turn = ... AND holder_replica = ... AND
fence = ...` on the counter's `UPDATE` (or on a `FOR NO KEY UPDATE` read for
`update_turn`), and every other write depends on that row. The row lock
serializes the check with a take-over (`recover_lapsed` locks the same row),
and a statement that waited for the lock rechecks the condition on the row
as the take-over left it; so a write either commits under the fence or
writes nothing, and the method raises `LeaseLost`.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from ...errors import DuplicateIdempotencyKey
from ...messages import Message
from ...statuses import ConversationStatus
from .. import rows
from ..records import EventRecord, TurnRecord
from ..rows import TURN_COLUMNS, dumps
from ..statements import POSTGRES as SQL
from .pool import PostgresBase, lease_lost, notice_sql


def _event_notice(replica: str) -> str:
    """The "event" notice of a row a `stored AS (INSERT INTO events ... RETURNING ...)` returns. A
    batch sends one, for its last event: a reader replays everything after the last seq it saw."""
    return notice_sql("event", r=f"{replica}::text", c="conversation_id", s="seq", n="name")


_BUSY = notice_sql("status", r="$19::text", c="$2::text", st="'busy'")


def append_sql(fenced: bool, usage: bool = False) -> str:
    """$1 conversation, $2 turn, $3 message bodies, $4 event names, $5 event data, $6 now, $7 replica;
    `fenced`: $8 the fence, and nothing is written unless ($2, $7, $8) holds the conversation, which
    the first row's `held` says (one row at least, its `seq` NULL when there are no events); `usage`:
    the next parameter is the turn's usage so far, set with them."""
    guard = " AND holder_turn = $2 AND holder_replica = $7 AND fence = $8" if fenced else ""
    # unfenced, a conversation that does not exist fails on the foreign key (numbers from 1), as in
    # SQLite; fenced, the counter's row is the guard: no row, no rows to insert
    source = "FROM counter c, " if fenced else "FROM "
    first_message = "c.messages" if fenced else "COALESCE((SELECT messages FROM counter), 0)"
    first_event = "c.events" if fenced else "COALESCE((SELECT events FROM counter), 0)"
    if fenced:
        result = ("SELECT EXISTS (SELECT FROM counter) AS held, s.seq,"
                  f" CASE WHEN s.seq = max(s.seq) OVER () THEN {_event_notice('$7')} END"
                  " FROM (SELECT) AS one LEFT JOIN stored s ON true ORDER BY s.seq")
    else:
        result = (f"SELECT seq, CASE WHEN seq = max(seq) OVER () THEN {_event_notice('$7')} END"
                  " FROM stored ORDER BY seq")
    return (
        "WITH counter AS (UPDATE conversations SET message_seq = message_seq + cardinality($3::text[]),"
        " event_seq = event_seq + cardinality($4::text[]),"
        " updated_at = CASE WHEN cardinality($3::text[]) > 0 THEN $6 ELSE updated_at END"
        f" WHERE id = $1{guard}"
        " RETURNING message_seq - cardinality($3::text[]) AS messages,"
        " event_seq - cardinality($4::text[]) AS events),"
        " transcript AS (INSERT INTO messages (conversation_id, seq, turn_id, body, created_at)"
        f" SELECT $1, {first_message} + m.n, $2, m.body, $6"
        f" {source}unnest($3::text[]) WITH ORDINALITY AS m (body, n)),"
        f"{_usage_sql(9 if fenced else 8) if usage else ''}"
        " stored AS (INSERT INTO events (conversation_id, seq, name, data, created_at)"
        f" SELECT $1, {first_event} + e.n, e.name, e.data, $6"
        f" {source}unnest($4::text[], $5::text[]) WITH ORDINALITY AS e (name, data, n)"
        " RETURNING conversation_id, seq, name)"
        f" {result}"
    )


def _usage_sql(n: int) -> str:
    return f" used AS (UPDATE turns SET usage = ${n}::text WHERE id = $2 AND EXISTS (SELECT FROM counter)),"


APPEND = append_sql(False)
_APPEND_FENCED = append_sql(True)
_APPEND_USED = append_sql(False, usage=True)
_APPEND_FENCED_USED = append_sql(True, usage=True)

# the turn ($1-$15), then $16 its event's name, $17 its data, $18 now, $19 replica
_BEGIN_TURN = (
    f"WITH created AS (INSERT INTO turns ({TURN_COLUMNS})"
    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)),"
    " counter AS (UPDATE conversations SET event_seq = event_seq + 1, status = 'busy', updated_at = $18"
    " WHERE id = $2 RETURNING id, status, event_seq),"
    " stored AS (INSERT INTO events (conversation_id, seq, name, data, created_at)"
    " VALUES ($2, COALESCE((SELECT event_seq FROM counter), 0), $16, $17, $18)"
    " RETURNING conversation_id, seq, name)"
    f" SELECT seq, {_BUSY}, {_event_notice('$19')} FROM stored"
)
_IDLE = notice_sql("status", r="$6::text", c="$2::text", st="'idle'")
_QUEUE = notice_sql("queue", r="$6::text", c="$2::text")


def _end_turn_sql(columns: list[str], fenced: bool = False) -> str:
    """$1 turn, $2 conversation, $3 event name, $4 data, $5 now, $6 replica, then the turn's changes;
    `fenced`: $7 the fence (the changes follow it), and nothing is written, no row returned, unless
    ($1, $6, $7) holds the conversation."""
    first = 8 if fenced else 7
    assignments = ", ".join(f"{column} = ${n}" for n, column in enumerate(columns, start=first))
    changed = (f" changed AS (UPDATE turns SET {assignments} WHERE id = $1"
               " AND EXISTS (SELECT FROM counter)),") if columns else ""
    guard = " AND holder_turn = $1 AND holder_replica = $6 AND fence = $7" if fenced else ""
    # unfenced, a conversation that does not exist fails on the foreign key, as in SQLite
    event = ("SELECT $2, event_seq, $3, $4, $5 FROM counter" if fenced
             else "VALUES ($2, COALESCE((SELECT event_seq FROM counter), 0), $3, $4, $5)")
    return (
        "WITH counter AS (UPDATE conversations SET event_seq = event_seq + 1, status = 'idle',"
        " updated_at = $5,"
        " holder_turn = CASE WHEN holder_turn = $1 THEN NULL ELSE holder_turn END,"
        " holder_replica = CASE WHEN holder_turn = $1 THEN NULL ELSE holder_replica END,"
        " lease_until = CASE WHEN holder_turn = $1 THEN NULL ELSE lease_until END"
        f" WHERE id = $2{guard} RETURNING event_seq),"
        f"{changed}"
        " dropped AS (DELETE FROM admissions WHERE turn_id = $1 AND EXISTS (SELECT FROM counter)),"
        f" stored AS (INSERT INTO events (conversation_id, seq, name, data, created_at) {event}"
        " RETURNING conversation_id, seq, name)"
        f" SELECT seq, {_event_notice('$6')}, {_IDLE}, {_QUEUE} FROM stored"
    )


def _update_turn_sql(columns: list[str]) -> str:
    """$1 turn, $2 replica, $3 fence, then the changes; one row: `held` (unfenced: `statements`)."""
    first = 4
    # names come from the whitelist
    assignments = ", ".join(f"{column} = ${n}" for n, column in enumerate(columns, start=first))
    # the conversation's row first (the store's lock order), locked: a take-over waits, or is waited for
    return (
        "WITH held AS (SELECT 1 FROM conversations WHERE id = (SELECT conversation_id FROM turns"
        " WHERE id = $1) AND holder_turn = $1 AND holder_replica = $2 AND fence = $3 FOR NO KEY UPDATE),"
        f" changed AS (UPDATE turns SET {assignments} WHERE id = $1 AND EXISTS (SELECT FROM held))"
        " SELECT EXISTS (SELECT FROM held) AS held"
    )


def _duplicate(exc: asyncpg.UniqueViolationError, turn: TurnRecord) -> BaseException:
    if exc.constraint_name == "turns_idempotency_key" and turn.idempotency_key is not None:
        return DuplicateIdempotencyKey(turn.idempotency_key)
    return exc


class JournalTables(PostgresBase):
    async def create_turn(self, turn: TurnRecord) -> None:
        """Insert a turn; raise `DuplicateIdempotencyKey` if its key is taken in the conversation."""
        try:
            await self._write(SQL.insert_turn, *rows.turn_values(turn))
        except asyncpg.UniqueViolationError as exc:
            raise _duplicate(exc, turn) from None

    async def update_turn(self, turn_id: str, *, fence: int | None = None, **changes: Any) -> None:
        """Set only the given columns; with `fence`, only while this turn holds its conversation under it."""
        columns, values = rows.turn_changes(changes)
        if not columns:
            return
        if fence is None:
            await self._write(SQL.update_turn(tuple(columns)), turn_id, *values)
            return
        held = await self._write(_update_turn_sql(columns), turn_id, self.replica, fence, *values)
        if not held[0]["held"]:
            raise lease_lost(turn_id, None, fence)

    async def get_turn(self, turn_id: str) -> TurnRecord | None:
        row = await self._read_row(SQL.get_turn, turn_id)
        return None if row is None else rows.turn(row)

    async def list_turns(self, conversation_id: str, *, limit: int = 50,
                         after: str | None = None) -> list[TurnRecord]:
        """Oldest first by (started_at, id); `after` is the last turn id of the previous page."""
        params: list[Any] = [conversation_id]
        keyset = None
        if after is not None:
            at = await self._read_row(SQL.turn_started, after)
            keyset, params = ("id", [*params, after]) if at is None else ("time", [*params, after, at[0]])
        return [rows.turn(row) for row in await self._read(SQL.list_turns(keyset), *params, limit)]

    async def find_turn_by_key(self, conversation_id: str, key: str, since: float) -> TurnRecord | None:
        row = await self._read_row(SQL.find_turn_by_key, conversation_id, key, since)
        return None if row is None else rows.turn(row)

    async def running_turns(self) -> list[TurnRecord]:
        return [rows.turn(row) for row in await self._read(SQL.running_turns)]

    # transcript and events

    async def set_conversation_status(self, conversation_id: str, status: ConversationStatus,
                                      now: float) -> None:
        notice = notice_sql("status", r="$4::text", c="id", st="status")
        await self._write(
            "WITH changed AS (UPDATE conversations SET status = $2, updated_at = $3 WHERE id = $1"
            f" RETURNING id, status) SELECT {notice} FROM changed",
            conversation_id, status, now, self.replica)

    async def append_event(self, conversation_id: str, name: str, data: dict[str, Any], now: float) -> int:
        """One event on its own (for tests and benchmarks: the server appends through `append`)."""
        (seq,) = await self.append(conversation_id, "", [], [(name, data)], now)
        return seq

    async def append(self, conversation_id: str, turn_id: str, messages: list[Message],
                     events: list[tuple[str, dict[str, Any]]], now: float,
                     *, fence: int | None = None, usage: dict[str, int] | None = None) -> list[int]:
        """Messages and events together, numbered, with the events' notices (and the turn's usage):
        one statement (fenced too)."""
        if not messages and not events:
            return []
        args = (conversation_id, turn_id, [dumps(m.to_json()) for m in messages],
                [name for name, _ in events], [dumps(data) for _, data in events], now, self.replica)
        used = () if usage is None else (dumps(usage),)
        if fence is None:
            return [row["seq"] for row in await self._write(APPEND if usage is None else _APPEND_USED,
                                                            *args, *used)]
        fenced = _APPEND_FENCED if usage is None else _APPEND_FENCED_USED
        written = await self._write(fenced, *args, fence, *used)
        if not written[0]["held"]:
            raise lease_lost(turn_id, conversation_id, fence)
        return [row["seq"] for row in written if row["seq"] is not None]

    async def list_events(self, conversation_id: str, *, after: int = 0,
                          limit: int = 1000) -> list[EventRecord]:
        found = await self._read(SQL.list_events, conversation_id, after, limit)
        return rows.events(conversation_id, found)

    # a turn's writes, batched

    async def begin_turn(self, turn: TurnRecord, event: tuple[str, dict[str, Any]], now: float) -> int:
        """The turn, its conversation busy, its first event, and their notices: one statement."""
        name, data = event
        try:
            begun = await self._write(_BEGIN_TURN, *rows.turn_values(turn), name, dumps(data), now,
                                      self.replica)
        except asyncpg.UniqueViolationError as exc:
            raise _duplicate(exc, turn) from None
        return begun[0]["seq"]

    async def end_turn(self, turn_id: str, conversation_id: str, changes: dict[str, Any],
                       event: tuple[str, dict[str, Any]], now: float, *, fence: int | None = None) -> int:
        """The turn's ending, its event, its conversation idle and released, their notices: one statement
        (fenced too: no row back when the fence no longer holds, and nothing written)."""
        columns, values = rows.turn_changes(changes)
        name, data = event
        args = (turn_id, conversation_id, name, dumps(data), now, self.replica)
        if fence is None:
            ended = await self._write(_end_turn_sql(columns), *args, *values)
        else:
            ended = await self._write(_end_turn_sql(columns, fenced=True), *args, fence, *values)
            if not ended:
                raise lease_lost(turn_id, conversation_id, fence)
        return ended[0]["seq"]
