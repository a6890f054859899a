"""SQLite tables of evals (§12): runs, stored once and changed only while `running`; alias rules.

A mixin of `SQLiteStore` (same connection, same transaction rules). A run is
kept whole as JSON (`body`), with the columns it is looked up by beside it.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import AbstractContextManager
from typing import Any

from ..evals import CANARY_COUNTS, AliasRules, EvalRunQuery, counts, run_columns


class EvalTables:
    _db: sqlite3.Connection

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:  # provided by SQLiteStore
        raise NotImplementedError

    async def save_eval_run(self, run: dict[str, Any], started_at: float) -> None:
        with self._write() as db:
            db.execute("INSERT INTO eval_runs (id, eval, eval_digest, agent_digest, status, started_at, body)"
                       " VALUES (?, ?, ?, ?, ?, ?, ?)", run_columns(run, started_at))

    async def end_eval_run(self, run: dict[str, Any]) -> bool:
        """Record a run's end; a run that ended already is left as it was (False)."""
        with self._write() as db:
            cursor = db.execute(
                "UPDATE eval_runs SET status = ?, body = ? WHERE id = ? AND status = 'running'",
                (run["status"], json.dumps(run, separators=(",", ":")), run["id"]))
        return cursor.rowcount > 0

    async def get_eval_run(self, run_id: str) -> dict[str, Any] | None:
        row = self._db.execute("SELECT body FROM eval_runs WHERE id = ?", (run_id,)).fetchone()
        return None if row is None else json.loads(row[0])

    async def list_eval_runs(self, query: EvalRunQuery) -> list[dict[str, Any]]:
        where, args = query.where("?")
        rows = self._db.execute(f"SELECT body FROM eval_runs{where} ORDER BY started_at DESC, id DESC"
                                f" LIMIT {int(query.limit)}", args)
        return [json.loads(row[0]) for row in rows]

    async def set_alias_rules(self, agent: str, alias: str, rules: AliasRules) -> None:
        with self._write() as db:
            db.execute("INSERT INTO alias_rules (agent, alias, require_evals, canary_digest, canary_weight)"
                       " VALUES (?, ?, ?, ?, ?) ON CONFLICT (agent, alias) DO UPDATE SET"
                       " require_evals = excluded.require_evals, canary_digest = excluded.canary_digest,"
                       " canary_weight = excluded.canary_weight",
                       (agent, alias, int(rules.require_evals), rules.canary_digest, rules.canary_weight))

    async def get_alias_rules(self, agent: str, alias: str) -> AliasRules:
        row = self._db.execute("SELECT require_evals, canary_digest, canary_weight FROM alias_rules"
                               " WHERE agent = ? AND alias = ?", (agent, alias)).fetchone()
        return AliasRules() if row is None else AliasRules(bool(row[0]), row[1], row[2])

    async def record_canary_draw(self, agent: str, alias: str, conversation_id: str, digest: str,
                                 now: float) -> None:
        with self._write() as db:
            db.execute("INSERT INTO canary_draws (conversation_id, agent, alias, digest, created_at)"
                       " VALUES (?, ?, ?, ?, ?)", (conversation_id, agent, alias, digest, now))

    async def canary_counts(self, agent: str, alias: str) -> dict[str, dict[str, int]]:
        return counts(self._db.execute(CANARY_COUNTS.format("?", "?"), (agent, alias)))
