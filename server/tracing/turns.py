"""A turn's trace: the trace id it keeps on every attempt, and the span of each attempt.

A new turn takes the trace of the request that started it (its `traceparent`,
made current by `propagation`), or a new trace id. `TurnTrace.fields()` are
committed in the turn's `turn.started` event, so an attempt that resumes the
turn after a crash, on any replica, reads them back (`TurnTrace.of_event`)
and opens its `invoke_agent` span in the same trace, under the same remote
parent. Without a tracer the trace id is kept all the same (the turn's
`trace_id`, and what outbound `traceparent`s name) and no span is built.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

from opentelemetry import context, trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from . import setup
from .content import Redact, redacting
from .propagation import W3C, extract
from .spans import NOOP, Span, span, start, within

Outcome = Callable[[], tuple[str, str | None]]  # (corral.outcome, error code or None) once it ended


@dataclass(frozen=True)
class TurnTrace:
    trace_id: str  # 32 hex digits
    parent: str | None = None  # the `traceparent` the turn came with, if any
    state: str | None = None  # ... and its `tracestate`

    @classmethod
    def begin(cls) -> TurnTrace:
        """The trace of a new turn: the current (inbound) one, or a new trace id."""
        current = trace.get_current_span().get_span_context()
        if not current.is_valid:
            return cls(f"{random.getrandbits(128) or 1:032x}")
        inbound: dict[str, str] = {}
        W3C.inject(inbound)
        return cls(f"{current.trace_id:032x}", inbound.get("traceparent"), inbound.get("tracestate") or None)

    @classmethod
    def of_event(cls, data: Mapping[str, Any]) -> TurnTrace | None:
        """The trace a `turn.started` event recorded (None for a turn from before traces)."""
        trace_id = data.get("trace_id")
        if not isinstance(trace_id, str) or len(trace_id) != 32:
            return None
        return cls(trace_id, data.get("traceparent"), data.get("tracestate"))

    def fields(self) -> dict[str, str]:
        """What `turn.started` records of it."""
        out = {"trace_id": self.trace_id}
        if self.parent:
            out["traceparent"] = self.parent
            if self.state:
                out["tracestate"] = self.state
        return out

    def parent_context(self) -> Any:
        """The OpenTelemetry context an attempt's span is a child of: the remote parent, or none."""
        found = extract({"traceparent": self.parent, "tracestate": self.state}) if self.parent else None
        return found if found is not None else context.Context()

    def placeholder(self) -> NonRecordingSpan:
        """Without a tracer: the span outbound requests name, so the trace goes on downstream."""
        if self.parent:
            inherited = trace.get_current_span(self.parent_context())
            if isinstance(inherited, NonRecordingSpan):
                return inherited
        return NonRecordingSpan(SpanContext(int(self.trace_id, 16), random.getrandbits(64) or 1,
                                            is_remote=False, trace_flags=TraceFlags(0)))


@asynccontextmanager
async def attempt(turn_trace: TurnTrace, name: str, attributes: Mapping[str, Any], *, outcome: Outcome,
                  redact: Redact | None = None) -> AsyncIterator[Span]:
    """The `invoke_agent` span of one attempt of a turn, current inside (its children's parent);
    `outcome` says how the attempt ended, read when the block ends."""
    with within(_inherited(attributes)), redacting(redact):
        if setup.tracer() is None:
            token = context.attach(trace.set_span_in_context(turn_trace.placeholder()))
            try:
                yield NOOP
            finally:
                context.detach(token)
            return
        forced = setup.forced_trace_id.set(int(turn_trace.trace_id, 16))
        try:
            opened = start(name, attributes, parent=turn_trace.parent_context())
        finally:
            setup.forced_trace_id.reset(forced)
        try:
            with opened.current():
                yield opened
            settle(opened, *outcome())
        except BaseException as exc:
            opened.ended_by(exc)
            raise
        finally:
            opened.end()


def settle(opened: Span, value: str, code: str | None) -> None:
    opened.outcome(value)
    if code is not None:
        opened.fail(code)


@contextmanager
def agent(name: str, attributes: Mapping[str, Any]) -> Iterator[Span]:
    """The `invoke_agent` span of a sub-agent's turn, under the tool call that runs it."""
    with within(_inherited(attributes)), span(name, attributes) as opened:
        yield opened


def _inherited(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """What every span inside an agent's turn carries: which agent (by digest) and which turn."""
    keys = ("gen_ai.agent.name", "corral.agent.digest", "corral.turn.id", "gen_ai.conversation.id")
    return {k: attributes[k] for k in keys if k in attributes}
