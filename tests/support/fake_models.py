"""The fake model servers a test module shares, and a client that checks they were all asked.

    fakes = Fakes()                          # module-scoped: one FakeOpenAI, one FakeAnthropic
    async with fakes.client(base_url) as c:  # resets both; afterwards, every scripted reply was used
        ...
    async with checked_client(base_url, fake) as c:  # the same for any fakes a module holds
        ...
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx

from tests.fakes import FakeAnthropic, FakeOpenAI


@asynccontextmanager
async def checked_client(base_url: str,
                         *fakes: FakeOpenAI | FakeAnthropic) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the Corral at `base_url`, with the fakes' scripts cleared first and used up after."""
    for fake in fakes:
        fake.reset()
    async with httpx.AsyncClient(base_url=base_url, timeout=20, trust_env=False) as http:
        yield http
    assert all(fake.pending == 0 for fake in fakes), "a scripted scenario was never asked for"


class Fakes:
    def __init__(self, openai: FakeOpenAI | None = None) -> None:
        self.openai = openai if openai is not None else FakeOpenAI()
        self.anthropic = FakeAnthropic()

    def client(self, base_url: str):
        """`checked_client` over both fakes."""
        return checked_client(base_url, self.openai, self.anthropic)
