"""The spans of a turn, as the run stage opens them: an attempt, a tool call, a sub-agent's turn.

The call sites stay one line each (`async with attempt_span(...)`, `with tool_span(...)`); what
a span carries and how an outcome reads is decided here, from the run stage's own values.

The hooks that run inside a tool call are also noted (`note_hook`) for its `tool.finished` event
(`ToolSpan.hooks`), so a turn's steps show them from what it commits anyway (`steps`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from .. import tracing
from ..clock import iso
from ..messages import ToolCall
from ..tools.base import ToolContext, ToolOutput, for_call
from ..tracing import content, names
from .active_turn import ActiveTurn, Completed, Failed

if TYPE_CHECKING:
    from ..tools.confinement import Redactor


def outcome_of(active: ActiveTurn) -> tuple[str, str | None]:
    """How an attempt ended, as its span says: `corral.outcome` and the error code of a failure."""
    if active.stopped is not None:  # it goes on elsewhere (handed over, or taken over)
        return active.stopped, None
    match active.outcome:
        case Completed():
            return "completed", None
        case Failed(error=error):
            return "failed", str(error.get("code") or "internal")
        case _:
            return "cancelled", None


def attempt_span(trace: tracing.TurnTrace, active: ActiveTurn, redactor: Redactor):
    """The `invoke_agent` span of this attempt of `active`'s turn (current inside)."""
    turn = active.record
    name, attributes = names.invoke_agent(turn.agent, turn.digest, turn.conversation_id, turn.id,
                                          turn.attempts)
    return tracing.attempt(trace, name, attributes, outcome=lambda: outcome_of(active), redact=redactor.text)


_hook_runs: ContextVar[list[dict[str, Any]] | None] = ContextVar("corral_hook_runs", default=None)


def note_hook(name: str, event: str, started: float, ended: float, outcome: str) -> None:
    """A hook ran (inside a tool call: its `tool.finished` lists it)."""
    runs = _hook_runs.get()
    if runs is not None:
        runs.append({"name": name, "event": event, "started_at": iso(started), "ended_at": iso(ended),
                     "outcome": outcome})


class ToolSpan:
    def __init__(self, span: tracing.Span, hooks: list[dict[str, Any]]):
        self.span = span
        self.hooks = hooks  # the hooks that ran for this call, as `tool.finished` lists them

    def finished(self, output: ToolOutput, unknown: bool) -> None:
        self.span.outcome("unknown" if unknown else "error" if output.is_error else "ok")
        if output.is_error:
            self.span.fail("tool_error")
        if content.capture_content() and self.span.recording:
            self.span.set("gen_ai.tool.call.result", content.value(output.content))


@contextmanager
def tool_span(ctx: ToolContext, call: ToolCall) -> Iterator[ToolSpan]:
    """The `execute_tool` span of one call: its hooks, permission wait and the tool itself inside."""
    hooks: list[dict[str, Any]] = []
    token = _hook_runs.set(hooks)
    try:
        if not tracing.enabled():
            yield ToolSpan(tracing.spans.NOOP, hooks)
            return
        key = for_call(ctx, call.id).execution_key
        with tracing.span(*names.execute_tool(call.name, call.id, "function", key)) as span:
            if content.capture_content() and span.recording:
                span.set("gen_ai.tool.call.arguments", content.value(call.to_json()["arguments"]))
            yield ToolSpan(span, hooks)
    finally:
        _hook_runs.reset(token)


def sub_agent_span(name: str, digest: str, ctx: ToolContext) -> Any:
    """The `invoke_agent` span of a sub-agent's turn, a child of the tool call that runs it."""
    return tracing.agent(*names.invoke_agent(name, digest, ctx.conversation_id, ctx.turn_id))
