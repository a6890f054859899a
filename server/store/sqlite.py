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
numbers are MAX(seq) + 1 inside that transaction: strictly increasing within
a conversation, without gaps or duplicates.

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

from ..canonical import thaw
from ..errors import DuplicateIdempotencyKey, StorageError
from ..messages import Message, message_from_json
from .base import (
    ConversationRecord,
    EventRecord,
    MessageRecord,
    StoredDefinition,
    TurnRecord,
)
from .schema import migrate
from .sqlite_audit import AuditTables
from .sqlite_deployments import DeploymentTables

PRAGMAS = (
    "PRAGMA journal_mode = WAL",
    "PRAGMA synchronous = NORMAL",
    "PRAGMA foreign_keys = ON",
    "PRAGMA busy_timeout = 5000",
)
INTERRUPTED = {"code": "interrupted", "message": "the server stopped while this turn was running"}
# what update_turn may change; the JSON ones are encoded on the way in
_TURN_COLUMNS = frozenset(
    {"status", "output", "stop_reason", "usage", "error", "ended_at", "idempotency_key"}
)
_TURN_JSON = frozenset({"usage", "error"})


def _dumps(value: Any) -> str:
    return json.dumps(thaw(value), ensure_ascii=False, separators=(",", ":"))


def _conversation(row: sqlite3.Row) -> ConversationRecord:
    fields = dict(row)
    fields["pinned"] = bool(fields["pinned"])
    fields["metadata"] = json.loads(fields["metadata"])
    return ConversationRecord(**fields)


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


