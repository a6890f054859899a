"""The SQLite store: the default, one file under the state directory.

Statements run synchronously inside the async methods, on the event loop
thread, on purpose: a small write takes 0.18 ms there and 1.1 ms through a
worker thread (`python -m bench store`), so a hop would cost six times the
statement. Since nothing awaits between BEGIN and COMMIT, each method is
also atomic with respect to the other tasks of the process. The price, also
measured: reading a page of 1,000 transcript messages of 2 kB holds the loop
about 24 ms, mostly decoding JSON into messages, which a thread would not
release either (the GIL); turns read only what was appended since their
last turn (the transcript cache), so only a client paging the transcript
pays it. A write that waits on another process's lock blocks the loop for up
to `busy_timeout` (5 s); one server per file is the intended use.

One connection in autocommit mode (`isolation_level=None`). Every method that
writes wraps its statements in BEGIN IMMEDIATE ... COMMIT: all or nothing, and
the write lock is taken up front, so a read never has to be upgraded. Sequence
numbers are MAX(seq) + 1 inside that transaction (a fork's messages: after those
it shares, see `forks`): strictly increasing within a conversation, without
gaps or duplicates.

Durability: WAL with synchronous=NORMAL keeps every committed transaction
across a crash of the process; a power cut may lose the last few before a
checkpoint.

A write that SQLite cannot commit (disk full, I/O error, read-only, locked)
raises `StorageError` after telling `on_failure`; a constraint violation is a
bug of the caller, not of the store, and stays an `IntegrityError`.

Split by port like the PostgreSQL store: the connection and its transactions
here; conversations and transcripts in `conversations`; turns, events and a
turn's batched writes in `journal`; holders, queues, leases and replicas in
`coordination`; definitions, files, swaps and aliases in `definitions`;
permission requests in `audit`; views and steers in `context`; the writes
several of them share in `writes`; the schema in `migrations`. The
statements it shares with PostgreSQL are `statements`, its rows are read by
`rows`.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ...errors import StorageError
from ..statements import SQLITE as SQL
from ..stats import StoreStats
from .audit import AuditTables
from .context import ContextTables
from .conversations import ConversationTables
from .coordination import CoordinationTables
from .definitions import DefinitionTables
from .evals import EvalTables
from .journal import JournalTables
from .migrations import migrate

PRAGMAS = (
    "PRAGMA journal_mode = WAL",
    "PRAGMA synchronous = NORMAL",
    "PRAGMA foreign_keys = ON",
    "PRAGMA busy_timeout = 5000",
)


class _Counted(sqlite3.Connection):
    """A connection that counts what it is sent (`StoreStats`, for the benchmarks). Not a trace
    callback: SQLite would expand every statement with its values into a new string for it, 1.3 µs a
    statement, about 40 a turn."""

    stats: StoreStats | None = None

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        if self.stats is not None:
            self.stats.statements += 1
            if sql.startswith("BEGIN"):
                self.stats.transactions += 1
        return super().execute(sql, parameters)

    def executemany(self, sql: str, parameters: Any, /) -> sqlite3.Cursor:
        rows = parameters if isinstance(parameters, list) else list(parameters)
        if self.stats is not None:
            self.stats.statements += len(rows)  # as SQLite runs it: once a row
        return super().executemany(sql, rows)


class SQLiteStore(ConversationTables, JournalTables, CoordinationTables, DefinitionTables, AuditTables,
                  ContextTables, EvalTables):
    """`Store` on one SQLite file; the parent directory is created on open."""

    embedded = True

    def __init__(self, path: str | Path, *, replica: str = "local") -> None:
        self.path = Path(path)
        self.replica = replica
        self._connection: sqlite3.Connection | None = None
        self.on_failure: Callable[[BaseException], None] = lambda exc: None
        self.stats = StoreStats()

    async def open(self) -> None:
        if self._connection is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None, factory=_Counted)
        try:
            db.row_factory = sqlite3.Row
            for pragma in PRAGMAS:
                db.execute(pragma)
            migrate(db)
            db.stats = self.stats
        except BaseException:
            db.close()
            raise
        self._connection = db

    async def close(self) -> None:
        if self._connection is None:
            return
        db, self._connection = self._connection, None
        with contextlib.suppress(sqlite3.Error):  # a store that cannot be written still closes
            db.execute("PRAGMA optimize")  # cheap; keeps the planner's statistics fresh for the next start
        db.close()

    async def probe(self) -> None:
        with self._write() as db:
            db.execute(SQL.probe, (time.time(),))

    @property
    def _db(self) -> sqlite3.Connection:
        if self._connection is None:
            raise RuntimeError("the store is not open")
        return self._connection

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        db = self._db
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):  # a failed rollback leaves the first error
                        db.execute("ROLLBACK")
                raise
        except sqlite3.IntegrityError:
            raise
        except sqlite3.Error as exc:
            self.on_failure(exc)
            # sqlite's own words ("database or disk is full"), which hold no path or value
            raise StorageError(f"the store could not commit: {exc}") from None
