"""The SQLite schema, as an append-only list of migrations.

`MIGRATIONS[n]` takes a database from version n to n + 1; `schema_version`
records the versions applied. A later change adds an entry (new tables,
columns with defaults, indexes) and never edits an old one, so a database
created by any earlier release upgrades in place on open.
"""

from __future__ import annotations

import sqlite3

from ..forks import SHARE_COPIES

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 1: conversations, turns, transcript, events, definitions ever served
    (
        """CREATE TABLE conversations (
            id TEXT PRIMARY KEY,
            agent TEXT NOT NULL,
            agent_name TEXT NOT NULL,
            digest TEXT NOT NULL,
            pinned INTEGER NOT NULL,
            title TEXT,
            metadata TEXT NOT NULL,
            status TEXT NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        )""",
        "CREATE INDEX conversations_by_time ON conversations (created_at, id)",
        """CREATE TABLE turns (
            id TEXT PRIMARY KEY,
            conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            agent TEXT NOT NULL,
            digest TEXT NOT NULL,
            status TEXT NOT NULL,
            input TEXT NOT NULL,
            output TEXT,
            stop_reason TEXT,
            usage TEXT NOT NULL,
            error TEXT,
            idempotency_key TEXT,
            started_at REAL NOT NULL,
            ended_at REAL,
            UNIQUE (conversation_id, idempotency_key)
        )""",
        "CREATE INDEX turns_by_time ON turns (conversation_id, started_at, id)",
        # only the few unfinished turns are indexed: what recovery scans at start-up
        "CREATE INDEX turns_unfinished ON turns (status) WHERE status IN ('running', 'waiting')",
        """CREATE TABLE messages (
            conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            seq INTEGER NOT NULL,
            turn_id TEXT NOT NULL,
            body TEXT NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (conversation_id, seq)
        )""",
        """CREATE TABLE events (
            conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            seq INTEGER NOT NULL,
            name TEXT NOT NULL,
            data TEXT NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (conversation_id, seq)
        )""",
        """CREATE TABLE definitions (
            digest TEXT PRIMARY KEY,
            kind TEXT NOT NULL,
            name TEXT NOT NULL,
            spec TEXT NOT NULL,
            first_seen REAL NOT NULL
        )""",
        "CREATE INDEX definitions_by_name ON definitions (kind, name)",
    ),
    # 2: the history of definition swaps, and movable agent aliases
    (
        """CREATE TABLE swaps (
            id TEXT PRIMARY KEY,
            at REAL NOT NULL,
            status TEXT NOT NULL,
            report TEXT NOT NULL
        )""",
        """CREATE TABLE aliases (
            agent TEXT NOT NULL,
            alias TEXT NOT NULL,
            digest TEXT NOT NULL,
            updated_at REAL NOT NULL,
            PRIMARY KEY (agent, alias)
        )""",
    ),
    # 3: permission requests and their decisions (the audit trail of `ask` tools)
    (
        """CREATE TABLE permissions (
            id TEXT PRIMARY KEY,
            conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            turn_id TEXT NOT NULL,
            tool_call_id TEXT NOT NULL,
            tool TEXT NOT NULL,
            arguments TEXT NOT NULL,
            reason TEXT,
            status TEXT NOT NULL,
            requested_at REAL NOT NULL,
            expires_at REAL NOT NULL,
            decided_by TEXT,
            decided_at REAL
        )""",
        "CREATE INDEX permissions_by_conversation ON permissions (conversation_id, requested_at)",
    ),
    # 4: what an idempotent request asked for, so a key reused with another body is refused;
    # one row the health probe writes
    (
        "ALTER TABLE turns ADD COLUMN request_digest TEXT",
        "CREATE TABLE probes (id INTEGER PRIMARY KEY CHECK (id = 1), at REAL NOT NULL)",
    ),
    # 5: who runs a conversation's turn (the holder, under a lease with a fencing token) and the
    # queue of turns waiting for it; the replicas; the files definitions point to
    (
        "ALTER TABLE conversations ADD COLUMN holder_turn TEXT",
        "ALTER TABLE conversations ADD COLUMN holder_replica TEXT",
        "ALTER TABLE conversations ADD COLUMN lease_until REAL",
        "ALTER TABLE conversations ADD COLUMN fence INTEGER NOT NULL DEFAULT 0",
        "CREATE INDEX conversations_held ON conversations (holder_replica) WHERE holder_turn IS NOT NULL",
        """CREATE TABLE admissions (
            position INTEGER PRIMARY KEY AUTOINCREMENT,
            conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            turn_id TEXT NOT NULL UNIQUE,
            replica TEXT NOT NULL,
            superseded INTEGER NOT NULL DEFAULT 0,
            idempotency_key TEXT,
            request_digest TEXT,
            lease_until REAL NOT NULL,
            UNIQUE (conversation_id, idempotency_key)
        )""",
        "CREATE INDEX admissions_by_conversation ON admissions (conversation_id, position)",
        """CREATE TABLE replicas (
            id TEXT PRIMARY KEY,
            started_at REAL NOT NULL,
            heartbeat_at REAL NOT NULL,
            set_digest TEXT NOT NULL,
            running_turns INTEGER NOT NULL
        )""",
        """CREATE TABLE files (
            digest TEXT PRIMARY KEY,
            data BLOB NOT NULL,
            mode INTEGER NOT NULL
        )""",
    ),
    # 6: durable turns: how many times a turn has run (a turn taken over after a crash runs again)
    (
        "ALTER TABLE turns ADD COLUMN attempts INTEGER NOT NULL DEFAULT 1",
    ),
    # 7: conversation controls: archived conversations, and where a fork came from (no foreign key:
    # a fork outlives its source)
    (
        "ALTER TABLE conversations ADD COLUMN archived INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE conversations ADD COLUMN forked_from_conversation TEXT",
        "ALTER TABLE conversations ADD COLUMN forked_from_turn TEXT",
    ),
    # 8: context management: each compaction's view of a conversation, and messages steered into a
    # running turn that it has not picked up yet
    (
        """CREATE TABLE context_views (
            conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            number INTEGER NOT NULL,
            upto_seq INTEGER NOT NULL,
            cut_seq INTEGER NOT NULL,
            summary TEXT,
            tokens INTEGER NOT NULL,
            strategy TEXT NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (conversation_id, number)
        )""",
        """CREATE TABLE steers (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            turn_id TEXT NOT NULL,
            content TEXT NOT NULL,
            created_at REAL NOT NULL
        )""",
        "CREATE INDEX steers_by_turn ON steers (conversation_id, turn_id, id)",
    ),
    # 9: the Idempotency-Key a steered message was sent with: a retry answers the same turn and adds
    # nothing (`steer_id`: the pending message, until a turn picks it up)
    (
        """CREATE TABLE steer_keys (
            conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            key TEXT NOT NULL,
            request_digest TEXT,
            turn_id TEXT NOT NULL,
            steer_id INTEGER,
            created_at REAL NOT NULL,
            PRIMARY KEY (conversation_id, key)
        )""",
    ),
    # 10: forks share their source's messages instead of copying them (see `forks`), and a turn's
    # messages are found by its id; then the copies earlier forks made become shared
    (
        "ALTER TABLE conversations ADD COLUMN shares_from TEXT",
        "ALTER TABLE conversations ADD COLUMN shared_upto INTEGER NOT NULL DEFAULT 0",
        "CREATE INDEX conversations_by_sharing ON conversations (shares_from) WHERE shares_from IS NOT NULL",
        "CREATE INDEX messages_by_turn ON messages (conversation_id, turn_id, seq)",
        *SHARE_COPIES,
    ),
    # 11: eval runs (§12); the rules an alias follows (require_evals, a canary) and the side each
    # conversation created on an alias with a canary drew
    (
        """CREATE TABLE eval_runs (
            id TEXT PRIMARY KEY,
            eval TEXT NOT NULL,
            eval_digest TEXT NOT NULL,
            agent_digest TEXT NOT NULL,
            status TEXT NOT NULL,
            started_at REAL NOT NULL,
            body TEXT NOT NULL
        )""",
        "CREATE INDEX eval_runs_by_eval ON eval_runs (eval, started_at)",
        "CREATE INDEX eval_runs_by_digests ON eval_runs (agent_digest, eval_digest, status)",
        """CREATE TABLE alias_rules (
            agent TEXT NOT NULL,
            alias TEXT NOT NULL,
            require_evals INTEGER NOT NULL,
            canary_digest TEXT,
            canary_weight REAL,
            PRIMARY KEY (agent, alias)
        )""",
        """CREATE TABLE canary_draws (
            conversation_id TEXT PRIMARY KEY,
            agent TEXT NOT NULL,
            alias TEXT NOT NULL,
            digest TEXT NOT NULL,
            created_at REAL NOT NULL
        )""",
        "CREATE INDEX canary_draws_by_alias ON canary_draws (agent, alias, digest)",
    ),
)


def migrate(db: sqlite3.Connection) -> int:
    """Apply the migrations this database lacks, in one transaction; return its version."""
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY)")
        (current,) = db.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version").fetchone()
        if current > len(MIGRATIONS):
            raise RuntimeError(
                f"the database has schema version {current}, newer than this server's {len(MIGRATIONS)}"
            )
        for version in range(current + 1, len(MIGRATIONS) + 1):
            for statement in MIGRATIONS[version - 1]:
                db.execute(statement)
            db.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    return len(MIGRATIONS)
