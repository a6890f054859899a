"""SQLite tables for coordination: who holds a conversation, its queue, its lease, the replicas.

A part of `SQLiteStore` (same connection, same transaction rules). The
embedded store serves one process by design, so the queue and the holder
are what keep that process's turns in order (arrival order, one at a time);
leases only matter at start-up, where every holder a previous run left has
lapsed. Notices go nowhere: there is no other replica to tell.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import replace

from .. import rows
from ..records import Admitted, Claim, Holder, Notice, Recovered, ReplicaRecord, TurnRecord
from ..statements import SQLITE as SQL
from .writes import Tables, check_fence, insert_events, release_turn

INTERRUPTED = {"code": "interrupted", "message": "the server stopped while this turn was running"}


class CoordinationTables(Tables):
    # --- who runs a conversation's turn ------------------------------------------

    async def admit(self, conversation_id: str, turn_id: str, policy: str, now: float, lease_until: float,
                    *, key: str | None = None, request_digest: str | None = None) -> Admitted:
        with self._write() as db:
            if key is not None:
                row = db.execute(
                    "SELECT turn_id, request_digest FROM admissions"
                    " WHERE conversation_id = ? AND idempotency_key = ?"
                    " UNION ALL SELECT id, request_digest FROM turns"
                    " WHERE conversation_id = ? AND idempotency_key = ? LIMIT 1",
                    (conversation_id, key, conversation_id, key)).fetchone()
                if row is not None:
                    return Admitted(joined=row[0], joined_request=row[1])
            holder = _holder(db, conversation_id)
            cancel = None
            if policy == "reject":
                busy = holder.turn_id if holder is not None else _first_queued(db, conversation_id)
                if busy is not None:
                    return Admitted(busy=busy)
            elif policy == "interrupt":
                db.execute("UPDATE admissions SET superseded = 1 WHERE conversation_id = ?",
                           (conversation_id,))
                cancel = holder
            db.execute(
                "INSERT INTO admissions (conversation_id, turn_id, replica, idempotency_key, request_digest,"
                " lease_until) VALUES (?, ?, ?, ?, ?, ?)",
                (conversation_id, turn_id, self.replica, key, request_digest, lease_until))
            fence = None
            if holder is None and _first_queued(db, conversation_id, fresh=True) == turn_id:
                fence = _hold(db, conversation_id, turn_id, self.replica, lease_until)
        return Admitted(cancel=cancel, fence=fence)

    async def claim(self, conversation_id: str, turn_id: str, now: float, lease_until: float) -> Claim:
        with self._write() as db:
            row = db.execute("SELECT superseded FROM admissions WHERE turn_id = ?", (turn_id,)).fetchone()
            if row is None or row[0]:
                db.execute("DELETE FROM admissions WHERE turn_id = ?", (turn_id,))
                return Claim(superseded=True)
            if _holder(db, conversation_id) is not None:
                return Claim()
            if _first_queued(db, conversation_id, fresh=True) != turn_id:
                return Claim()
            fence = _hold(db, conversation_id, turn_id, self.replica, lease_until)
        return Claim(fence=fence)

    async def release(self, conversation_id: str, turn_id: str, *, fence: int | None = None) -> None:
        with self._write() as db:
            if fence is not None:
                check_fence(db, conversation_id, turn_id, fence, self.replica)
            release_turn(db, conversation_id, turn_id)

    async def holder(self, conversation_id: str) -> Holder | None:
        return _holder(self._db, conversation_id)

    async def renew_leases(self, lease_until: float) -> None:
        with self._write() as db:
            db.execute("UPDATE conversations SET lease_until = ? WHERE holder_replica = ?"
                       " AND holder_turn IS NOT NULL", (lease_until, self.replica))
            db.execute("UPDATE admissions SET lease_until = ? WHERE replica = ?", (lease_until, self.replica))

    async def recover_lapsed(self, now: float, *, starting: bool = False, lease_until: float = 0.0,
                             max_attempts: int = 0) -> list[Recovered]:
        everything = starting and self.embedded
        with self._write() as db:
            held = dict(db.execute(
                "SELECT id, holder_turn FROM conversations WHERE holder_turn IS NOT NULL AND (? OR"
                " (holder_replica = ? AND ?) OR (holder_replica != ? AND lease_until < ?))",
                (everything, self.replica, starting, self.replica, now)).fetchall())
            # a lapsed holder's turn, and any turn left running that holds nothing (a crash between
            # the claim and the turn's row cannot leave one; an older schema's crash can)
            unfinished = [rows.turn(row) for row in db.execute(
                "SELECT t.* FROM turns t JOIN conversations c ON c.id = t.conversation_id"
                " WHERE t.status IN ('running', 'waiting')"
                " AND (c.holder_turn IS NULL OR c.holder_turn != t.id)"
                " UNION SELECT t.* FROM turns t JOIN conversations c ON c.holder_turn = t.id"
                " WHERE t.status IN ('running', 'waiting') AND c.id IN"
                f" ({','.join('?' * len(held))}) ORDER BY started_at, id", tuple(held))]
            recovered: list[Recovered] = []
            for turn in unfinished:
                # only a lapsed holder's turn runs again; a turn running without holding is an anomaly
                again = held.get(turn.conversation_id) == turn.id and turn.attempts < max_attempts
                recovered.append(_take_over(db, turn, self.replica, now, lease_until) if again
                                 else _fail(db, turn, now))
            resumed = {r.turn.conversation_id for r in recovered if r.resumed}
            # the cleared holders' queue entries go with them: one that outlived its lease would block
            db.executemany("DELETE FROM admissions WHERE turn_id = ?",
                           [(t,) for c, t in held.items() if c not in resumed])
            idle = (set(held) | {r.turn.conversation_id for r in recovered}) - resumed
            db.executemany(
                "UPDATE conversations SET holder_turn = NULL, holder_replica = NULL, lease_until = NULL,"
                " status = 'idle', updated_at = ? WHERE id = ? AND (holder_turn IS NULL OR id IN"
                f" ({','.join('?' * len(held))}))",
                [(now, conversation_id, *held) for conversation_id in idle])
            kept = tuple(held[c] for c in resumed)
            marks = ",".join("?" * len(kept))
            if everything:  # nothing else runs before an embedded store's one process starts
                db.execute("UPDATE conversations SET status = 'idle', updated_at = ? WHERE status != 'idle'"
                           " AND holder_turn IS NULL", (now,))
                db.execute(f"DELETE FROM admissions WHERE turn_id NOT IN ({marks})", kept)
            else:
                db.execute("DELETE FROM admissions WHERE ((lease_until < ? AND replica != ?)"
                           f" OR (replica = ? AND ?)) AND turn_id NOT IN ({marks})",
                           (now, self.replica, self.replica, starting, *kept))
        return recovered

    async def hand_over(self, conversation_id: str, turn_id: str, fence: int) -> None:
        with self._write() as db:
            db.execute("UPDATE conversations SET lease_until = 0 WHERE id = ? AND holder_turn = ?"
                       " AND fence = ? AND holder_replica = ?",
                       (conversation_id, turn_id, fence, self.replica))

    async def notify(self, notice: Notice) -> None:
        """Nowhere to send it: the embedded store has one process."""

    def subscribe(self, handler: Callable[[Notice], None]) -> None:
        """Nothing will arrive: the embedded store has one process."""

    # --- replicas ------------------------------------------------------------------

    async def heartbeat(self, replica: ReplicaRecord) -> None:
        r = replica
        with self._write() as db:
            db.execute(SQL.heartbeat, (r.id, r.started_at, r.heartbeat_at, r.set_digest, r.running_turns))

    async def list_replicas(self, since: float) -> list[ReplicaRecord]:
        return [rows.replica(row) for row in self._db.execute(SQL.list_replicas, (since,))]

    async def remove_replica(self, replica_id: str) -> None:
        with self._write() as db:
            db.execute(SQL.remove_replica, (replica_id,))


def _take_over(db: sqlite3.Connection, turn: TurnRecord, replica: str, now: float,
               lease_until: float) -> Recovered:
    """This replica holds the turn's conversation now, to run the turn again (its next attempt)."""
    attempt = turn.attempts + 1
    db.execute("UPDATE turns SET attempts = ? WHERE id = ?", (attempt, turn.id))
    fence = _hold(db, turn.conversation_id, turn.id, replica, lease_until)
    db.execute("UPDATE admissions SET replica = ?, lease_until = ? WHERE turn_id = ?",
               (replica, lease_until, turn.id))
    resumed = ("turn.resumed", {"turn_id": turn.id, "attempt": attempt})
    (seq,) = insert_events(db, turn.conversation_id, [resumed], now)
    return Recovered(turn=replace(turn, attempts=attempt), seq=seq, resumed=True, fence=fence)


