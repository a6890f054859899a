"""PostgreSQL tables for coordination: who holds a conversation, its queue, replicas, shared files.

A mixin of `PostgresStore`. Several replicas call these at once, so every
decision about a conversation is taken under its row lock (`FOR NO KEY
UPDATE`: it serializes admissions, claims, releases and recoveries of that
conversation, yet leaves foreign-key checks alone, so a new turn or
permission request does not wait on it; an append does, briefly, as it moves
the row's counters). The lock is taken by the first statement of the
transaction and the decision by the second: under READ COMMITTED a
statement sees what committed before it began, so only a statement begun
after the lock sees everything the previous lock holder did.

Locks are always taken in one order: conversation rows (by id, when there
are several), then queue entries (by position), then turns, permissions and
events; so two replicas never wait on each other in a circle.

Behaviour follows the SQLite store (`sqlite_coordination`) call for call;
beyond it, recovery also deletes the queue entry of a holder it clears, so a
holder whose entry outlived its lease cannot block the queue.
"""

from __future__ import annotations

import json
from collections import defaultdict

import asyncpg

from .base import Admitted, Claim, Holder, Recovered, ReplicaRecord, StoredFile
from .postgres_pool import CHANNEL, PostgresBase, Transaction, dumps, notice_sql
from .postgres_rows import turn_record

INTERRUPTED = {"code": "interrupted", "message": "the server stopped while this turn was running"}
POLICIES = ("reject", "enqueue", "interrupt")

_HOLDER = "SELECT holder_turn, holder_replica, fence, lease_until FROM conversations WHERE id = $1"
_LOCK = _HOLDER + " FOR NO KEY UPDATE"

# $1 conversation, $2 turn, $3 policy, $4 replica, $5 key, $6 request digest, $7 lease, $8 holder's turn
_ADMIT = (
    "WITH joined AS ("
    " (SELECT turn_id, request_digest FROM admissions WHERE conversation_id = $1 AND idempotency_key = $5)"
    " UNION ALL (SELECT id, request_digest FROM turns WHERE conversation_id = $1 AND idempotency_key = $5)"
    " LIMIT 1),"
    " busy AS (SELECT COALESCE($8::text, (SELECT turn_id FROM admissions WHERE conversation_id = $1"
    " ORDER BY position LIMIT 1)) AS turn_id WHERE $3::text = 'reject'),"
    " admitted AS (SELECT 1 AS go WHERE NOT EXISTS (SELECT FROM joined)"
    " AND NOT EXISTS (SELECT FROM busy WHERE turn_id IS NOT NULL)),"
    " superseded AS (UPDATE admissions SET superseded = true WHERE conversation_id = $1 AND NOT superseded"
    " AND $3::text = 'interrupt' AND EXISTS (SELECT FROM admitted) RETURNING 1),"
    " queued AS (INSERT INTO admissions (conversation_id, turn_id, replica, idempotency_key, request_digest,"
    " lease_until) SELECT $1, $2, $4, $5, $6, $7 FROM admitted RETURNING position),"
    # first among the entries not superseded (an interrupt supersedes all before it) and nobody holds it:
    # claimed at once, as `claim` would
    " won AS (UPDATE conversations SET holder_turn = $2, holder_replica = $4, lease_until = $7,"
    " fence = fence + 1 WHERE id = $1 AND $8::text IS NULL AND EXISTS (SELECT FROM admitted)"
    " AND ($3::text = 'interrupt' OR NOT EXISTS (SELECT FROM admissions WHERE conversation_id = $1"
    " AND NOT superseded)) RETURNING fence)"
    " SELECT (SELECT turn_id FROM joined) AS joined, (SELECT request_digest FROM joined) AS joined_request,"
    " (SELECT turn_id FROM busy) AS busy, (SELECT fence FROM won) AS fence,"
    f" CASE WHEN EXISTS (SELECT FROM superseded) THEN {notice_sql('queue', r='$4::text', c='$1::text')} END"
)

