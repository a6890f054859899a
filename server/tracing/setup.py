"""The tracer, built from OpenTelemetry's own environment variables, or none at all.

Tracing is on when `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
`OTEL_EXPORTER_OTLP_ENDPOINT` is set (and neither `OTEL_SDK_DISABLED=true`
nor `OTEL_TRACES_EXPORTER=none` says otherwise). Then spans go, in batches
(`OTEL_BSP_*`), to the OTLP/HTTP protobuf exporter, which reads the endpoint,
`OTEL_EXPORTER_OTLP_HEADERS`, time-out and compression itself; the sampler is
`OTEL_TRACES_SAMPLER` (the SDK reads it); the service is `OTEL_SERVICE_NAME`,
default `corral`. Without them no SDK object is built: `tracer()` is None and
every span helper returns at once.

The tracer is the process's one (OpenTelemetry's model): `configure` once
when a service opens, `shutdown` (blocking: it flushes) when it closes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from .content import configure_content

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

log = logging.getLogger("corral.tracing")

ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
SCOPE = "corral"
# The trace id the next root span takes: a turn's attempts all share the trace id of its first.
forced_trace_id: ContextVar[int | None] = ContextVar("corral_forced_trace_id", default=None)

_state: dict[str, Any] = {"tracer": None, "provider": None}


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether the environment asks for exported traces."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return any(environ.get(name, "").strip() for name in ENDPOINTS)


def configure(environ: Mapping[str, str] | None = None) -> bool:
    """Build the tracer when the environment asks for one; whether it did."""
    environ = os.environ if environ is None else environ
    configure_content(environ)
    if _state["tracer"] is not None or not wanted(environ):
        return _state["tracer"] is not None
    # imported only now: a server without the variables loads none of the SDK
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class TurnIds(RandomIdGenerator):
        """Random ids, except the trace id of a turn's later attempt: its first attempt's."""

        def generate_trace_id(self) -> int:
            return forced_trace_id.get() or super().generate_trace_id()

    service = environ.get("OTEL_SERVICE_NAME", "").strip() or "corral"
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service}), id_generator=TurnIds())
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    _state.update(provider=provider, tracer=provider.get_tracer(SCOPE))
    log.info("traces are exported over OTLP/HTTP (service %s)", service)
    return True


def tracer() -> Tracer | None:
    """The tracer, or None when traces are not exported."""
    return _state["tracer"]


def enabled() -> bool:
    return _state["tracer"] is not None


def shutdown() -> None:
    """Flush what is queued and stop exporting (blocking: run it in a thread)."""
    provider = _state["provider"]
    _state.update(provider=None, tracer=None)
    if provider is not None:
        provider.shutdown()
