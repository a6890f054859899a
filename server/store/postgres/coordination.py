"""PostgreSQL tables for coordination: who holds a conversation, its queue and lease, the replicas.

A part of `PostgresStore`. Its statements are its own on purpose (SQLite,
one process with no notices, decides in plain statements): several replicas
call these at once, so every decision about a conversation is taken under
its row lock (`FOR NO KEY UPDATE`: it serializes admissions, claims,
releases and recoveries of that conversation, yet leaves foreign-key checks
alone, so a new turn or permission request does not wait on it; an append
does, briefly, as it moves the row's counters), with its notices in the same
statement. The lock is taken by the first statement of the
transaction and the decision by the second: under READ COMMITTED a
statement sees what committed before it began, so only a statement begun
after the lock sees everything the previous lock holder did.

Locks are always taken in one order: conversation rows (by id, when there
are several), then queue entries (by position), then turns, permissions and
events; so two replicas never wait on each other in a circle.

Behaviour follows the SQLite store (`sqlite.coordination`) call for call:
recovery deletes the queue entry of a holder it clears (one that outlived its
lease would block the queue), and keeps, now owned by this replica, the entry
of a turn it takes over. Recovery is BEGIN, the locks, one statement that
takes over or fails the turns, one that settles conversations, events,
permissions and queue entries, the notices, COMMIT.
"""

from __future__ import annotations

import json
from collections import defaultdict

import asyncpg

from .. import rows
from ..records import Admitted, Claim, Holder, Recovered, ReplicaRecord
from ..rows import HOLDER_COLUMNS, dumps
from ..statements import POSTGRES as SQL
from .pool import CHANNEL, PostgresBase, Transaction, lease_lost, notice_sql

INTERRUPTED = {"code": "interrupted", "message": "the server stopped while this turn was running"}
POLICIES = ("reject", "enqueue", "interrupt")

_LOCK = f"SELECT {HOLDER_COLUMNS} FROM conversations WHERE id = $1 FOR NO KEY UPDATE"

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


def _release_sql(fenced: bool) -> str:
    """$1 conversation, $2 turn, $3 replica; `fenced`: $4 the fence, and nothing is written, no row
    returned, unless ($2, $3, $4) holds the conversation (the locking read rechecks the newest row)."""
    guard = " AND holder_turn = $2 AND holder_replica = $3 AND fence = $4" if fenced else ""
    after = " AND EXISTS (SELECT FROM locked)" if fenced else ""
    # the queue entry waits for the conversation's lock (the EXISTS), so the lock order holds in one statement
    return (
        f"WITH locked AS (SELECT id FROM conversations WHERE id = $1{guard} FOR NO KEY UPDATE),"
        " dropped AS (DELETE FROM admissions WHERE turn_id = $2 AND EXISTS (SELECT FROM locked)),"
        " freed AS (UPDATE conversations SET holder_turn = NULL, holder_replica = NULL, lease_until = NULL"
        f" WHERE id = $1 AND holder_turn = $2{after})"
        f" SELECT {notice_sql('queue', r='$3::text', c='id')} FROM locked"
    )


_RELEASE = _release_sql(False)
_RELEASE_FENCED = _release_sql(True)

