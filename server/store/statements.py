"""The statements both stores send as they are: written once, in PostgreSQL's `$n` style.

SQLite reads the same text with its numbered parameters (`$3` becomes `?3`,
which binds the third value of the same tuple, as often as it appears), so a
statement here is written once and translated once, at import (`SQLITE`),
or once per shape for the few built from the columns a call sets.

Only what is the same in both dialects is here: plain reads, single-row
writes, upserts both spell alike. Each store keeps its own, on purpose, of
what differs for a reason: PostgreSQL's writes fold their notices into one
statement (`pg_notify` in a CTE, sent if and only if the write commits), take
row locks and fencing guards in the same statement, number rows from
counters on the conversation's row and batch through arrays (`unnest`): one
round trip per write, where several replicas meet. SQLite runs in-process
(a statement costs microseconds, and no other process writes), so it checks,
numbers and writes in a few plain statements inside one transaction.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache

from .rows import (
    CONVERSATION_COLUMNS,
    DEFINITION_COLUMNS,
    HOLDER_COLUMNS,
    MESSAGE_COLUMNS,
    PERMISSION_COLUMNS,
    TURN_COLUMNS,
    VIEW_COLUMNS,
)

_PARAMETER = re.compile(r"\$(\d+)")


def numbered(sql: str) -> str:
    """PostgreSQL's `$n` as SQLite's `?n` (the statements here quote no `$`)."""
    return _PARAMETER.sub(r"?\1", sql)


def _marks(first: int, count: int) -> str:
    return ", ".join(f"${n}" for n in range(first, first + count))


class Statements:
    """Every shared statement, in PostgreSQL's style; `SQLITE` has them in SQLite's."""

    style: Callable[[str], str] = staticmethod(str)  # what the statements built below go through

    probe = "INSERT INTO probes (id, at) VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET at = excluded.at"
    # conversations and transcripts
    insert_conversation = (  # the record's columns, then where its transcript is shared from
        f"INSERT INTO conversations ({CONVERSATION_COLUMNS}, shares_from, shared_upto)"
        f" VALUES ({_marks(1, 15)})")
    get_conversation = f"SELECT {CONVERSATION_COLUMNS} FROM conversations WHERE id = $1"
    conversation_exists = "SELECT 1 FROM conversations WHERE id = $1"
    conversation_created = "SELECT created_at FROM conversations WHERE id = $1"
    delete_conversation = "DELETE FROM conversations WHERE id = $1"
    turn_messages = (
        f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE conversation_id = $1"
        " AND turn_id = $2 ORDER BY seq")
    fork_cut = "SELECT started_at FROM turns WHERE id = $1 AND conversation_id = $2"
    # a deleted conversation's rows that forks share go to its heir: $1 heir, $2 deleted, $3 upto
    hand_rows = "UPDATE messages SET conversation_id = $1 WHERE conversation_id = $2 AND seq <= $3"
    heir_place = "UPDATE conversations SET shares_from = $2, shared_upto = $3 WHERE id = $1"
    heir_forks = "UPDATE conversations SET shares_from = $1 WHERE shares_from = $2"
    # turns and events
    insert_turn = f"INSERT INTO turns ({TURN_COLUMNS}) VALUES ({_marks(1, 15)})"
    get_turn = f"SELECT {TURN_COLUMNS} FROM turns WHERE id = $1"
    turn_started = "SELECT started_at FROM turns WHERE id = $1"
    find_turn_by_key = (
        f"SELECT {TURN_COLUMNS} FROM turns WHERE conversation_id = $1"
        " AND idempotency_key = $2 AND started_at >= $3")
    running_turns = (
        f"SELECT {TURN_COLUMNS} FROM turns WHERE status IN ('running', 'waiting')"
        " ORDER BY started_at, id")
    list_events = (
        "SELECT seq, name, data, created_at FROM events WHERE conversation_id = $1"
        " AND seq > $2 ORDER BY seq LIMIT $3")
    # definitions, files, swaps, aliases
    get_definition = f"SELECT {DEFINITION_COLUMNS} FROM definitions WHERE digest = $1"
    find_definitions = (
        f"SELECT {DEFINITION_COLUMNS} FROM definitions WHERE kind = $1"
        " AND name = $2 ORDER BY first_seen, digest")
    get_file = "SELECT digest, data, mode FROM files WHERE digest = $1"
    list_swaps = "SELECT id, report FROM swaps ORDER BY id DESC LIMIT $1"
    list_swaps_after = "SELECT id, report FROM swaps WHERE id < $1 ORDER BY id DESC LIMIT $2"
    get_swap = "SELECT report FROM swaps WHERE id = $1"
    set_alias = (
        "INSERT INTO aliases (agent, alias, digest, updated_at) VALUES ($1, $2, $3, $4)"
        " ON CONFLICT (agent, alias) DO UPDATE SET digest = excluded.digest,"
        " updated_at = excluded.updated_at")
    get_alias = "SELECT digest FROM aliases WHERE agent = $1 AND alias = $2"
    list_aliases = "SELECT alias, digest, updated_at FROM aliases WHERE agent = $1 ORDER BY alias"
    delete_alias = "DELETE FROM aliases WHERE agent = $1 AND alias = $2"
    # permission requests
    create_permission = (
        "INSERT INTO permissions (id, conversation_id, turn_id, tool_call_id, tool, arguments, reason,"
        f" status, requested_at, expires_at) VALUES ({_marks(1, 10)})")
    decide_permission = (
        "UPDATE permissions SET status = $2, decided_by = $3, decided_at = $4"
        " WHERE id = $1 AND status = 'pending'")
    get_permission = f"SELECT {PERMISSION_COLUMNS} FROM permissions WHERE id = $1"
    list_permissions = (
        f"SELECT {PERMISSION_COLUMNS} FROM permissions WHERE conversation_id = $1"
        " ORDER BY requested_at, id")
    # holders and replicas
    holder = f"SELECT {HOLDER_COLUMNS} FROM conversations WHERE id = $1"
    heartbeat = (
        "INSERT INTO replicas (id, started_at, heartbeat_at, set_digest, running_turns)"
        " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO UPDATE SET started_at = excluded.started_at,"
        " heartbeat_at = excluded.heartbeat_at, set_digest = excluded.set_digest,"
        " running_turns = excluded.running_turns")
    # running_turns: the turns each holds now (not its last heartbeat's count, which a dead
    # replica's row keeps after its turns were taken over)
    list_replicas = (
        "SELECT r.id, r.started_at, r.heartbeat_at, r.set_digest,"
        " CAST((SELECT count(*) FROM conversations c WHERE c.holder_replica = r.id"
        " AND c.holder_turn LIKE 'turn\\_%' ESCAPE '\\') AS INTEGER)"
        " AS running_turns FROM replicas r WHERE r.heartbeat_at >= $1 ORDER BY r.id")
    remove_replica = "DELETE FROM replicas WHERE id = $1"
    # context views and steered messages
    save_view = f"INSERT INTO context_views ({VIEW_COLUMNS}) VALUES ({_marks(1, 8)})"
    get_view = (
        f"SELECT {VIEW_COLUMNS} FROM context_views WHERE conversation_id = $1"
        " ORDER BY number DESC LIMIT 1")
    expire_steer_key = "DELETE FROM steer_keys WHERE conversation_id = $1 AND key = $2 AND created_at < $3"
    record_steer_key = (
        "INSERT INTO steer_keys (conversation_id, key, request_digest, turn_id,"
        " created_at) VALUES ($1, $2, $3, $4, $5)"
        " ON CONFLICT DO NOTHING RETURNING key")
    add_steer = (
        "INSERT INTO steers (conversation_id, turn_id, content, created_at)"
        " VALUES ($1, $2, $3, $4) RETURNING id")
    key_steer = "UPDATE steer_keys SET steer_id = $3 WHERE conversation_id = $1 AND key = $2"
    steer_key = (
        "SELECT turn_id, request_digest FROM steer_keys WHERE conversation_id = $1"
        " AND key = $2 AND created_at >= $3")
    steers_pending = "SELECT 1 FROM steers WHERE conversation_id = $1 AND turn_id = $2 LIMIT 1"
    take_steers = "DELETE FROM steers WHERE conversation_id = $1 AND turn_id = $2 RETURNING id, content"

    # built from the columns or filters a call names (names from the stores' whitelists, never a value)

    def update_conversation(self, columns: tuple[str, ...]) -> str:
        """$1 the id, $2 now, then a value for each column."""
        assignments = ", ".join(f"{column} = ${n}" for n, column in enumerate(columns, start=3))
        return self.style(f"UPDATE conversations SET {assignments}, updated_at = $2 WHERE id = $1")

    def update_turn(self, columns: tuple[str, ...]) -> str:
        """$1 the turn, then a value for each column."""
        assignments = ", ".join(f"{column} = ${n}" for n, column in enumerate(columns, start=2))
        return self.style(f"UPDATE turns SET {assignments} WHERE id = $1")

    def list_conversations(self, filters: tuple[str, ...], keyset: str | None) -> str:
        """Newest first: $1 archived, a value for each filter column, then with `keyset` "id" the id
        after which, with "time" that id and then its `created_at`; last, the limit."""
        where = ["archived = $1", *(f"{column} = ${n}" for n, column in enumerate(filters, start=2))]
        n = len(where) + 1
        if keyset == "id":  # deleted while the caller paged: our ids sort by creation time
            where.append(f"id < ${n}")
        elif keyset == "time":
            where.append(f"(created_at, id) < (${n + 1}, ${n})")
        n += {None: 0, "id": 1, "time": 2}[keyset]
        return self.style(f"SELECT {CONVERSATION_COLUMNS} FROM conversations WHERE {' AND '.join(where)}"
                          f" ORDER BY created_at DESC, id DESC LIMIT ${n}")

    def list_turns(self, keyset: str | None) -> str:
        """Oldest first: $1 the conversation, then as `list_conversations` (an id, then its
        `started_at`), then the limit."""
        after = {None: "", "id": " AND id > $2", "time": " AND (started_at, id) > ($3, $2)"}[keyset]
        last = {None: 2, "id": 3, "time": 4}[keyset]
        return self.style(f"SELECT {TURN_COLUMNS} FROM turns WHERE conversation_id = $1{after}"
                          f" ORDER BY started_at, id LIMIT ${last}")


def _numbered() -> Statements:
    """`Statements` in SQLite's style: each translated here, once, at import."""
    translated: dict[str, object] = {name: numbered(sql) for name, sql in vars(Statements).items()
                                     if isinstance(sql, str) and not name.startswith("_")}
    translated["style"] = staticmethod(lru_cache(maxsize=256)(numbered))  # a built one: once per shape
    return type("SQLiteStatements", (Statements,), translated)()


POSTGRES = Statements()
SQLITE = _numbered()
