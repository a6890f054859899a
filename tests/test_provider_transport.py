"""The model providers' HTTP client reads any well-formed stream, however the server cuts it.

A real server on loopback sends chunks chosen to land on the awkward places: a CRLF split between
two chunks (a CR alone must not end a second, empty line), bare CR and LF line ends, a UTF-8
character split between chunks, and one `data:` line far longer than aiohttp's line buffer
(a large tool call's arguments arrive that way).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import anyio
import pytest
from starlette.applications import Starlette
from starlette.responses import RedirectResponse, StreamingResponse
from starlette.routing import Route

from server.canonical import freeze
from server.compiler.definitions import ModelDefinition
from server.errors import ProviderError
from server.messages import UserMessage
from server.providers import transport
from server.providers.base import Finish, ModelRequest, TextDelta, ToolCallChunk
from server.providers.openai import OpenAIProvider
from server.providers.transport import ModelHTTP
from tests.fakes import serve

pytestmark = pytest.mark.anyio
LONG = "x" * 300_000  # more than twice aiohttp's default line limit (2 x 64 KiB)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _data(delta: dict, finish: str | None = None) -> str:
    return "data: " + json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]},
                                 ensure_ascii=False)


async def _awkward(request) -> StreamingResponse:
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "save", "arguments": ""}}
    arguments = json.dumps({"text": LONG})

    async def body() -> AsyncIterator[bytes]:
        # one event whose JSON spans two data lines, the CRLF between them cut after its CR: a CR
        # taken for a line end would make the LF a blank line, ending the event at half its JSON
        head, tail = _data({"role": "assistant", "content": "héllo"}).split(', "finish_reason"')
        first = f'{head}\r\ndata: , "finish_reason"{tail}\r\n\r\n'.encode()
        cut = first.index("é".encode()) + 1
        yield first[:cut]  # the é cut in two
        yield first[cut:first.index(b"\r") + 1]
        yield first[first.index(b"\r") + 1:]
        yield (_data({"content": " wörld"}) + "\r\r").encode()  # bare CRs
        yield (_data({"tool_calls": [call]}) + "\n\n").encode()
        long = _data({"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]}).encode()
        for start in range(0, len(long), 100_000):  # one line, in a few chunks
            yield long[start:start + 100_000]
        yield b"\n\n" + (_data({}, "tool_calls") + "\n\ndata: [DONE]\n\n").encode()

    async def apart() -> AsyncIterator[bytes]:
        async for chunk in body():  # a pause after each, so the client reads them as sent, not merged
            yield chunk
            await anyio.sleep(0.005)

    return StreamingResponse(apart(), media_type="text/event-stream")


async def test_awkward_chunks_are_read_as_the_server_meant_them() -> None:
    app = Starlette(routes=[Route("/v1/chat/completions", _awkward, methods=["POST"])])
    request = ModelRequest(instructions="", messages=(UserMessage(content="hi"),))
    with serve(app) as url:
        definition = ModelDefinition(name="t", description="", digest="sha256:test", spec=freeze({}),
                                     provider="openai", model="m", base_url=url + "/v1", timeout_s=5.0)
        async with ModelHTTP(trust_env=False) as client:
            with anyio.fail_after(10):
                chunks = [c async for c in OpenAIProvider(definition, client, {}).stream(request)]
    assert "".join(c.text for c in chunks if isinstance(c, TextDelta)) == "héllo wörld"
    calls = [c for c in chunks if isinstance(c, ToolCallChunk)]
    assert [c.call.name for c in calls] == ["save"]
    assert calls[0].call.arguments["text"] == LONG
    assert isinstance(chunks[-1], Finish) and chunks[-1].stop_reason == "tool_use"


async def test_a_redirect_is_an_error_never_followed() -> None:
    """httpx never followed one; aiohttp would, with the key (`x-api-key` is not among the headers it
    drops across origins) and the whole conversation."""
    followed: list[str] = []

    async def moved(request) -> RedirectResponse:
        return RedirectResponse("/elsewhere", status_code=307)

    async def elsewhere(request) -> StreamingResponse:
        followed.append(request.headers.get("authorization", ""))
        return StreamingResponse(iter([b"data: [DONE]\n\n"]), media_type="text/event-stream")

    app = Starlette(routes=[Route("/v1/chat/completions", moved, methods=["POST"]),
                            Route("/elsewhere", elsewhere, methods=["POST", "GET"])])
    with serve(app) as url:
        definition = ModelDefinition(name="t", description="", digest="sha256:test", spec=freeze({}),
                                     provider="openai", model="m", base_url=url + "/v1", timeout_s=5.0,
                                     api_key="${CORRAL_TEST_REDIRECT_KEY}")
        async with ModelHTTP(trust_env=False) as client:
            port = OpenAIProvider(definition, client, {"CORRAL_TEST_REDIRECT_KEY": "sk-secret"})
            request = ModelRequest(instructions="", messages=(UserMessage(content="hi"),))
            with anyio.fail_after(10), pytest.raises(ProviderError) as caught:
                async for _ in port.stream(request):
                    pass
    assert (caught.value.status, caught.value.retryable) == (307, False)
    assert followed == []


def test_a_proxy_without_a_scheme_is_http(monkeypatch: pytest.MonkeyPatch) -> None:
    """`HTTPS_PROXY=proxy.corp:3128`, as httpx read it; `NO_PROXY` still exempts a host."""
    monkeypatch.setenv("HTTPS_PROXY", "proxy.corp:3128")
    monkeypatch.setenv("NO_PROXY", "models.internal")
    transport._proxy.cache_clear()
    try:
        assert transport._proxy_for("https://api.example.com/v1/chat/completions") == "http://proxy.corp:3128"
        assert transport._proxy_for("https://models.internal/v1/chat/completions") is None
    finally:
        transport._proxy.cache_clear()
