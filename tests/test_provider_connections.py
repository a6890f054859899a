"""Providers give their connection back: a finished reply reuses it for the next call.

A stream closed as soon as the reply is whole (at `[DONE]` or `message_stop`)
would drop its connection, and every model call would pay a new TCP (and,
against a real provider, TLS) handshake. The providers read the stream to its
end instead; a server that keeps it open after the end is given up on after
`DRAIN_S`, and the reply still counts.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route

from server.canonical import freeze
from server.compiler.definitions import ModelDefinition
from server.messages import UserMessage
from server.providers.anthropic import AnthropicProvider
from server.providers.base import Finish, ModelRequest, TextDelta
from server.providers.openai import OpenAIProvider
from server.providers.transport import ModelHTTP
from server.providers.wire import DRAIN_S
from tests.fakes import FakeAnthropic, FakeOpenAI, Reply, serve

pytestmark = pytest.mark.anyio
HELLO = ModelRequest(instructions="", messages=(UserMessage(content="hi"),))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class ClientPorts:
    """ASGI wrapper: the client port of every HTTP request, in order."""

    def __init__(self, app: Any):
        self.app = app
        self.ports: list[int] = []

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            self.ports.append(scope["client"][1])
        await self.app(scope, receive, send)


def _provider(kind: str, base_url: str, client: ModelHTTP):
    definition = ModelDefinition(
        name=f"{kind}-test", description="", digest="sha256:test", spec=freeze({}), provider=kind,
        model="m", base_url=base_url, timeout_s=5.0,
    )
    adapter = OpenAIProvider if kind == "openai" else AnthropicProvider
    return adapter(definition, client, {})


async def _text(port) -> tuple[str, list[Any]]:
    with anyio.fail_after(10):
        chunks = [chunk async for chunk in port.stream(HELLO)]
    return "".join(c.text for c in chunks if isinstance(c, TextDelta)), chunks


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_consecutive_calls_share_one_connection(kind: str) -> None:
    fake = FakeOpenAI() if kind == "openai" else FakeAnthropic()
    fake.script(*[Reply(text=f"answer {n}") for n in range(3)])
    recorder = ClientPorts(fake.app)
    with serve(recorder) as url:
        async with ModelHTTP(trust_env=False) as client:
            port = _provider(kind, url + ("/v1" if kind == "openai" else ""), client)
            answers = [(await _text(port))[0] for _ in range(3)]
    assert answers == ["answer 0", "answer 1", "answer 2"]
    assert len(recorder.ports) == 3
    assert len(set(recorder.ports)) == 1, f"a new connection per call: client ports {recorder.ports}"


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    import json

    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return f"data: {json.dumps({'choices': [choice]})}\n\n".encode()


async def _open_after_done(request) -> StreamingResponse:
    async def body() -> AsyncIterator[bytes]:
        yield _chunk({"role": "assistant", "content": "whole"})
        yield _chunk({}, "stop")
        yield b"data: [DONE]\n\n"
        yield b": still here\n\n"
        await anyio.sleep(30)  # never ends by itself; cancelled when the client leaves

    return StreamingResponse(body(), media_type="text/event-stream")


async def test_stream_left_open_after_done_still_completes() -> None:
    app = Starlette(routes=[Route("/v1/chat/completions", _open_after_done, methods=["POST"])])
    with serve(app, graceful_s=0.5) as url:
        async with ModelHTTP(trust_env=False) as client:
            started = time.monotonic()
            text, chunks = await _text(_provider("openai", url + "/v1", client))
            elapsed = time.monotonic() - started
    assert text == "whole"
    assert isinstance(chunks[-1], Finish) and chunks[-1].stop_reason == "end_turn"
    assert elapsed < DRAIN_S + 3
