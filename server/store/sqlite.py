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
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import StorageError
from ..messages import Message
from .base import (
    UNSET,
    ConversationRecord,
    EventRecord,
    StoredDefinition,
    TurnRecord,
)
from .schema import migrate
from .sqlite_audit import AuditTables
from .sqlite_context import ContextTables
from .sqlite_coordination import CoordinationTables, check_fence, release_turn
from .sqlite_deployments import DeploymentTables
from .sqlite_evals import EvalTables
from .sqlite_transcripts import TranscriptTables
from .sqlite_writes import (
    check_turn_changes,
    dumps,
    insert_conversation,
    insert_events,
    insert_messages,
    insert_turn,
    set_status,
    update_turn,
)
from .stats import StoreStats

PRAGMAS = (
    "PRAGMA journal_mode = WAL",
    "PRAGMA synchronous = NORMAL",
    "PRAGMA foreign_keys = ON",
    "PRAGMA busy_timeout = 5000",
)
# coordination's and the shared transcript's columns, not the record's
_HOLDER_COLUMNS = ("holder_turn", "holder_replica", "lease_until", "fence", "shares_from", "shared_upto")


def _conversation(row: sqlite3.Row) -> ConversationRecord:
    fields = dict(row)
    for column in _HOLDER_COLUMNS:
        fields.pop(column, None)
    fields["pinned"] = bool(fields["pinned"])
    fields["metadata"] = json.loads(fields["metadata"])
    fields["archived"] = bool(fields["archived"])
    fields["forked_from"] = _forked_from(fields.pop("forked_from_conversation"),
                                         fields.pop("forked_from_turn"))
    return ConversationRecord(**fields)


def _forked_from(conversation_id: str | None, turn_id: str | None) -> dict[str, Any] | None:
    return None if conversation_id is None else {"conversation_id": conversation_id, "turn_id": turn_id}


def _turn(row: sqlite3.Row) -> TurnRecord:
    fields = dict(row)
    fields["usage"] = json.loads(fields["usage"])
    if fields["error"] is not None:
        fields["error"] = json.loads(fields["error"])
    return TurnRecord(**fields)


def _definition(row: sqlite3.Row) -> StoredDefinition:
    fields = dict(row)
    fields["spec"] = json.loads(fields["spec"])
    return StoredDefinition(**fields)