class SQLiteStore(DeploymentTables, AuditTables):
    """`Store` on one SQLite file; the parent directory is created on open."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._connection: sqlite3.Connection | None = None
        self.on_failure: Callable[[BaseException], None] = lambda exc: None

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
        c = conversation
        with self._write() as db:
            db.execute(
                "INSERT INTO conversations (id, agent, agent_name, digest, pinned, title, metadata, status,"
                " created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (c.id, c.agent, c.agent_name, c.digest, int(c.pinned), c.title, _dumps(c.metadata), c.status,
                 c.created_at, c.updated_at),
            )

    async def get_conversation(self, conversation_id: str) -> ConversationRecord | None:
        row = self._db.execute("SELECT * FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        return None if row is None else _conversation(row)

    async def list_conversations(
        self, *, agent: str | None = None, digest: str | None = None, status: str | None = None,
        limit: int = 50, after: str | None = None,
    ) -> list[ConversationRecord]:
        """Newest first by (created_at, id); `after` is the last id of the previous page."""
        where: list[str] = []
        params: list[Any] = []
        for column, value in (("agent_name", agent), ("digest", digest), ("status", status)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if after is not None:
            condition, values = self._position("conversations", "created_at", after, "<")
            where.append(condition)
            params.extend(values)
        sql = "SELECT * FROM conversations"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created_at DESC, id DESC LIMIT ?"
        return [_conversation(row) for row in self._db.execute(sql, (*params, limit))]

    async def delete_conversation(self, conversation_id: str) -> bool:
        """Delete it with its turns, messages and events (ON DELETE CASCADE)."""
        with self._write() as db:
            return db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,)).rowcount > 0

    async def set_conversation_status(self, conversation_id: str, status: str, now: float) -> None:
        with self._write() as db:
            db.execute(
                "UPDATE conversations SET status = ?, updated_at = ? WHERE id = ?",
                (status, now, conversation_id),
            )

    # turns

    async def create_turn(self, turn: TurnRecord) -> None:
        """Insert a turn; raise `DuplicateIdempotencyKey` if its key is taken in the conversation."""
        t = turn
        with self._write() as db:
            if t.idempotency_key is not None and db.execute(
                "SELECT 1 FROM turns WHERE conversation_id = ? AND idempotency_key = ?",
                (t.conversation_id, t.idempotency_key),
            ).fetchone():
                raise DuplicateIdempotencyKey(t.idempotency_key)
            db.execute(
                "INSERT INTO turns (id, conversation_id, agent, digest, status, input, output, stop_reason,"
                " usage, error, idempotency_key, request_digest, started_at, ended_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (t.id, t.conversation_id, t.agent, t.digest, t.status, t.input, t.output, t.stop_reason,
                 _dumps(t.usage), None if t.error is None else _dumps(t.error), t.idempotency_key,
                 t.request_digest, t.started_at, t.ended_at),
            )

    async def update_turn(self, turn_id: str, **changes: Any) -> None:
        """Set only the given columns, each one of `_TURN_COLUMNS`."""
        unknown = changes.keys() - _TURN_COLUMNS
        if unknown:
            raise ValueError(f"update_turn cannot change {', '.join(sorted(unknown))}")
        if not changes:
            return
        values = [
            _dumps(value) if column in _TURN_JSON and value is not None else value
            for column, value in changes.items()
        ]
        assignments = ", ".join(f"{column} = ?" for column in changes)  # names come from the whitelist
        with self._write() as db:
            db.execute(f"UPDATE turns SET {assignments} WHERE id = ?", (*values, turn_id))

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

    async def recover_interrupted(self, now: float) -> list[TurnRecord]:
        """At start-up: unfinished turns become failed/interrupted and no conversation stays busy.

        Every conversation not idle is set idle, not only those of the recovered
        turns: nothing can be running before the server starts, and a crash
        between marking a conversation busy and creating its turn would
        otherwise leave it busy for ever.
        """
        with self._write() as db:
            rows = db.execute(
                "UPDATE turns SET status = 'failed', error = ?, ended_at = ?"
                " WHERE status IN ('running', 'waiting') RETURNING *",
                (_dumps(INTERRUPTED), now),
            ).fetchall()
            db.execute(
                "UPDATE conversations SET status = 'idle', updated_at = ? WHERE status != 'idle'", (now,)
            )
        return sorted((_turn(row) for row in rows), key=lambda t: (t.started_at, t.id))

    # transcript and events

    @staticmethod
    def _next_seq(db: sqlite3.Connection, table: str, conversation_id: str) -> int:
        (last,) = db.execute(
            f"SELECT COALESCE(MAX(seq), 0) FROM {table} WHERE conversation_id = ?", (conversation_id,)
        ).fetchone()
        return last + 1

    async def append_messages(self, conversation_id: str, turn_id: str, messages: list[Message],
                              now: float) -> None:
        """Append to the transcript and touch the conversation's `updated_at`."""
        if not messages:
            return
        with self._write() as db:
            first = self._next_seq(db, "messages", conversation_id)
            rows = [
                (conversation_id, seq, turn_id, _dumps(m.to_json()), now)
                for seq, m in enumerate(messages, start=first)
            ]
            db.executemany(
                "INSERT INTO messages (conversation_id, seq, turn_id, body, created_at)"
                " VALUES (?, ?, ?, ?, ?)",
                rows,
            )
            db.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (now, conversation_id))

    async def list_messages(self, conversation_id: str, *, limit: int = 1000,
                            after: int = 0) -> list[MessageRecord]:
        rows = self._db.execute(
            "SELECT seq, turn_id, body, created_at FROM messages WHERE conversation_id = ? AND seq > ?"
            " ORDER BY seq LIMIT ?",
            (conversation_id, after, limit),
        )
        return [
            MessageRecord(seq=seq, conversation_id=conversation_id, turn_id=turn_id,
                          message=message_from_json(json.loads(body)), created_at=created_at)
            for seq, turn_id, body, created_at in rows
        ]

    async def append_event(self, conversation_id: str, name: str, data: dict[str, Any], now: float) -> int:
        with self._write() as db:
            seq = self._next_seq(db, "events", conversation_id)
            db.execute(
                "INSERT INTO events (conversation_id, seq, name, data, created_at) VALUES (?, ?, ?, ?, ?)",
                (conversation_id, seq, name, _dumps(data), now),
            )
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
                [(d.digest, d.kind, d.name, _dumps(d.spec), d.first_seen) for d in definitions],
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
