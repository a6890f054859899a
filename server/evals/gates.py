"""Whether an agent digest passed what a gate requires: each of its agent's Evals at their current
digests (§12). An alias with `require_evals` asks before every move; `evals_required` names what
is missing: each eval, its digest, and the status of its latest run on that digest (null: never run).
"""

from __future__ import annotations

from typing import Any

from ..compiler.definitions import AgentDefinition
from ..errors import RequestError
from .runs import EvalRuns


async def missing(evals: EvalRuns, agent: AgentDefinition) -> list[dict[str, Any]]:
    """Each Eval of the agent (current set) with no passing run on `agent.digest` at its digest."""
    out = []
    for definition in sorted(evals.registry.current.evals(agent.name), key=lambda e: e.name):
        if await evals.passing(definition.name, definition.digest, agent.digest) is not None:
            continue
        latest = await evals.latest(definition, agent.digest)
        out.append({"eval": definition.name, "eval_digest": definition.digest,
                    "status": latest["status"] if latest else None})
    return out


async def require(evals: EvalRuns, agent: AgentDefinition, what: str) -> None:
    """Raise `evals_required` (409) unless `agent`'s digest passed each of its Evals."""
    gaps = await missing(evals, agent)
    if gaps:
        names = ", ".join(g["eval"] for g in gaps)
        raise RequestError(f"{what} requires passing evals; {agent.name}@{agent.digest} has none of: {names}",
                           code="evals_required",
                           details={"agent": agent.name, "digest": agent.digest, "missing": gaps})
