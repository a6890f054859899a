"""Retries and fallbacks, each a `ModelPort` wrapping others.

Both act only on a `ProviderError` raised before the attempt yielded anything:
once a chunk has reached the caller, running the call again would send it
twice, so the error propagates instead. `RetryingModel` retries retryable
errors `retries` times after the first attempt, waiting with exponential
backoff and jitter, or as long as the server's `Retry-After` said, never more
than `timeout_s` at a time. `FallbackModel` tries each model in turn on any
error; the last one's error propagates. Compose them as
`FallbackModel([RetryingModel(a, ...), RetryingModel(b, ...)])`.

Neither bounds the length of a whole step: a provider's own time-out fails a
call that stalls, and a long answer that keeps streaming is allowed to finish.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing

import anyio

from ..errors import ProviderError
from .base import ModelChunk, ModelPort, ModelRequest

BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 8.0


class RetryingModel:
    """`port`, with retryable errors retried before any output."""

    def __init__(
        self,
        port: ModelPort,
        retries: int,
        timeout_s: float,
        sleep: Callable[[float], Awaitable[object]] = anyio.sleep,
    ):
        self.port = port
        self.definition = port.definition
        self.retries = retries
        self.timeout_s = timeout_s
        self._sleep = sleep

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        attempt = 0
        while True:
            started = False
            try:
                async with aclosing(self.port.stream(request)) as chunks:
                    async for chunk in chunks:
                        started = True
                        yield chunk
                return
            except ProviderError as error:
                if started or not error.retryable or attempt >= self.retries:
                    raise
                await self._sleep(self.delay(attempt, error))
                attempt += 1

    def delay(self, attempt: int, error: ProviderError) -> float:
        """Seconds to wait before retry number `attempt + 1`."""
        if error.retry_after is not None:
            return min(error.retry_after, self.timeout_s)
        backoff = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2**attempt)
        # Half fixed, half random: clients that failed together do not retry together.
        return min(backoff / 2 + random.uniform(0, backoff / 2), self.timeout_s)


class FallbackModel:
    """The first of `ports` that answers; the next one is tried when one fails before any output."""

    def __init__(self, ports: Sequence[ModelPort]):
        if not ports:
            raise ValueError("FallbackModel needs at least one model")
        self.ports = tuple(ports)
        self.definition = self.ports[0].definition

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        for index, port in enumerate(self.ports):
            started = False
            try:
                async with aclosing(port.stream(request)) as chunks:
                    async for chunk in chunks:
                        started = True
                        yield chunk
                return
            except ProviderError:
                if started or index == len(self.ports) - 1:
                    raise
