"""A model port wrapped so that every request it makes is a `chat {model}` span.

Inside the retries and fallbacks (as `CountedModel`): each request a provider
saw is a span of its own, with the model, the tokens it reported, its finish
reason, and a failure's error code. The span is current only while the
provider is asked for its next chunk, so the request it sends names it in
`traceparent`, and nothing leaks into the caller's context between chunks.
With content capture on (`tracing.content`), the request's messages and the
reply, redacted. Without a tracer the port is returned unwrapped.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

from .. import tracing
from ..tracing import content, names, spans
from .base import Finish, ModelChunk, ModelPort, ModelRequest, TextDelta, ToolCallChunk, UsageChunk

FINISH_REASONS = {"end_turn": "stop", "tool_use": "tool_calls", "max_tokens": "length"}


def traced(port: ModelPort) -> ModelPort:
    """`port`, traced when traces are exported."""
    return TracedModel(port) if tracing.enabled() else port


class TracedModel:
    def __init__(self, port: ModelPort):
        self.port = port
        self.definition = port.definition

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        model = self.definition
        span = spans.start(*names.chat(model.provider, model.model or model.name, model.name))
        if content.capture_content() and span.recording:
            span.set("gen_ai.system_instructions", content.system_instructions(request.instructions))
            span.set("gen_ai.input.messages", content.input_messages(request.messages))
        reply = _Reply()
        try:
            async with aclosing(self.port.stream(request)) as chunks:
                while True:
                    with span.current():  # the provider's HTTP request names this span as its parent
                        try:
                            chunk = await anext(chunks)
                        except StopAsyncIteration:
                            break
                    reply.add(chunk, span)
                    yield chunk
        except BaseException as exc:
            span.ended_by(exc)
            raise
        finally:
            reply.close(span)
            span.end()


class _Reply:
    """What the span learns from the chunks of one request."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls: list = []
        self.input = self.output = 0
        self.counted = False  # the provider reported usage
        self.finish: str | None = None

    def add(self, chunk: ModelChunk, span: tracing.Span) -> None:
        if isinstance(chunk, UsageChunk):
            self.counted = True
            self.input += chunk.usage.input_tokens
            self.output += chunk.usage.output_tokens
        elif isinstance(chunk, Finish):
            self.finish = FINISH_REASONS.get(chunk.stop_reason, chunk.stop_reason)
        elif isinstance(chunk, TextDelta):
            self.text.append(chunk.text)
        elif isinstance(chunk, ToolCallChunk):
            self.calls.append(chunk.call)

    def close(self, span: tracing.Span) -> None:
        if self.counted:
            span.set("gen_ai.usage.input_tokens", self.input)
            span.set("gen_ai.usage.output_tokens", self.output)
        if self.finish is not None:
            span.set("gen_ai.response.finish_reasons", (self.finish,))
            if content.capture_content() and span.recording:
                span.set("gen_ai.output.messages", content.output_messages("".join(self.text), self.calls,
                                                                           self.finish))
