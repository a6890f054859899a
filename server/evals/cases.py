"""One run of one eval case: a fresh conversation on the exact agent digest, then its checks (§12).

The conversation is created on `NAME@DIGEST`, archived at once (an eval's
conversations stay out of the everyday lists) and marked in its metadata
`{"corral_eval": {"eval", "run_id", "case"}}`. Each input is one turn,
through the runtime's public `Conversations` API as any client's would be.
The case's `tool_results` stand in for its tools for that conversation only.

`error` apart from `failed`: a turn that fails because something could not
answer (a model, the store, the server stopping) or a judge that cannot be
reached leaves the case unjudged (`CaseRun.error`); a turn that fails because
of the agent (too many steps, its budget, a malformed answer) is a failure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..canonical import thaw
from ..errors import CorralError
from ..messages import AssistantMessage, Usage
from ..runtime.active_turn import TurnResult
from ..runtime.conversations import Conversations
from .checks import Call, Observed, failures
from .judge import Judge
from .stand_ins import EvalStandIns

# A turn that failed with one of these tells nothing about the agent: the case could not be judged.
UNJUDGED = frozenset({"model_error", "storage_error", "interrupted", "internal", "overloaded"})


@dataclass
class CaseRun:
    conversation_id: str | None = None
    failures: list[str] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.error is None and not self.failures


@dataclass(frozen=True)
class CaseContext:
    """What every case of one run shares."""

    conversations: Conversations
    agent_ref: str  # NAME@DIGEST
    eval: str
    run_id: str
    stand_ins: EvalStandIns
    judge: Judge | None


async def run_case(ctx: CaseContext, case: Mapping[str, Any]) -> CaseRun:
    out = CaseRun()
    try:
        results = await _converse(ctx, case, out)
    except CorralError as exc:
        out.error = f"{exc.code}: {exc.message}"
        return out
    calls = tuple(Call(c.name, thaw(c.arguments)) for r in results for m in r.messages
                  if isinstance(m, AssistantMessage) for c in m.tool_calls)
    steps = sum(1 for r in results for m in r.messages if isinstance(m, AssistantMessage))
    last = results[-1]
    if not last.completed:
        error = last.failure()
        if error.get("code") in UNJUDGED:
            out.error = f"{error.get('code')}: {error.get('message')}"
            return out
        out.failures.append(f"the turn failed: {error.get('code')}: {error.get('message')}")
    seen = Observed(calls=calls, answer=last.output or "", steps=steps,
                    tokens=out.usage.input_tokens + out.usage.output_tokens)
    out.failures += failures(case["expect"], seen)
    rubric = case["expect"].get("rubric")
    if rubric is not None and last.completed and ctx.judge is not None:
        await _grade(ctx.judge, rubric, seen.answer, out)
    return out


async def _converse(ctx: CaseContext, case: Mapping[str, Any], out: CaseRun) -> list[TurnResult]:
    """Each input as one turn, in order, until one does not complete."""
    mark = {"corral_eval": {"eval": ctx.eval, "run_id": ctx.run_id, "case": case["name"]}}
    created = await ctx.conversations.create(ctx.agent_ref, f"eval {ctx.eval}: {case['name']}", mark)
    out.conversation_id = created.id
    await ctx.conversations.update(created.id, archived=True)
    results: list[TurnResult] = []
    with ctx.stand_ins.given(created.id, case.get("tool_results") or {}):
        for text in case["input"]:
            turn = await ctx.conversations.send(created.id, text)
            result = await ctx.conversations.result(turn)
            used = result.usage or {}
            out.usage = out.usage + Usage(int(used.get("input_tokens", 0)), int(used.get("output_tokens", 0)))
            results.append(result)
            if not result.completed:
                break
    return results


async def _grade(judge: Judge, rubric: str, answer: str, out: CaseRun) -> None:
    try:
        verdict = await judge.grade(rubric, answer)
    except CorralError as exc:  # a ProviderError: the judge could not be asked
        out.error = f"the judge could not grade: {exc.code}: {exc.message}"
        return
    out.usage = out.usage + verdict.usage
    if not verdict.passed:
        out.failures.append(f"rubric not met: {verdict.reason}" if verdict.understood else verdict.reason)
