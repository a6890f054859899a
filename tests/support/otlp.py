"""A real OTLP/HTTP trace receiver on loopback, as a collector would be: what Corral exported.

    with OtlpReceiver() as receiver:            # POST {receiver.url}/v1/traces, protobuf (gzip too)
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "50"}
        ...
        spans = receiver.wait(lambda spans: any(s.name == "invoke_agent a" for s in spans))
        receiver.requests                        # how many export requests arrived

Each request's body is decoded with `opentelemetry-proto` (`ExportTraceServiceRequest`), and
every span is kept as a plain `ReceivedSpan`: ids in hex, attributes as Python values. Waits are on
a condition, bounded; a test never sleeps for an export.
"""

from __future__ import annotations

import gzip
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

STATUS_ERROR = 2  # opentelemetry.proto.trace.v1.Status.STATUS_CODE_ERROR


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root span
    attributes: dict[str, Any]
    status: int  # 0 unset, 1 ok, 2 error
    status_message: str
    resource: dict[str, Any]
    start_ns: int
    end_ns: int
    events: tuple[str, ...] = field(default=())

    @property
    def failed(self) -> bool:
        return self.status == STATUS_ERROR


def value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return tuple(value(x) for x in v.array_value.values)
    if kind == "kvlist_value":
        return {kv.key: value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


def decode(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = {kv.key: value(kv.value) for kv in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                spans.append(ReceivedSpan(
                    name=s.name, trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                    parent_span_id=s.parent_span_id.hex(),
                    attributes={kv.key: value(kv.value) for kv in s.attributes},
                    status=s.status.code, status_message=s.status.message, resource=resource,
                    start_ns=s.start_time_unix_nano, end_ns=s.end_time_unix_nano,
                    events=tuple(e.name for e in s.events)))
    return spans


class OtlpReceiver:
    """An HTTP server on 127.0.0.1 (a free port) that takes `POST /v1/traces` and keeps the spans."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self.paths: list[str] = []
        self._changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                encoding = (self.headers.get("content-encoding") or "").lower()
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                spans = decode(body) if self.path == "/v1/traces" else []
                with receiver._changed:
                    receiver.requests += 1
                    receiver.paths.append(self.path)
                    receiver.spans.extend(spans)
                    receiver._changed.notify_all()
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def wait(self, done: Callable[[list[ReceivedSpan]], bool], timeout_s: float = 30.0) -> list[ReceivedSpan]:
        """Every span received, once `done` accepts them; raises AssertionError when time runs out."""
        with self._changed:
            if not self._changed.wait_for(lambda: done(list(self.spans)), timeout_s):
                names = sorted({s.name for s in self.spans})
                raise AssertionError(f"the spans received within {timeout_s}s do not match: {names}")
            return list(self.spans)

    def __enter__(self) -> OtlpReceiver:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def env(receiver: OtlpReceiver, **more: str) -> dict[str, str]:
    """The variables that make a Corral export to `receiver`, in small batches soon."""
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "50", **more}


def by_name(spans: list[ReceivedSpan], name: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.name == name]