def _fail(db: sqlite3.Connection, turn: TurnRecord, now: float) -> Recovered:
    """The turn ends as failed/interrupted: out of attempts, or not to be resumed."""
    db.execute("UPDATE turns SET status = 'failed', error = ?, ended_at = ? WHERE id = ?",
               (rows.dumps(INTERRUPTED), now, turn.id))
    db.execute("UPDATE permissions SET status = 'cancelled', decided_by = 'recovery',"
               " decided_at = ? WHERE turn_id = ? AND status = 'pending'", (now, turn.id))
    failed = ("turn.failed", {"turn_id": turn.id, "error": INTERRUPTED})
    (seq,) = insert_events(db, turn.conversation_id, [failed], now)
    return Recovered(turn=replace(turn, status="failed", error=INTERRUPTED, ended_at=now), seq=seq)


def _holder(db: sqlite3.Connection, conversation_id: str) -> Holder | None:
    return rows.holder(db.execute(SQL.holder, (conversation_id,)).fetchone())


def _first_queued(db: sqlite3.Connection, conversation_id: str, *, fresh: bool = False) -> str | None:
    """The first turn in the conversation's queue (`fresh`: among those not superseded)."""
    row = db.execute("SELECT turn_id FROM admissions WHERE conversation_id = ?"
                     f"{' AND superseded = 0' if fresh else ''} ORDER BY position LIMIT 1",
                     (conversation_id,)).fetchone()
    return None if row is None else row[0]


def _hold(db: sqlite3.Connection, conversation_id: str, turn_id: str, replica: str,
          lease_until: float) -> int:
    """Make the turn the conversation's holder; returns the new fencing token."""
    (fence,) = db.execute(
        "UPDATE conversations SET holder_turn = ?, holder_replica = ?, lease_until = ?,"
        " fence = fence + 1 WHERE id = ? RETURNING fence",
        (turn_id, replica, lease_until, conversation_id)).fetchone()
    return fence

