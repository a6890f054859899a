"""W3C trace context in and out: `traceparent` (with `tracestate`) on HTTP, in MCP `_meta`, in the
environment of commands.

In: `InboundTrace`, an ASGI middleware, makes a request's `traceparent` header the current
context while the request runs, so a turn it starts is that trace's child (`turns.TurnTrace`);
`context_from_meta` reads the same from an MCP request's `_meta`. Out: whatever span is current
(a turn's, a model request's, a tool call's) is named in `traceparent` on outbound HTTP requests
(`inject_httpx`, an httpx request hook: http tools, http hooks; the model providers' aiohttp client
adds `carrier()` itself), in the
`_meta` of MCP calls (`trace_meta`) and as `TRACEPARENT`/`TRACESTATE` for command tools and hooks
(`trace_environment`). Outside a turn nothing is added. A header the definition set itself is kept.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import context, trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

W3C = TraceContextTextMapPropagator()
HEADERS = ("traceparent", "tracestate")


def carrier() -> dict[str, str]:
    """`traceparent` (and `tracestate`) of the current span; empty when there is none."""
    out: dict[str, str] = {}
    W3C.inject(out)
    return out


async def inject_httpx(request: Any) -> None:
    """httpx request hook: the current span's trace context, unless the request names one."""
    if "traceparent" in request.headers:
        return
    for name, value in carrier().items():
        request.headers[name] = value


def trace_environment() -> dict[str, str]:
    """`TRACEPARENT` and `TRACESTATE` for a child process (the convention of OpenTelemetry's
    environment-variable carriers); empty outside a span."""
    return {name.upper(): value for name, value in carrier().items()}


def trace_meta() -> dict[str, str]:
    """`traceparent` and `tracestate` for an MCP request's `_meta`; empty outside a span."""
    return carrier()


def extract(values: Mapping[str, Any]) -> Any:
    """The OpenTelemetry context `values` (`traceparent`, `tracestate`) name, or None if they name none."""
    found = {k: v for k in HEADERS if isinstance(v := values.get(k), str)}
    if "traceparent" not in found:
        return None
    extracted = W3C.extract(found)
    return extracted if trace.get_current_span(extracted).get_span_context().is_valid else None


def context_from_meta(meta: Mapping[str, Any] | None) -> Any:
    """The trace context of an MCP request's `_meta`, or None."""
    return extract(meta) if isinstance(meta, Mapping) else None


@contextmanager
def adopted(found: Any) -> Iterator[None]:
    """`found` (an extracted context, or None: nothing changes) is the current context inside."""
    if found is None:
        yield
        return
    token = context.attach(found)
    try:
        yield
    finally:
        context.detach(token)


class InboundTrace:
    """ASGI middleware: a request's `traceparent` is the current trace context while it runs."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]
                   if k.lower() in (b"traceparent", b"tracestate")}
        with adopted(extract(headers) if headers else None):
            return await self.app(scope, receive, send)