# $1 conversation, $2 turn, $3 replica, $4 lease
_CLAIM = (
    "WITH mine AS (SELECT superseded FROM admissions WHERE turn_id = $2),"
    " dropped AS (DELETE FROM admissions WHERE turn_id = $2 AND superseded),"
    " head AS (SELECT turn_id FROM admissions WHERE conversation_id = $1 AND NOT superseded"
    " ORDER BY position LIMIT 1),"
    " won AS (UPDATE conversations SET holder_turn = $2, holder_replica = $3, lease_until = $4,"
    " fence = fence + 1 WHERE id = $1 AND holder_turn IS NULL AND (SELECT superseded FROM mine) IS FALSE"
    " AND (SELECT turn_id FROM head) = $2 RETURNING fence)"
    " SELECT (SELECT superseded FROM mine) AS superseded, (SELECT fence FROM won) AS fence"
)

# the queue entry waits for the conversation's lock (the EXISTS), so the lock order holds in one statement
_RELEASE = (
    "WITH locked AS (SELECT id FROM conversations WHERE id = $1 FOR NO KEY UPDATE),"
    " dropped AS (DELETE FROM admissions WHERE turn_id = $2 AND EXISTS (SELECT FROM locked)),"
    " freed AS (UPDATE conversations SET holder_turn = NULL, holder_replica = NULL, lease_until = NULL"
    " WHERE id = $1 AND holder_turn = $2)"
    f" SELECT {notice_sql('queue', r='$3::text', c='id')} FROM locked"
)

# the conversation rows first (all of them, in order: the count), then the queue entries in order
_RENEW = (
    "WITH renewed AS (UPDATE conversations SET lease_until = $1 WHERE id IN (SELECT id FROM conversations"
    " WHERE holder_replica = $2 AND holder_turn IS NOT NULL ORDER BY id FOR NO KEY UPDATE) RETURNING id)"
    " UPDATE admissions SET lease_until = $1 WHERE position IN (SELECT position FROM admissions"
    " WHERE replica = $2 AND (SELECT count(*) FROM renewed) >= 0 ORDER BY position FOR NO KEY UPDATE)"
)

# $1 now, $2 replica, $3 starting: what recovery may have to look at (read without locks; rechecked locked)
_CANDIDATES = (
    "SELECT id FROM conversations WHERE holder_turn IS NOT NULL"
    " AND ((holder_replica <> $2 AND lease_until < $1) OR (holder_replica = $2 AND $3))"
    " UNION SELECT t.conversation_id FROM turns t JOIN conversations c ON c.id = t.conversation_id"
    " WHERE t.status IN ('running', 'waiting') AND t.id IS DISTINCT FROM c.holder_turn"
    " UNION SELECT conversation_id FROM admissions"
    " WHERE (replica <> $2 AND lease_until < $1) OR (replica = $2 AND $3)"
)

# $1 conversations, $2 the holder each keeps (NULL: none): every other unfinished turn fails
_FAIL = (
    "UPDATE turns t SET status = 'failed', error = $3, ended_at = $4"
    " FROM unnest($1::text[], $2::text[]) AS k (conversation_id, holder)"
    " WHERE t.conversation_id = k.conversation_id AND t.status IN ('running', 'waiting')"
    " AND t.id IS DISTINCT FROM k.holder RETURNING t.*"
)

