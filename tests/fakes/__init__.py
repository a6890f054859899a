"""Fakes for tests: model servers that speak the real wire protocols on loopback.

fake = FakeOpenAI()
with serve(fake.app) as url:          # a real uvicorn on 127.0.0.1
    fake.script(Status(429, retry_after="0"), Reply(text="hello"))
    ...                               # point a provider at f"{url}/v1"
    fake.requests                     # every body and header received
"""

from .anthropic_server import FakeAnthropic
from .openai_server import FakeOpenAI
from .scenarios import Call, Cut, Malformed, Recorded, Reply, Scenario, Stall, Status, StreamError
from .uvicorn_thread import serve

__all__ = [
    "Call",
    "Cut",
    "FakeAnthropic",
    "FakeOpenAI",
    "Malformed",
    "Recorded",
    "Reply",
    "Scenario",
    "Stall",
    "Status",
    "StreamError",
    "serve",
]
