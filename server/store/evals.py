"""What both stores share about eval runs: the query of `list_eval_runs`, and a run's columns."""

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