class SQLiteStore(TranscriptTables, DeploymentTables, AuditTables, CoordinationTables, ContextTables,
                  EvalTables):
    """`Store` on one SQLite file; the parent directory is created on open."""

    embedded = True

    def __init__(self, path: str | Path, *, replica: str = "local") -> None:
        self.path = Path(path)
        self.replica = replica
        self._connection: sqlite3.Connection | None = None
        self.on_failure: Callable[[BaseException], None] = lambda exc: None
        self.stats = StoreStats()

    def _count(self, statement: str) -> None:
        self.stats.statements += 1
        if statement.startswith("BEGIN"):
            self.stats.transactions += 1

    async def open(self) -> None:
        if self._connection is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None)
        try:
            db.row_factory = sqlite3.Row
            for pragma in PRAGMAS:
                db.execute(pragma)
            migrate(db)
            db.set_trace_callback(self._count)
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
            db.execute("INSERT INTO probes (id, at) VALUES (1, ?)"
                       " ON CONFLICT (id) DO UPDATE SET at = excluded.at", (time.time(),))

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

    def _position(self, table: str, time_column: str, row_id: str, op: str) -> tuple[str, list[Any]]:
        """The keyset condition for rows after `row_id` in (time, id) order."""
        row = self._db.execute(f"SELECT {time_column} FROM {table} WHERE id = ?", (row_id,)).fetchone()
        if row is None:
            # deleted while the caller paged: our ids sort by creation time, so the id alone still places it
            return f"id {op} ?", [row_id]
        return f"({time_column}, id) {op} (?, ?)", [row[0], row_id]

    # conversations

    async def create_conversation(self, conversation: ConversationRecord) -> None:
        with self._write() as db:
            insert_conversation(db, conversation)

    async def get_conversation(self, conversation_id: str) -> ConversationRecord | None:
        row = self._db.execute("SELECT * FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        return None if row is None else _conversation(row)

    async def list_conversations(
        self, *, agent: str | None = None, digest: str | None = None, status: str | None = None,
        limit: int = 50, after: str | None = None, archived: bool = False,
    ) -> list[ConversationRecord]:
        """Newest first by (created_at, id); `after` is the last id of the previous page."""
        where: list[str] = ["archived = ?"]
        params: list[Any] = [int(archived)]
        for column, value in (("agent_name", agent), ("digest", digest), ("status", status)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if after is not None:
            condition, values = self._position("conversations", "created_at", after, "<")
            where.append(condition)
            params.extend(values)
        sql = "SELECT * FROM conversations WHERE " + " AND ".join(where)
        sql += " ORDER BY created_at DESC, id DESC LIMIT ?"
        return [_conversation(row) for row in self._db.execute(sql, (*params, limit))]

    async def update_conversation(self, conversation_id: str, *, title: Any = UNSET, metadata: Any = UNSET,
                                  archived: Any = UNSET, now: float) -> bool:
        """Set the fields given (and `updated_at`); whether the conversation exists."""
        changes = {column: value for column, value in (
            ("title", title), ("metadata", metadata if metadata is UNSET else dumps(metadata)),
            ("archived", archived if archived is UNSET else int(archived))) if value is not UNSET}
        if not changes:
            return self._db.execute("SELECT 1 FROM conversations WHERE id = ?",
                                    (conversation_id,)).fetchone() is not None
        assignments = ", ".join(f"{column} = ?" for column in changes)  # names from the tuple above
        with self._write() as db:
            return db.execute(f"UPDATE conversations SET {assignments}, updated_at = ? WHERE id = ?",
                              (*changes.values(), now, conversation_id)).rowcount > 0

    async def set_conversation_status(self, conversation_id: str, status: str, now: float) -> None:
        with self._write() as db:
            set_status(db, conversation_id, status, now)

    # turns

    async def create_turn(self, turn: TurnRecord) -> None:
        """Insert a turn; raise `DuplicateIdempotencyKey` if its key is taken in the conversation."""
        with self._write() as db:
            insert_turn(db, turn)

    async def update_turn(self, turn_id: str, *, fence: int | None = None, **changes: Any) -> None:
        """Set only the given columns, each one of `TURN_COLUMNS`."""
        check_turn_changes(changes)
        if not changes:
            return
        with self._write() as db:
            if fence is not None:
                row = db.execute("SELECT conversation_id FROM turns WHERE id = ?", (turn_id,)).fetchone()
                check_fence(db, row[0] if row else "", turn_id, fence, self.replica)
            update_turn(db, turn_id, changes)

    async def get_turn(self, turn_id: str) -> TurnRecord | None:
        row = self._db.execute("SELECT * FROM turns WHERE id = ?", (turn_id,)).fetchone()
        return None if row is None else _turn(row)

    async def list_turns(self, conversation_id: str, *, limit: int = 50,
                         after: str | None = None) -> list[TurnRecord]:
        """Oldest first by (started_at, id); `after` is the last turn id of the previous page."""
        sql = "SELECT * FROM turns WHERE conversation_id = ?"
        params: list[Any] = [conversation_id]
        if after is not None:
            condition, values = self._position("turns", "started_at", after, ">")
            sql += f" AND {condition}"
            params.extend(values)
        sql += " ORDER BY started_at, id LIMIT ?"
        return [_turn(row) for row in self._db.execute(sql, (*params, limit))]

    async def find_turn_by_key(self, conversation_id: str, key: str, since: float) -> TurnRecord | None:
        row = self._db.execute(
            "SELECT * FROM turns WHERE conversation_id = ? AND idempotency_key = ? AND started_at >= ?",
            (conversation_id, key, since),
        ).fetchone()
        return None if row is None else _turn(row)

    async def running_turns(self) -> list[TurnRecord]:
        rows = self._db.execute("SELECT * FROM turns WHERE status IN ('running', 'waiting')"
                                " ORDER BY started_at, id")
        return [_turn(row) for row in rows]

    # transcript and events

    async def append_messages(self, conversation_id: str, turn_id: str, messages: list[Message],
                              now: float) -> None:
        """Append to the transcript and touch the conversation's `updated_at`."""
        if not messages:
            return
        with self._write() as db:
            insert_messages(db, conversation_id, turn_id, messages, now)

    async def append_event(self, conversation_id: str, name: str, data: dict[str, Any], now: float) -> int:
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
                db.execute("UPDATE turns SET usage = ? WHERE id = ?", (dumps(usage), turn_id))
            if messages:
                insert_messages(db, conversation_id, turn_id, messages, now)
            return insert_events(db, conversation_id, events, now) if events else []

    async def end_turn(self, turn_id: str, conversation_id: str, changes: dict[str, Any],
                       event: tuple[str, dict[str, Any]], now: float, *, fence: int | None = None) -> int:
        check_turn_changes(changes)
        with self._write() as db:
            if fence is not None:
                check_fence(db, conversation_id, turn_id, fence, self.replica)
            if changes:
                update_turn(db, turn_id, changes)
            seq = insert_events(db, conversation_id, [event], now)[0]
            set_status(db, conversation_id, "idle", now)
            release_turn(db, conversation_id, turn_id)
            return seq

    async def list_events(self, conversation_id: str, *, after: int = 0,
                          limit: int = 1000) -> list[EventRecord]:
        rows = self._db.execute(
            "SELECT seq, name, data, created_at FROM events WHERE conversation_id = ? AND seq > ?"
            " ORDER BY seq LIMIT ?",
            (conversation_id, after, limit),
        )
        return [
            EventRecord(seq=seq, conversation_id=conversation_id, name=name, data=json.loads(data),
                        created_at=created_at)
            for seq, name, data, created_at in rows
        ]

    # definitions ever served

    async def save_definitions(self, definitions: list[StoredDefinition]) -> None:
        """Store each definition once: a digest already known is left as it was."""
        with self._write() as db:
            db.executemany(
                "INSERT OR IGNORE INTO definitions (digest, kind, name, spec, first_seen)"
                " VALUES (?, ?, ?, ?, ?)",
                [(d.digest, d.kind, d.name, dumps(d.spec), d.first_seen) for d in definitions],
            )

    async def get_definition(self, digest: str) -> StoredDefinition | None:
        row = self._db.execute("SELECT * FROM definitions WHERE digest = ?", (digest,)).fetchone()
        return None if row is None else _definition(row)

    async def find_definitions(self, kind: str, name: str) -> list[StoredDefinition]:
        """Every version of one definition ever served, oldest first."""
        rows = self._db.execute(
            "SELECT * FROM definitions WHERE kind = ? AND name = ? ORDER BY first_seen, digest", (kind, name)
        )
        return [_definition(row) for row in rows]
