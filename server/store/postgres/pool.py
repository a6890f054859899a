"""What every part of `PostgresStore` sends its statements through: the pool, the counters, the errors.

A write is one call here: `_write` for a single statement (its own implicit
transaction: one round trip, no BEGIN or COMMIT), `_transaction` for the few
methods that must hold a row lock across statements. Reads go through
`_read`. Every statement is counted in `stats` (BEGIN and COMMIT too, as the
SQLite store counts them: on PostgreSQL each one is a round trip), and every
write transaction once.

Errors: a constraint violation (unique, foreign key, not null) is the
caller's bug and stays asyncpg's exception, as SQLite's `IntegrityError`
does. Anything else (the server unreachable, a connection lost, a disk full,
a read-only server, a time-out) tells `on_failure` and raises
`StorageError`, whose message names the error's class and SQLSTATE only:
never the URL, a password or a value; `StoreUnreachable` when the server
could not be reached (lost or refused connections, a server shutting down
or starting up), which a running turn retries.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import asyncpg

from ...errors import LeaseLost, StorageError, StoreUnreachable
from ..stats import StoreStats

CHANNEL = "corral"  # the LISTEN/NOTIFY channel every replica of one database shares
NOTICE_LIMIT = 8000  # PostgreSQL's payload limit (bytes); ours hold ids only


def notice_sql(kind: str, **fields: str) -> str:
    """`pg_notify` of a notice built in SQL, for a statement that sends it with its write.

    `fields` maps notice keys to SQL expressions (parameters carry a cast:
    `json_build_object` needs to know their types).
    """
    pairs = "".join(f", '{key}', {expression}" for key, expression in fields.items())
    return f"pg_notify('{CHANNEL}', json_build_object('t', '{kind}'{pairs})::text)"


def describe(exc: BaseException) -> str:
    """What went wrong, without anything the error may quote (a URL, a value)."""
    if isinstance(exc, asyncpg.PostgresError):
        return f"the store could not commit: PostgreSQL error {exc.sqlstate} ({type(exc).__name__})"
    return f"the store could not commit: the connection to PostgreSQL failed ({type(exc).__name__})"


# The server went away or is not there yet (restarting, failing over): a statement may succeed on a
# new connection once it is back. A statement time-out is not one of these: it may still commit.
_UNREACHABLE = (asyncpg.PostgresConnectionError, asyncpg.CannotConnectNowError, asyncpg.AdminShutdownError,
                asyncpg.CrashShutdownError, ConnectionError)


def unreachable(exc: BaseException) -> bool:
    """Whether a failure means the server could not be reached (see `StoreUnreachable`)."""
    if isinstance(exc, _UNREACHABLE):
        return True
    # any other socket error (refused, reset, unreachable); a time-out may be a slow statement that commits
    return isinstance(exc, OSError) and not isinstance(exc, TimeoutError)


def lease_lost(turn_id: str, conversation_id: str | None, fence: int) -> LeaseLost:
    """What a fenced write raises when its fence no longer holds (the words of the SQLite store's)."""
    conversation = "its conversation" if conversation_id is None else f"conversation {conversation_id}"
    return LeaseLost(f"turn {turn_id} no longer holds {conversation} under fence {fence}")


class Transaction:
    """One connection inside BEGIN ... COMMIT, counting what it sends."""

    def __init__(self, connection: asyncpg.Connection, stats: StoreStats):
        self._connection = connection
        self._stats = stats

    async def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        self._stats.statements += 1
        return await self._connection.fetch(sql, *args)

    async def fetchrow(self, sql: str, *args: Any) -> asyncpg.Record | None:
        self._stats.statements += 1
        return await self._connection.fetchrow(sql, *args)

    async def execute(self, sql: str, *args: Any) -> str:
        self._stats.statements += 1
        return await self._connection.execute(sql, *args)


class PostgresBase:
    """The pool and the plumbing; `PostgresStore` opens and closes the pool."""

    replica: str
    stats: StoreStats
    on_failure: Callable[[BaseException], None]
    _pool: asyncpg.Pool | None

    @property
    def _connections(self) -> asyncpg.Pool:
        if self._pool is None:
            raise RuntimeError("the store is not open")
        return self._pool

    @contextmanager
    def _failures(self) -> Iterator[None]:
        try:
            yield
        except asyncpg.IntegrityConstraintViolationError:
            raise
        except (asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError, OSError) as exc:
            # OSError covers refused and reset connections and time-outs (TimeoutError is one); an
            # InternalClientError, a connection left mid-operation by a lost server
            self.on_failure(exc)
            if unreachable(exc):
                raise StoreUnreachable(describe(exc)) from None
            raise StorageError(describe(exc)) from None

    async def _read(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        pool = self._connections
        self.stats.statements += 1
        with self._failures():
            return await pool.fetch(sql, *args)

    async def _read_row(self, sql: str, *args: Any) -> asyncpg.Record | None:
        pool = self._connections
        self.stats.statements += 1
        with self._failures():
            return await pool.fetchrow(sql, *args)

    async def _write(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        """One statement, its own transaction: all of it commits or none (one round trip)."""
        pool = self._connections
        self.stats.statements += 1
        self.stats.transactions += 1
        with self._failures():
            return await pool.fetch(sql, *args)

    async def _write_status(self, sql: str, *args: Any) -> int:
        """One statement, its own transaction; the number of rows it changed."""
        pool = self._connections
        self.stats.statements += 1
        self.stats.transactions += 1
        with self._failures():
            status = await pool.execute(sql, *args)
        return int(status.rsplit(" ", 1)[-1])

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[Transaction]:
        """BEGIN ... COMMIT on one connection (READ COMMITTED: a statement sees what committed before it)."""
        pool = self._connections
        self.stats.transactions += 1
        with self._failures():
            async with pool.acquire() as connection:
                self.stats.statements += 1  # BEGIN
                async with connection.transaction():
                    yield Transaction(connection, self.stats)
                    self.stats.statements += 1  # COMMIT
