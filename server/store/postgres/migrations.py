"""The PostgreSQL schema, as an append-only list of migrations.

`MIGRATIONS[n]` takes a database from version n to n + 1; `schema_version`
records the versions applied. A later change adds an entry and never edits
an old one, so a database created by any earlier release upgrades in place
on open. The list is PostgreSQL's own (it need not retrace SQLite's
history), but it holds the same data.

Several replicas may start at once on one database: `migrate` runs under a
transaction-scoped advisory lock, so one applies the migrations and the
others, once it commits, find nothing left to do. A database newer than this
code refuses to start: an older replica must not write into a schema it
does not know.

Choices that differ from SQLite, and why:

- JSON is stored as `text`, not `jsonb`. The store never queries inside it;
  text keeps exactly what was written (key order, as clients saw it),
  costs the server no parse on every write (events are the hot path), and
  accepts every JSON string, where jsonb refuses the `\\u0000` escape.
- Each conversation row carries its own counters (`message_seq`,
  `event_seq`): an append bumps the counter with `UPDATE ... RETURNING`,
  which takes the row's lock, so concurrent writers on several connections
  get consecutive numbers with no gap and no duplicate (a rolled-back append
  rolls its bump back too), in one statement, without reading `MAX(seq)`.
- The queue's `position` is an identity column: one sequence for every
  replica, so positions follow arrival order across replicas (admissions
  of one conversation are serialized by its row lock).
"""

from __future__ import annotations

import asyncpg

from ..forks import SHARE_COPIES

