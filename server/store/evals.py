"""What both stores share about eval runs and alias rules: the query of `list_eval_runs`, a run's
columns, an alias's rules, and the statement that counts each canary side's conversations and turns."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class EvalRunQuery:
    """Runs newest first, narrowed by whichever fields are given."""

    eval: str | None = None
    eval_digest: str | None = None
    agent_digest: str | None = None
    status: str | None = None
    limit: int = 50

    def where(self, placeholder: str) -> tuple[str, list[Any]]:
        """A WHERE clause (`placeholder`: "?" for SQLite, "$" for PostgreSQL's numbered ones)."""
        terms, args = [], []
        for column in ("eval", "eval_digest", "agent_digest", "status"):
            value = getattr(self, column)
            if value is not None:
                args.append(value)
                mark = f"${len(args)}" if placeholder == "$" else "?"
                terms.append(f"{column} = {mark}")
        return (" WHERE " + " AND ".join(terms) if terms else ""), args


def run_columns(run: dict[str, Any], started_at: float) -> tuple[Any, ...]:
    """The row of a run: what it is looked up by, then the run whole as JSON."""
    return (run["id"], run["eval"], run["eval_digest"], run["agent_digest"], run["status"], started_at,
            json.dumps(run, separators=(",", ":")))


@dataclass(frozen=True)
class AliasRules:
    """What an alias follows beyond its digest (§12): evals required, a canary digest and its weight."""

    require_evals: bool = False
    canary_digest: str | None = None
    canary_weight: float | None = None


# Per digest drawn on an alias: conversations created, their turns completed and failed.
CANARY_COUNTS = (
    "SELECT d.digest, COUNT(DISTINCT d.conversation_id),"
    " SUM(CASE WHEN t.status = 'completed' THEN 1 ELSE 0 END),"
    " SUM(CASE WHEN t.status = 'failed' THEN 1 ELSE 0 END)"
    " FROM canary_draws d LEFT JOIN turns t ON t.conversation_id = d.conversation_id"
    " WHERE d.agent = {0} AND d.alias = {1} GROUP BY d.digest"
)


def counts(rows: Any) -> dict[str, dict[str, int]]:
    return {row[0]: {"conversations": int(row[1]), "turns_completed": int(row[2] or 0),
                     "turns_failed": int(row[3] or 0)} for row in rows}