# the plan per conversation ($1-$4), the failed turns ($5-$8); $9 now, $10 replica, $11 starting,
# $12 the turns of the holders cleared
_SETTLE = (
    "WITH plan AS (SELECT * FROM unnest($1::text[], $2::int[], $3::bool[], $4::bool[])"
    " AS p (id, failed, clear, idle)),"
    " changed AS (UPDATE conversations c SET event_seq = c.event_seq + p.failed,"
    " holder_turn = CASE WHEN p.clear THEN NULL ELSE c.holder_turn END,"
    " holder_replica = CASE WHEN p.clear THEN NULL ELSE c.holder_replica END,"
    " lease_until = CASE WHEN p.clear THEN NULL ELSE c.lease_until END,"
    " status = CASE WHEN p.idle THEN 'idle' ELSE c.status END,"
    " updated_at = CASE WHEN p.idle THEN $9 ELSE c.updated_at END"
    " FROM plan p WHERE c.id = p.id RETURNING c.id, c.event_seq - p.failed AS base),"
    " ended AS (SELECT * FROM unnest($5::text[], $6::text[], $7::int[], $8::text[])"
    " AS e (turn_id, conversation_id, k, data)),"
    " logged AS (INSERT INTO events (conversation_id, seq, name, data, created_at)"
    " SELECT e.conversation_id, c.base + e.k, 'turn.failed', e.data, $9"
    " FROM ended e JOIN changed c ON c.id = e.conversation_id),"
    " cancelled AS (UPDATE permissions SET status = 'cancelled', decided_by = 'recovery', decided_at = $9"
    " WHERE status = 'pending' AND turn_id = ANY($5::text[])),"
    " gone AS (DELETE FROM admissions WHERE position IN (SELECT position FROM admissions"
    " WHERE conversation_id = ANY($1::text[]) AND ((replica <> $10 AND lease_until < $9)"
    " OR (replica = $10 AND $11) OR turn_id = ANY($12::text[])) ORDER BY position FOR UPDATE)"
    " RETURNING conversation_id)"
    " SELECT id, base, ARRAY(SELECT DISTINCT conversation_id FROM gone) AS emptied FROM changed"
)