# pg_advisory_xact_lock key for migrations: b"corral" read as a number, unlikely to meet anyone else's
LOCK_KEY = int.from_bytes(b"corral", "big")

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 1: everything of SQLite's versions 1 to 5, plus the per-conversation sequence counters
    (
        """CREATE TABLE conversations (
            id text PRIMARY KEY,
            agent text NOT NULL,
            agent_name text NOT NULL,
            digest text NOT NULL,
            pinned boolean NOT NULL,
            title text,
            metadata text NOT NULL,
            status text NOT NULL,
            created_at double precision NOT NULL,
            updated_at double precision NOT NULL,
            message_seq bigint NOT NULL DEFAULT 0,
            event_seq bigint NOT NULL DEFAULT 0,
            holder_turn text,
            holder_replica text,
            lease_until double precision,
            fence bigint NOT NULL DEFAULT 0
        )""",
        "CREATE INDEX conversations_by_time ON conversations (created_at, id)",
        "CREATE INDEX conversations_held ON conversations (holder_replica) WHERE holder_turn IS NOT NULL",
        """CREATE TABLE turns (
            id text PRIMARY KEY,
            conversation_id text NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            agent text NOT NULL,
            digest text NOT NULL,
            status text NOT NULL,
            input text NOT NULL,
            output text,
            stop_reason text,
            usage text NOT NULL,
            error text,
            idempotency_key text,
            request_digest text,
            started_at double precision NOT NULL,
            ended_at double precision,
            CONSTRAINT turns_idempotency_key UNIQUE (conversation_id, idempotency_key)
        )""",
        "CREATE INDEX turns_by_time ON turns (conversation_id, started_at, id)",
        # only the few unfinished turns are indexed: what recovery scans every heartbeat
        "CREATE INDEX turns_unfinished ON turns (conversation_id) WHERE status IN ('running', 'waiting')",
        """CREATE TABLE messages (
            conversation_id text NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            seq bigint NOT NULL,
            turn_id text NOT NULL,
            body text NOT NULL,
            created_at double precision NOT NULL,
            PRIMARY KEY (conversation_id, seq)
        )""",
        """CREATE TABLE events (
            conversation_id text NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            seq bigint NOT NULL,
            name text NOT NULL,
            data text NOT NULL,
            created_at double precision NOT NULL,
            PRIMARY KEY (conversation_id, seq)
        )""",
        """CREATE TABLE definitions (
            digest text PRIMARY KEY,
            kind text NOT NULL,
            name text NOT NULL,
            spec text NOT NULL,
            first_seen double precision NOT NULL
        )""",
        "CREATE INDEX definitions_by_name ON definitions (kind, name)",
        """CREATE TABLE swaps (
            id text PRIMARY KEY,
            at double precision NOT NULL,
            status text NOT NULL,
            report text NOT NULL
        )""",
        """CREATE TABLE aliases (
            agent text NOT NULL,
            alias text NOT NULL,
            digest text NOT NULL,
            updated_at double precision NOT NULL,
            PRIMARY KEY (agent, alias)
        )""",
        """CREATE TABLE permissions (
            id text PRIMARY KEY,
            conversation_id text NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            turn_id text NOT NULL,
            tool_call_id text NOT NULL,
            tool text NOT NULL,
            arguments text NOT NULL,
            reason text,
            status text NOT NULL,
            requested_at double precision NOT NULL,
            expires_at double precision NOT NULL,
            decided_by text,
            decided_at double precision
        )""",
        "CREATE INDEX permissions_by_conversation ON permissions (conversation_id, requested_at)",
        "CREATE INDEX permissions_pending ON permissions (turn_id) WHERE status = 'pending'",
        "CREATE TABLE probes (id integer PRIMARY KEY CHECK (id = 1), at double precision NOT NULL)",
        """CREATE TABLE admissions (
            position bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            conversation_id text NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            turn_id text NOT NULL UNIQUE,
            replica text NOT NULL,
            superseded boolean NOT NULL DEFAULT false,
            idempotency_key text,
            request_digest text,
            lease_until double precision NOT NULL,
            UNIQUE (conversation_id, idempotency_key)
        )""",
        "CREATE INDEX admissions_by_conversation ON admissions (conversation_id, position)",
        "CREATE INDEX admissions_by_replica ON admissions (replica)",
        """CREATE TABLE replicas (
            id text PRIMARY KEY,
            started_at double precision NOT NULL,
            heartbeat_at double precision NOT NULL,
            set_digest text NOT NULL,
            running_turns integer NOT NULL
        )""",
        """CREATE TABLE files (
            digest text PRIMARY KEY,
            data bytea NOT NULL,
            mode integer NOT NULL
        )""",
    ),
    # 2: durable turns: how many times a turn has run (a turn taken over after a crash runs again)
    (
        "ALTER TABLE turns ADD COLUMN attempts integer NOT NULL DEFAULT 1",
    ),
    # 3: conversation controls: archived conversations, and where a fork came from (no foreign key:
    # a fork outlives its source)
    (
        "ALTER TABLE conversations ADD COLUMN archived boolean NOT NULL DEFAULT false",
        "ALTER TABLE conversations ADD COLUMN forked_from_conversation text",
        "ALTER TABLE conversations ADD COLUMN forked_from_turn text",
    ),
    # 4: context management: each compaction's view of a conversation, and messages steered into a
    # running turn that it has not picked up yet
    (
        """CREATE TABLE context_views (
            conversation_id text NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            number integer NOT NULL,
            upto_seq bigint NOT NULL,
            cut_seq bigint NOT NULL,
            summary text,
            tokens integer NOT NULL,
            strategy text NOT NULL,
            created_at double precision NOT NULL,
            PRIMARY KEY (conversation_id, number)
        )""",
        """CREATE TABLE steers (
            id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            conversation_id text NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            turn_id text NOT NULL,
            content text NOT NULL,
            created_at double precision NOT NULL
        )""",
        "CREATE INDEX steers_by_turn ON steers (conversation_id, turn_id, id)",
    ),
    # 5: the Idempotency-Key a steered message was sent with: a retry answers the same turn and adds
    # nothing (`steer_id`: the pending message, until a turn picks it up)
    (
        """CREATE TABLE steer_keys (
            conversation_id text NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            key text NOT NULL,
            request_digest text,
            turn_id text NOT NULL,
            steer_id bigint,
            created_at double precision NOT NULL,
            PRIMARY KEY (conversation_id, key)
        )""",
    ),
    # 6: forks share their source's messages instead of copying them (see `forks`), and a turn's
    # messages are found by its id; then the copies earlier forks made become shared (the counters
    # stay: a fork's `message_seq` counts its shared messages too)
    (
        "ALTER TABLE conversations ADD COLUMN shares_from text",
        "ALTER TABLE conversations ADD COLUMN shared_upto bigint NOT NULL DEFAULT 0",
        "CREATE INDEX conversations_by_sharing ON conversations (shares_from) WHERE shares_from IS NOT NULL",
        "CREATE INDEX messages_by_turn ON messages (conversation_id, turn_id, seq)",
        *SHARE_COPIES,
    ),
    # 7: eval runs (§12); the rules an alias follows (require_evals, a canary) and the side each
    # conversation created on an alias with a canary drew
    (
        """CREATE TABLE eval_runs (
            id text PRIMARY KEY,
            eval text NOT NULL,
            eval_digest text NOT NULL,
            agent_digest text NOT NULL,
            status text NOT NULL,
            started_at double precision NOT NULL,
            body text NOT NULL
        )""",
        "CREATE INDEX eval_runs_by_eval ON eval_runs (eval, started_at)",
        "CREATE INDEX eval_runs_by_digests ON eval_runs (agent_digest, eval_digest, status)",
        """CREATE TABLE alias_rules (
            agent text NOT NULL,
            alias text NOT NULL,
            require_evals boolean NOT NULL,
            canary_digest text,
            canary_weight double precision,
            PRIMARY KEY (agent, alias)
        )""",
        """CREATE TABLE canary_draws (
            conversation_id text PRIMARY KEY,
            agent text NOT NULL,
            alias text NOT NULL,
            digest text NOT NULL,
            created_at double precision NOT NULL
        )""",
        "CREATE INDEX canary_draws_by_alias ON canary_draws (agent, alias, digest)",
    ),
)


async def migrate(connection: asyncpg.Connection) -> int:
    """Apply the migrations this database lacks, in one transaction; return its version."""
    async with connection.transaction():
        await connection.execute("SELECT pg_advisory_xact_lock($1)", LOCK_KEY)
        await connection.execute(
            "CREATE TABLE IF NOT EXISTS schema_version (version integer PRIMARY KEY,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        current = await connection.fetchval("SELECT COALESCE(MAX(version), 0) FROM schema_version")
        if current > len(MIGRATIONS):
            raise RuntimeError(
                f"the database has schema version {current}, newer than this server's {len(MIGRATIONS)}"
            )
        for version in range(current + 1, len(MIGRATIONS) + 1):
            for statement in MIGRATIONS[version - 1]:
                await connection.execute(statement)
            await connection.execute("INSERT INTO schema_version (version) VALUES ($1)", version)
    return len(MIGRATIONS)
