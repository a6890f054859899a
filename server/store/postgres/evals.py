"""PostgreSQL tables of evals (§12): runs, stored once and changed only while `running`; alias rules.

A mixin of `PostgresStore` (same pool, same rules: one statement per write).
"""

from __future__ import annotations

import json
from typing import Any

from ..evals import CANARY_COUNTS, AliasRules, EvalRunQuery, counts, run_columns
from .pool import PostgresBase


class EvalTables(PostgresBase):
    async def save_eval_run(self, run: dict[str, Any], started_at: float) -> None:
        await self._write("INSERT INTO eval_runs (id, eval, eval_digest, agent_digest, status, started_at,"
                          " body) VALUES ($1, $2, $3, $4, $5, $6, $7)", *run_columns(run, started_at))

    async def end_eval_run(self, run: dict[str, Any]) -> bool:
        """Record a run's end; a run that ended already is left as it was (False)."""
        return await self._write_status(
            "UPDATE eval_runs SET status = $1, body = $2 WHERE id = $3 AND status = 'running'",
            run["status"], json.dumps(run, separators=(",", ":")), run["id"]) > 0

    async def get_eval_run(self, run_id: str) -> dict[str, Any] | None:
        row = await self._read_row("SELECT body FROM eval_runs WHERE id = $1", run_id)
        return None if row is None else json.loads(row[0])

    async def list_eval_runs(self, query: EvalRunQuery) -> list[dict[str, Any]]:
        where, args = query.where("$")
        rows = await self._read(f"SELECT body FROM eval_runs{where} ORDER BY started_at DESC, id DESC"
                                f" LIMIT {int(query.limit)}", *args)
        return [json.loads(row[0]) for row in rows]

    async def set_alias_rules(self, agent: str, alias: str, rules: AliasRules) -> None:
        await self._write("INSERT INTO alias_rules (agent, alias, require_evals, canary_digest,"
                          " canary_weight) VALUES ($1, $2, $3, $4, $5)"
                          " ON CONFLICT (agent, alias) DO UPDATE SET require_evals = excluded.require_evals,"
                          " canary_digest = excluded.canary_digest,"
                          " canary_weight = excluded.canary_weight",
                          agent, alias, rules.require_evals, rules.canary_digest, rules.canary_weight)

    async def get_alias_rules(self, agent: str, alias: str) -> AliasRules:
        row = await self._read_row("SELECT require_evals, canary_digest, canary_weight FROM alias_rules"
                                   " WHERE agent = $1 AND alias = $2", agent, alias)
        return AliasRules() if row is None else AliasRules(bool(row[0]), row[1], row[2])

    async def record_canary_draw(self, agent: str, alias: str, conversation_id: str, digest: str,
                                 now: float) -> None:
        await self._write("INSERT INTO canary_draws (conversation_id, agent, alias, digest, created_at)"
                          " VALUES ($1, $2, $3, $4, $5)", conversation_id, agent, alias, digest, now)

    async def canary_counts(self, agent: str, alias: str) -> dict[str, dict[str, int]]:
        return counts(await self._read(CANARY_COUNTS.format("$1", "$2"), agent, alias))
