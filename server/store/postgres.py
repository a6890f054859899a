"""The PostgreSQL store: what several replicas share (`CORRAL_DATABASE_URL=postgresql://...`).

asyncpg, a pool of connections, and one more connection that only LISTENs
(`postgres_listener`). Each write is one transaction, and as few statements
as it can be: most are a single statement (an implicit transaction, one
round trip), with their notice folded in (`pg_notify` inside the statement,
so it is sent if and only if the write commits). Only the methods that must
decide under a conversation's lock (`admit`, `claim`, `recover_lapsed`)
take BEGIN ... COMMIT: four round trips (BEGIN, lock, decide, COMMIT), where
a server-side function would take one but hide the logic from this code.
Statements are prepared once per connection (asyncpg's cache), so a
repeated one costs one round trip.

Sequence numbers come from counters on the conversation's row (see
`postgres_schema`): strictly increasing, no gaps, no duplicates, whichever
connection or replica appends.

Split by subject like the SQLite store: opening, notices and conversations
here; turns, transcript, events and a turn's batched writes in
`postgres_turns`; definitions, swaps, aliases, permissions in
`postgres_records`; reading transcripts, forks and deletes in
`postgres_transcripts`; who runs a conversation's turn, replicas and files in
`postgres_coordination`; the pool, its counters and its error handling in
`postgres_pool`; the schema in `postgres_schema`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import asyncpg

from .base import UNSET, ConversationRecord, Notice
from .postgres_context import ContextTables
from .postgres_coordination import CoordinationTables
from .postgres_evals import EvalTables
from .postgres_listener import Listener
from .postgres_pool import CHANNEL, NOTICE_LIMIT, PostgresBase, dumps, notice_sql
from .postgres_records import RecordTables
from .postgres_rows import CONVERSATION_COLUMNS, conversation_record
from .postgres_schema import migrate
from .postgres_transcripts import TranscriptTables
from .postgres_turns import TurnTables
from .stats import StoreStats


class PostgresStore(TranscriptTables, TurnTables, CoordinationTables, RecordTables, ContextTables,
                    EvalTables, PostgresBase):
    """`Store` on a PostgreSQL database; the schema is created or upgraded on open."""

    embedded = False

    def __init__(self, url: str, *, replica: str, min_connections: int = 2, max_connections: int = 10,
                 command_timeout: float | None = 30.0):
        self.url = url
        self.replica = replica
        self.min_connections = min_connections
        self.max_connections = max_connections
        self.command_timeout = command_timeout  # a statement that takes longer fails (StorageError)
        self.on_failure: Callable[[BaseException], None] = lambda exc: None
        self.stats = StoreStats()
        self._pool: asyncpg.Pool | None = None
        self._listener = Listener(self._connect, replica)
        self._handlers = self._listener.handlers

    def _server_settings(self) -> dict[str, str]:
        return {"application_name": f"corral {self.replica}"[:63]}

    async def _connect(self) -> asyncpg.Connection:
        return await asyncpg.connect(self.url, server_settings=self._server_settings(), timeout=10)

    async def open(self) -> None:
        if self._pool is not None:
            return
        # No reset on release: the store never leaves session state on a pooled connection (no SET,
        # LISTEN or advisory lock outside a transaction; asyncpg still rolls back an open one), and
        # the default reset is a round trip per statement (measured: 0.3 ms of wall time each).
        pool = await asyncpg.create_pool(
            self.url, min_size=self.min_connections, max_size=self.max_connections,
            command_timeout=self.command_timeout, server_settings=self._server_settings(), reset=_no_reset)
        try:
            async with pool.acquire() as connection:
                await migrate(connection)  # a schema newer than this code refuses to start
            await self._listener.start()
        except BaseException:
            pool.terminate()
            raise
        self._pool = pool

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        await self._listener.stop()
        try:
            await asyncio.wait_for(pool.close(), timeout=5.0)
        except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            pool.terminate()  # a server that cannot be reached: do not wait on it

    async def probe(self) -> None:
        await self._write("INSERT INTO probes (id, at) VALUES (1, $1)"
                          " ON CONFLICT (id) DO UPDATE SET at = excluded.at", time.time())

    # notices between replicas

    async def notify(self, notice: Notice) -> None:
        payload = json.dumps({**notice, "r": self.replica}, separators=(",", ":"))
        if len(payload.encode()) >= NOTICE_LIMIT:
            raise ValueError(f"a notice must stay under {NOTICE_LIMIT} bytes; send ids, not contents")
        await self._write("SELECT pg_notify($1, $2)", CHANNEL, payload)

    def subscribe(self, handler: Callable[[Notice], None]) -> None:
        self._handlers.append(handler)

    # conversations

    async def create_conversation(self, conversation: ConversationRecord) -> None:
        await self._write(f"INSERT INTO conversations ({CONVERSATION_COLUMNS}) VALUES ({_NEW_ROW})",
                          *_conversation_values(conversation))

    async def get_conversation(self, conversation_id: str) -> ConversationRecord | None:
        row = await self._read_row(f"SELECT {CONVERSATION_COLUMNS} FROM conversations WHERE id = $1",
                                   conversation_id)
        return None if row is None else conversation_record(row)

    async def list_conversations(
        self, *, agent: str | None = None, digest: str | None = None, status: str | None = None,
        limit: int = 50, after: str | None = None, archived: bool = False,
    ) -> list[ConversationRecord]:
        """Newest first by (created_at, id); `after` is the last id of the previous page."""
        where: list[str] = ["archived = $1"]
        params: list[Any] = [archived]
        for column, value in (("agent_name", agent), ("digest", digest), ("status", status)):
            if value is not None:
                params.append(value)
                where.append(f"{column} = ${len(params)}")
        if after is not None:
            at = await self._read_row("SELECT created_at FROM conversations WHERE id = $1", after)
            params.append(after)
            if at is None:  # deleted while the caller paged: our ids sort by creation time
                where.append(f"id < ${len(params)}")
            else:
                params.append(at[0])
                where.append(f"(created_at, id) < (${len(params)}, ${len(params) - 1})")
        sql = f"SELECT {CONVERSATION_COLUMNS} FROM conversations WHERE " + " AND ".join(where)
        params.append(limit)
        sql += f" ORDER BY created_at DESC, id DESC LIMIT ${len(params)}"
        return [conversation_record(row) for row in await self._read(sql, *params)]

    async def update_conversation(self, conversation_id: str, *, title: Any = UNSET, metadata: Any = UNSET,
                                  archived: Any = UNSET, now: float) -> bool:
        """Set the fields given (and `updated_at`); whether the conversation exists."""
        changes = {column: value for column, value in (
            ("title", title), ("metadata", metadata if metadata is UNSET else dumps(metadata)),
            ("archived", archived if archived is UNSET else bool(archived))) if value is not UNSET}
        if not changes:
            found = await self._read_row("SELECT 1 FROM conversations WHERE id = $1", conversation_id)
            return found is not None
        # names from the tuple above; $1 the id, $2 now, then the values
        assignments = ", ".join(f"{column} = ${n}" for n, column in enumerate(changes, start=3))
        return await self._write_status(
            f"UPDATE conversations SET {assignments}, updated_at = $2 WHERE id = $1",
            conversation_id, now, *changes.values()) > 0

    async def set_conversation_status(self, conversation_id: str, status: str, now: float) -> None:
        notice = notice_sql("status", r="$4::text", c="id", st="status")
        await self._write(
            "WITH changed AS (UPDATE conversations SET status = $2, updated_at = $3 WHERE id = $1"
            f" RETURNING id, status) SELECT {notice} FROM changed",
            conversation_id, status, now, self.replica)

    # for tests: cut the listener's connection (the server side), to see it come back
    @property
    def listener_pid(self) -> int | None:
        return self._listener.backend_pid



_NEW_ROW = ", ".join(f"${n}" for n in range(1, 14))  # a conversation's columns, as CONVERSATION_COLUMNS


def _conversation_values(c: ConversationRecord) -> tuple[Any, ...]:
    forked = c.forked_from or {}
    return (c.id, c.agent, c.agent_name, c.digest, c.pinned, c.title, dumps(c.metadata), c.status,
            c.created_at, c.updated_at, c.archived, forked.get("conversation_id"), forked.get("turn_id"))


async def _no_reset(connection: asyncpg.Connection) -> None:
    """A pooled connection needs no reset (see `PostgresStore.open`)."""