class CoordinationTables(PostgresBase):
    # who runs a conversation's turn

    async def admit(self, conversation_id: str, turn_id: str, policy: str, now: float, lease_until: float,
                    *, key: str | None = None, request_digest: str | None = None) -> Admitted:
        """Join the queue (holding it at once if first), or say why not; BEGIN, lock, decide, COMMIT."""
        if policy not in POLICIES:
            raise ValueError(f"unknown busy policy {policy!r}")
        async with self._transaction() as tx:
            held = await tx.fetchrow(_LOCK, conversation_id)
            holder = _holder(held)
            row = await tx.fetchrow(_ADMIT, conversation_id, turn_id, policy, self.replica, key,
                                    request_digest, lease_until, holder.turn_id if holder else None)
        assert row is not None
        if row["joined"] is not None:
            return Admitted(joined=row["joined"], joined_request=row["joined_request"])
        if row["busy"] is not None:
            return Admitted(busy=row["busy"])
        return Admitted(cancel=holder if policy == "interrupt" else None, fence=row["fence"])

    async def claim(self, conversation_id: str, turn_id: str, now: float, lease_until: float) -> Claim:
        """Hold the conversation if this turn is next; BEGIN, lock, decide (one statement), COMMIT."""
        async with self._transaction() as tx:
            await tx.fetchrow(_LOCK, conversation_id)
            row = await tx.fetchrow(_CLAIM, conversation_id, turn_id, self.replica, lease_until)
        assert row is not None
        if row["superseded"] is not False:  # superseded, or its entry is gone (lapsed): it cannot run
            return Claim(superseded=True)
        return Claim(fence=row["fence"])

    async def release(self, conversation_id: str, turn_id: str) -> None:
        """Leave the queue and let the next one in; one statement, with its "queue" notice."""
        await self._write(_RELEASE, conversation_id, turn_id, self.replica)

    async def holder(self, conversation_id: str) -> Holder | None:
        return _holder(await self._read_row(_HOLDER, conversation_id))

    async def renew_leases(self, lease_until: float) -> None:
        await self._write(_RENEW, lease_until, self.replica)

    async def recover_lapsed(self, now: float, *, starting: bool = False) -> list[Recovered]:
        """End the turns of holders whose lease lapsed (see `Store`); one read when there are none."""
        candidates = [row[0] for row in await self._read(_CANDIDATES, now, self.replica, starting)]
        if not candidates:
            return []
        async with self._transaction() as tx:
            return await self._recover(tx, candidates, now, starting)

    async def _recover(self, tx: Transaction, candidates: list[str], now: float,
                       starting: bool) -> list[Recovered]:
        locked = await tx.fetch(
            "SELECT id, holder_turn, holder_replica, lease_until FROM conversations"
            " WHERE id = ANY($1::text[]) ORDER BY id FOR NO KEY UPDATE", candidates)
        cleared = {row["id"]: row["holder_turn"] for row in locked if self._lapsed(row, now, starting)}
        keeps = {row["id"]: None if row["id"] in cleared else row["holder_turn"] for row in locked}
        failed = [turn_record(row) for row in await tx.fetch(
            _FAIL, list(keeps), list(keeps.values()), dumps(INTERRUPTED), now)]
        failed.sort(key=lambda t: (t.started_at, t.id))
        by_conversation: dict[str, list[str]] = defaultdict(list)
        for turn in failed:
            by_conversation[turn.conversation_id].append(turn.id)
        ids = list(keeps)
        idle = [c in cleared or (bool(by_conversation[c]) and keeps[c] is None) for c in ids]
        ks = [by_conversation[t.conversation_id].index(t.id) + 1 for t in failed]  # its place in its own
        rows = await tx.fetch(
            _SETTLE, ids, [len(by_conversation[c]) for c in ids], [c in cleared for c in ids], idle,
            [t.id for t in failed], [t.conversation_id for t in failed],
            ks,
            [dumps({"turn_id": t.id, "error": INTERRUPTED}) for t in failed],
            now, self.replica, starting, list(cleared.values()))
        bases = {row["id"]: row["base"] for row in rows}
        emptied = set(rows[0]["emptied"]) if rows else set()
        recovered = [Recovered(turn=t, seq=bases[t.conversation_id] + k)
                     for t, k in zip(failed, ks, strict=True)]
        notices = [{"t": "event", "c": r.turn.conversation_id, "s": r.seq, "n": "turn.failed"}
                   for r in recovered]
        notices += [{"t": "status", "c": c, "st": "idle"} for c, now_idle in zip(ids, idle, strict=True)
                    if now_idle]
        notices += [{"t": "queue", "c": c} for c in ids if c in cleared or c in emptied]
        if notices:
            payloads = [json.dumps({**n, "r": self.replica}, separators=(",", ":")) for n in notices]
            await tx.execute("SELECT pg_notify($1, n) FROM unnest($2::text[]) AS n", CHANNEL, payloads)
        return recovered

    def _lapsed(self, row: asyncpg.Record, now: float, starting: bool) -> bool:
        if row["holder_turn"] is None:
            return False
        if row["holder_replica"] == self.replica:
            return starting  # never this replica's own while it runs
        return row["lease_until"] < now

    # replicas

    async def heartbeat(self, replica: ReplicaRecord) -> None:
        r = replica
        await self._write(
            "INSERT INTO replicas (id, started_at, heartbeat_at, set_digest, running_turns)"
            " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO UPDATE SET started_at = excluded.started_at,"
            " heartbeat_at = excluded.heartbeat_at, set_digest = excluded.set_digest,"
            " running_turns = excluded.running_turns",
            r.id, r.started_at, r.heartbeat_at, r.set_digest, r.running_turns)

    async def list_replicas(self, since: float) -> list[ReplicaRecord]:
        rows = await self._read(
            "SELECT id, started_at, heartbeat_at, set_digest, running_turns FROM replicas"
            " WHERE heartbeat_at >= $1 ORDER BY id", since)
        return [ReplicaRecord(**dict(row)) for row in rows]

    async def remove_replica(self, replica_id: str) -> None:
        await self._write("DELETE FROM replicas WHERE id = $1", replica_id)

    # files definitions point to

    async def save_files(self, files: list[StoredFile]) -> None:
        if not files:
            return
        await self._write(
            "INSERT INTO files (digest, data, mode) SELECT * FROM unnest($1::text[], $2::bytea[], $3::int[])"
            " ON CONFLICT (digest) DO NOTHING",
            [f.digest for f in files], [f.data for f in files], [f.mode for f in files])

    async def get_file(self, digest: str) -> StoredFile | None:
        row = await self._read_row("SELECT digest, data, mode FROM files WHERE digest = $1", digest)
        return None if row is None else StoredFile(digest=row[0], data=bytes(row[1]), mode=row[2])


def _holder(row: asyncpg.Record | None) -> Holder | None:
    if row is None or row["holder_turn"] is None:
        return None
    return Holder(turn_id=row["holder_turn"], replica=row["holder_replica"], fence=row["fence"],
                  lease_until=row["lease_until"])
