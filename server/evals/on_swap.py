"""`corral serve --eval-on-swap` (§12): after each applied swap, the affected Evals run in the background.

Affected: every Eval of an agent the swap added or changed, and every Eval it
added or changed, each on its agent's new current digest. The runs start in
the runs' own task group, so the swap report (returned, logged, published)
waits for none of them; `eval.finished` says how each did. A swap this
replica applied because another replica told it to (`trigger` "replica …")
runs nothing: the replica where it began runs them once.
"""

from __future__ import annotations

from ..deployment.reports import SwapReport
from .runs import EvalRuns


def affected(evals: EvalRuns, report: SwapReport) -> list[str]:
    """The names of the Evals to run after `report`, each once, sorted."""
    current = evals.registry.current
    names: set[str] = set()
    for change in report.changes:
        if change.change == "removed":
            continue
        if change.kind == "Agent":
            names |= {e.name for e in current.evals(change.name)}
        elif change.kind == "Eval":
            names.add(change.name)
    return sorted(names)


def eval_on_swap(evals: EvalRuns):
    """A swap listener that starts the affected Evals without waiting for them."""

    async def on_swap(report: SwapReport) -> None:
        if report.status == "applied" and not report.trigger.startswith("replica "):
            evals.start_soon(affected(evals, report))

    return on_swap
