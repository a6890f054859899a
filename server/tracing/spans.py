"""Span helpers: a span is opened at a call site with what it carries, and ended by its block.

    with span("execute_tool search", {"gen_ai.tool.name": "search"}) as s:
        output = await tool.call(...)
        s.outcome("error" if output.is_error else "ok")

Every span of a turn also carries the turn's own attributes (`within`: the
agent digest, the turn id...), so any one span says exactly which agent ran.
A block that raises ends its span with status error and `error.type` the
error's stable `code` (or its class name); a cancelled block is no error, its
`corral.outcome` is `cancelled`. Without a tracer (`setup`) every helper
returns a no-op `Span` at once, and the OpenTelemetry context is not touched.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import anyio

from . import setup

Attributes = Mapping[str, Any]

_turn: ContextVar[Attributes | None] = ContextVar("corral_turn_attributes", default=None)


class Span:
    """A started span (or, without a tracer, nothing): set attributes, its outcome, a failure."""

    __slots__ = ("otel",)

    def __init__(self, otel: Any = None):
        self.otel = otel

    @property
    def recording(self) -> bool:
        return self.otel is not None and self.otel.is_recording()

    def set(self, key: str, value: Any) -> None:
        if self.otel is not None and value is not None:
            self.otel.set_attribute(key, value)

    def update(self, attributes: Attributes) -> None:
        for key, value in attributes.items():
            self.set(key, value)

    def outcome(self, value: str) -> None:
        self.set("corral.outcome", value)

    def fail(self, code: str, message: str | None = None) -> None:
        """Status error, `error.type` the error code."""
        if self.otel is None:
            return
        from opentelemetry.trace import Status, StatusCode

        self.otel.set_attribute("error.type", code)
        self.otel.set_status(Status(StatusCode.ERROR, message))

    def event(self, name: str, attributes: Attributes) -> None:
        if self.otel is not None:
            self.otel.add_event(name, dict(attributes))

    @contextmanager
    def current(self) -> Iterator[None]:
        """This span is the current one inside (what outbound requests name as their parent)."""
        if self.otel is None:
            yield
            return
        from opentelemetry import context, trace

        token = context.attach(trace.set_span_in_context(self.otel))
        try:
            yield
        finally:
            context.detach(token)

    def ended_by(self, exc: BaseException) -> None:
        """The block it covered raised `exc`."""
        if isinstance(exc, anyio.get_cancelled_exc_class() | GeneratorExit):
            if self.otel is not None and self.otel.attributes.get("corral.outcome") is None:
                self.outcome("cancelled")
            return
        self.fail(str(getattr(exc, "code", "") or type(exc).__name__))

    def end(self) -> None:
        if self.otel is not None:
            self.otel.end()


NOOP = Span()


def start(name: str, attributes: Attributes, *, parent: Any = None) -> Span:
    """A started span (a child of the current one, or of `parent`, an OpenTelemetry context), not yet
    current; the caller ends it. A no-op `Span` without a tracer."""
    tracer = setup.tracer()
    if tracer is None:
        return NOOP
    base = _turn.get() or {}
    merged = {k: v for k, v in ({**base, **attributes}).items() if v is not None}
    return Span(tracer.start_span(name, context=parent, attributes=merged))


@contextmanager
def span(name: str, attributes: Attributes) -> Iterator[Span]:
    """A span over the block, current inside it."""
    opened = start(name, attributes)
    if opened is NOOP:
        yield NOOP
        return
    try:
        with opened.current():
            yield opened
    except BaseException as exc:
        opened.ended_by(exc)
        raise
    finally:
        opened.end()


def record(name: str, attributes: Attributes, started_ns: int, *, error: str | None = None) -> None:
    """A span of something that already happened, from `started_ns` (`time.time_ns()`) to now."""
    tracer = setup.tracer()
    if tracer is None:
        return
    otel = tracer.start_span(name, attributes={k: v for k, v in attributes.items() if v is not None},
                             start_time=started_ns)
    if error is not None:
        Span(otel).fail(error)
    otel.end()


@contextmanager
def within(attributes: Attributes) -> Iterator[None]:
    """Every span opened inside carries `attributes` (a turn's digest, its id...)."""
    token = _turn.set({**(_turn.get() or {}), **attributes})
    try:
        yield
    finally:
        _turn.reset(token)