# $1 conversation, $2 turn, $3 fence, $4 replica: the lease lapses now, and the others hear of it
_HAND_OVER = (
    "WITH handed AS (UPDATE conversations SET lease_until = 0 WHERE id = $1 AND holder_turn = $2"
    " AND fence = $3 AND holder_replica = $4 RETURNING id)"
    f" SELECT {notice_sql('handoff', r='$4::text', c='id')} FROM handed"
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

# $1 conversations, $2 the holder of each (NULL: none), $3 whether that holder lapsed, $4 the error,
# $5 now, $6 max attempts: a lapsed holder's unfinished turn with attempts to spare is taken over (one
# attempt more); every other unfinished turn but a live holder's fails. `resumed` says which is which.
_RESUME_OR_FAIL = (
    "WITH k AS (SELECT * FROM unnest($1::text[], $2::text[], $3::bool[]) AS k (conversation_id, holder,"
    " lapsed)),"
    " resumed AS (UPDATE turns t SET attempts = t.attempts + 1 FROM k"
    " WHERE t.conversation_id = k.conversation_id AND t.id = k.holder AND k.lapsed"
    " AND t.status IN ('running', 'waiting') AND t.attempts < $6 RETURNING t.*),"
    " failed AS (UPDATE turns t SET status = 'failed', error = $4, ended_at = $5 FROM k"
    " WHERE t.conversation_id = k.conversation_id AND t.status IN ('running', 'waiting')"
    " AND (t.id IS DISTINCT FROM k.holder OR (k.lapsed AND t.attempts >= $6)) RETURNING t.*)"
    " SELECT true AS resumed, * FROM resumed UNION ALL SELECT false AS resumed, * FROM failed"
)

# the plan per conversation ($1-$5), the recovered turns' events ($6-$10); $11 now, $12 replica,
# $13 starting, $14 the turns of the holders cleared, $15 the turns taken over, $16 their lease
_SETTLE = (
    "WITH plan AS (SELECT * FROM unnest($1::text[], $2::int[], $3::bool[], $4::bool[], $5::bool[])"
    " AS p (id, events, clear, idle, resume)),"
    " changed AS (UPDATE conversations c SET event_seq = c.event_seq + p.events,"
    " holder_turn = CASE WHEN p.clear THEN NULL ELSE c.holder_turn END,"
    " holder_replica = CASE WHEN p.resume THEN $12 WHEN p.clear THEN NULL ELSE c.holder_replica END,"
    " lease_until = CASE WHEN p.resume THEN $16 WHEN p.clear THEN NULL ELSE c.lease_until END,"
    " fence = CASE WHEN p.resume THEN c.fence + 1 ELSE c.fence END,"
    " status = CASE WHEN p.idle THEN 'idle' ELSE c.status END,"
    " updated_at = CASE WHEN p.idle THEN $11 ELSE c.updated_at END"
    " FROM plan p WHERE c.id = p.id RETURNING c.id, c.event_seq - p.events AS base, c.fence),"
    " ended AS (SELECT * FROM unnest($6::text[], $7::text[], $8::int[], $9::text[], $10::text[])"
    " AS e (turn_id, conversation_id, k, name, data)),"
    " logged AS (INSERT INTO events (conversation_id, seq, name, data, created_at)"
    " SELECT e.conversation_id, c.base + e.k, e.name, e.data, $11"
    " FROM ended e JOIN changed c ON c.id = e.conversation_id),"
    # a turn taken over keeps its pending permissions (and its queue entry, now this replica's)
    " cancelled AS (UPDATE permissions SET status = 'cancelled', decided_by = 'recovery', decided_at = $11"
    " WHERE status = 'pending' AND turn_id IN (SELECT turn_id FROM ended WHERE name = 'turn.failed')),"
    " entries AS (SELECT position, turn_id = ANY($15::text[]) AS kept FROM admissions"
    " WHERE conversation_id = ANY($1::text[]) AND (turn_id = ANY($15::text[])"
    " OR (replica <> $12 AND lease_until < $11) OR (replica = $12 AND $13) OR turn_id = ANY($14::text[]))"
    " ORDER BY position FOR UPDATE),"
    " reowned AS (UPDATE admissions SET replica = $12, lease_until = $16"
    " WHERE position IN (SELECT position FROM entries WHERE kept)),"
    " gone AS (DELETE FROM admissions WHERE position IN (SELECT position FROM entries WHERE NOT kept)"
    " RETURNING conversation_id)"
    " SELECT id, base, fence, ARRAY(SELECT DISTINCT conversation_id FROM gone) AS emptied FROM changed"
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
            holder = rows.holder(held)
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

    async def release(self, conversation_id: str, turn_id: str, *, fence: int | None = None) -> None:
        """Leave the queue and let the next one in; one statement, with its "queue" notice (fenced too)."""
        if fence is None:
            await self._write(_RELEASE, conversation_id, turn_id, self.replica)
        elif not await self._write(_RELEASE_FENCED, conversation_id, turn_id, self.replica, fence):
            raise lease_lost(turn_id, conversation_id, fence)

    async def holder(self, conversation_id: str) -> Holder | None:
        return rows.holder(await self._read_row(SQL.holder, conversation_id))

    async def renew_leases(self, lease_until: float) -> None:
        await self._write(_RENEW, lease_until, self.replica)

    async def recover_lapsed(self, now: float, *, starting: bool = False, lease_until: float = 0.0,
                             max_attempts: int = 0) -> list[Recovered]:
        """Take over, or end, the turns of holders whose lease lapsed (see `Store`); one read when there
        are none."""
        candidates = [row[0] for row in await self._read(_CANDIDATES, now, self.replica, starting)]
        if not candidates:
            return []
        async with self._transaction() as tx:
            return await self._recover(tx, candidates, now, starting, lease_until, max_attempts)

    async def _recover(self, tx: Transaction, candidates: list[str], now: float, starting: bool,
                       lease_until: float, max_attempts: int) -> list[Recovered]:
        locked = await tx.fetch(
            "SELECT id, holder_turn, holder_replica, lease_until FROM conversations"
            " WHERE id = ANY($1::text[]) ORDER BY id FOR NO KEY UPDATE", candidates)
        holders = {row["id"]: row["holder_turn"] for row in locked}
        lapsed = {row["id"] for row in locked if self._lapsed(row, now, starting)}
        ids = list(holders)
        ended = await tx.fetch(_RESUME_OR_FAIL, ids, list(holders.values()), [c in lapsed for c in ids],
                               dumps(INTERRUPTED), now, max_attempts)
        turns = sorted(((row["resumed"], rows.turn({k: v for k, v in row.items() if k != "resumed"}))
                        for row in ended), key=lambda r: (r[1].started_at, r[1].id))
        resumed = {t.conversation_id for again, t in turns if again}
        cleared = {c: holders[c] for c in lapsed if c not in resumed}
        by_conversation: dict[str, list[str]] = defaultdict(list)
        for _, turn in turns:
            by_conversation[turn.conversation_id].append(turn.id)
        idle = [c not in resumed and (c in cleared or (bool(by_conversation[c]) and holders[c] is None))
                for c in ids]
        ks = [by_conversation[t.conversation_id].index(t.id) + 1 for _, t in turns]  # its place in its own
        names = ["turn.resumed" if again else "turn.failed" for again, _ in turns]
        data = [dumps({"turn_id": t.id, "attempt": t.attempts} if again
                      else {"turn_id": t.id, "error": INTERRUPTED}) for again, t in turns]
        settled = await tx.fetch(
            _SETTLE, ids, [len(by_conversation[c]) for c in ids], [c in cleared for c in ids], idle,
            [c in resumed for c in ids],
            [t.id for _, t in turns], [t.conversation_id for _, t in turns], ks, names, data,
            now, self.replica, starting, list(cleared.values()),
            [holders[c] for c in ids if c in resumed], lease_until)
        bases = {row["id"]: (row["base"], row["fence"]) for row in settled}
        emptied = set(settled[0]["emptied"]) if settled else set()
        recovered = [Recovered(turn=t, seq=bases[t.conversation_id][0] + k, resumed=again,
                               fence=bases[t.conversation_id][1] if again else 0)
                     for (again, t), k in zip(turns, ks, strict=True)]
        notices = [{"t": "event", "c": r.turn.conversation_id, "s": r.seq, "n": name}
                   for r, name in zip(recovered, names, strict=True)]
        notices += [{"t": "status", "c": c, "st": "idle"} for c, now_idle in zip(ids, idle, strict=True)
                    if now_idle]
        notices += [{"t": "queue", "c": c} for c in ids if c in cleared or c in emptied]
        if notices:
            payloads = [json.dumps({**n, "r": self.replica}, separators=(",", ":")) for n in notices]
            await tx.execute("SELECT pg_notify($1, n) FROM unnest($2::text[]) AS n", CHANNEL, payloads)
        return recovered

    async def hand_over(self, conversation_id: str, turn_id: str, fence: int) -> None:
        """Let the lease lapse now, if `fence` still holds, with a "handoff" notice; one statement."""
        await self._write(_HAND_OVER, conversation_id, turn_id, fence, self.replica)

    def _lapsed(self, row: asyncpg.Record, now: float, starting: bool) -> bool:
        if row["holder_turn"] is None:
            return False
        if row["holder_replica"] == self.replica:
            return starting  # never this replica's own while it runs
        return row["lease_until"] < now

    # replicas

    async def heartbeat(self, replica: ReplicaRecord) -> None:
        r = replica
        await self._write(SQL.heartbeat, r.id, r.started_at, r.heartbeat_at, r.set_digest, r.running_turns)

    async def list_replicas(self, since: float) -> list[ReplicaRecord]:
        return [rows.replica(row) for row in await self._read(SQL.list_replicas, since)]

    async def remove_replica(self, replica_id: str) -> None:
        await self._write(SQL.remove_replica, replica_id)
