"""Traces: OpenTelemetry spans of every turn, W3C trace context in and out.

What it is responsible for: building the tracer from OpenTelemetry's own
environment variables (`setup`; nothing is built and nothing is sent without
them), the spans of a turn with the GenAI semantic-convention names and
Corral's `corral.*` attributes (`spans`, `names`), each turn's trace
context (`turns`: the trace id a turn keeps on every attempt, on whichever
replica), W3C `traceparent` in and out (`propagation`), and message content
in spans, only on the standard opt-in and redacted (`content`).

What it is not: it knows no turn, tool or model; the stages above call it at
their call sites (`with span(...)`) and pass what a span carries. Steps of a
turn (`GET …/turns/{turn_id}`) are read from the turn's events, not from here.
"""

from .content import capture_content
from .propagation import (
    InboundTrace,
    adopted,
    carrier,
    context_from_meta,
    inject_httpx,
    trace_environment,
    trace_meta,
)
from .setup import configure, enabled, shutdown
from .spans import Span, span, within
from .turns import TurnTrace, agent, attempt

__all__ = [
    "InboundTrace",
    "Span",
    "TurnTrace",
    "adopted",
    "agent",
    "attempt",
    "capture_content",
    "carrier",
    "configure",
    "context_from_meta",
    "enabled",
    "inject_httpx",
    "shutdown",
    "span",
    "trace_environment",
    "trace_meta",
    "within",
]
