"""A model port wrapped so that every request it makes is counted (`corral_model_requests_total`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

from ..metrics import Counter
from .base import ModelChunk, ModelPort, ModelRequest


class CountedModel:
    """`port`, with every request it makes counted by provider and outcome (`ok` / `error`)."""

    def __init__(self, port: ModelPort, counter: Counter):
        self.port = port
        self.definition = port.definition
        self.counter = counter

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        outcome = "error"
        try:
            async with aclosing(self.port.stream(request)) as chunks:
                async for chunk in chunks:
                    yield chunk
            outcome = "ok"
        finally:
            self.counter.inc(self.definition.provider, outcome)
