"""The PostgreSQL store: what several replicas share (`CORRAL_DATABASE_URL=postgresql://...`).

asyncpg, a pool of connections, and one more connection that only LISTENs
(`listener`). Each write is one transaction, and as few statements
as it can be: most are a single statement (an implicit transaction, one
round trip), with their notice folded in (`pg_notify` inside the statement,
so it is sent if and only if the write commits). Only the methods that must
decide under a conversation's lock (`admit`, `claim`, `recover_lapsed`)
take BEGIN ... COMMIT: four round trips (BEGIN, lock, decide, COMMIT), where
a server-side function would take one but hide the logic from this code.
Statements are prepared once per connection (asyncpg's cache), so a
repeated one costs one round trip.

Sequence numbers come from counters on the conversation's row (see
`migrations`): strictly increasing, no gaps, no duplicates, whichever
connection or replica appends.

Split by port like the SQLite store: opening and notices here;
conversations and transcripts (reads, forks, deletes) in `conversations`;
turns, events and a turn's batched writes in `journal`; who runs a
conversation's turn and the replicas in `coordination`; definitions, files,
swaps and aliases in `definitions`; permission requests in `audit`; views and
steers in `context`; the pool, its counters and its error handling in
`pool`; the schema in `migrations`. The statements it shares with SQLite are
`statements`, its rows are read by `rows`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import asyncpg

from ..records import Notice
from ..statements import POSTGRES as SQL
from ..stats import StoreStats
from .audit import AuditTables
from .context import ContextTables
from .conversations import ConversationTables
from .coordination import CoordinationTables
from .definitions import DefinitionTables
from .evals import EvalTables
from .journal import JournalTables
from .listener import Listener
from .migrations import migrate
from .pool import CHANNEL, NOTICE_LIMIT


class PostgresStore(ConversationTables, JournalTables, CoordinationTables, DefinitionTables, AuditTables,
                    ContextTables, EvalTables):
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
        await self._write(SQL.probe, time.time())

    # notices between replicas

    async def notify(self, notice: Notice) -> None:
        payload = json.dumps({**notice, "r": self.replica}, separators=(",", ":"))
        if len(payload.encode()) >= NOTICE_LIMIT:
            raise ValueError(f"a notice must stay under {NOTICE_LIMIT} bytes; send ids, not contents")
        await self._write("SELECT pg_notify($1, $2)", CHANNEL, payload)

    def subscribe(self, handler: Callable[[Notice], None]) -> None:
        self._handlers.append(handler)

    # for tests: cut the listener's connection (the server side), to see it come back
    @property
    def listener_pid(self) -> int | None:
        return self._listener.backend_pid


async def _no_reset(connection: asyncpg.Connection) -> None:
    """A pooled connection needs no reset (see `PostgresStore.open`)."""
