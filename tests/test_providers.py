"""Model providers against fake servers speaking the real wire protocols on loopback.

Most cases run over both wires (OpenAI chat completions and Anthropic
Messages); the retries and fallbacks wrap real providers, and their waits are
recorded, not slept.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import pytest

from server.canonical import freeze
from server.compiler.definitions import ModelDefinition
from server.messages import AssistantMessage, ToolCall, ToolResultMessage, ToolSpec, Usage, UserMessage
from server.providers.anthropic import AnthropicProvider
from server.providers.base import (
    Finish,
    ModelChunk,
    ModelPort,
    ModelRequest,
    ProviderError,
    TextDelta,
    ToolCallChunk,
    UsageChunk,
)
from server.providers.openai import OpenAIProvider
from server.providers.resilience import FallbackModel, RetryingModel
from server.providers.transport import ModelHTTP
from server.providers.wire import retry_after
from tests.fakes import (
    Call,
    Cut,
    FakeAnthropic,
    FakeOpenAI,
    Malformed,
    Reply,
    Stall,
    Status,
    StreamError,
    serve,
)

pytestmark = pytest.mark.anyio

SECRET = "sk-test-0123456789-do-not-leak"
ENVIRON = {"CORRAL_TEST_KEY": SECRET}
HELLO = ModelRequest(instructions="Be brief.", messages=(UserMessage(content="hi"),))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Wire:
    """One provider kind and its fake server."""

    kind: str
    fake: Any
    base_url: str

    def provider(self, client: ModelHTTP, environ: Any = ENVIRON, **fields: Any) -> ModelPort:
        fields = {"api_key": "${CORRAL_TEST_KEY}", "timeout_s": 5.0, "base_url": self.base_url} | fields
        definition = ModelDefinition(
            name=f"{self.kind}-test",
            description="",
            digest="sha256:test",
            spec=freeze({}),
            provider=self.kind,
            model=f"{self.kind}-model",
            **fields,
        )
        adapter = OpenAIProvider if self.kind == "openai" else AnthropicProvider
        return adapter(definition, client, environ)


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, Wire]]:
    openai, anthropic = FakeOpenAI(), FakeAnthropic()
    with serve(openai.app) as openai_url, serve(anthropic.app) as anthropic_url:
        yield {
            "openai": Wire("openai", openai, openai_url + "/v1"),
            "anthropic": Wire("anthropic", anthropic, anthropic_url),
        }


@pytest.fixture(params=["openai", "anthropic"])
def wire(request: pytest.FixtureRequest, servers: dict[str, Wire]) -> Wire:
    servers[request.param].fake.reset()
    return servers[request.param]


@pytest.fixture
def openai(servers: dict[str, Wire]) -> Wire:
    servers["openai"].fake.reset()
    return servers["openai"]


@pytest.fixture
def anthropic(servers: dict[str, Wire]) -> Wire:
    servers["anthropic"].fake.reset()
    return servers["anthropic"]


@pytest.fixture
async def client() -> Any:
    async with ModelHTTP(trust_env=False) as http:
        yield http


async def collect(port: ModelPort, request: ModelRequest = HELLO) -> list[ModelChunk]:
    with anyio.fail_after(10):
        return [chunk async for chunk in port.stream(request)]


async def failure(port: ModelPort, request: ModelRequest = HELLO) -> tuple[ProviderError, list[ModelChunk]]:
    """The error `port` ends with, and what it yielded before."""
    seen: list[ModelChunk] = []
    with anyio.fail_after(10), pytest.raises(ProviderError) as caught:
        async for chunk in port.stream(request):
            seen.append(chunk)
    return caught.value, seen


def text_of(chunks: list[ModelChunk]) -> str:
    return "".join(c.text for c in chunks if isinstance(c, TextDelta))


class Sleeps(list):
    """A `sleep` for RetryingModel that records how long it was told to wait."""

    async def __call__(self, seconds: float) -> None:
        self.append(seconds)


# -- streaming replies ---------------------------------------------------------------------------


async def test_text_reply_streams_in_chunks_with_usage(wire: Wire, client: ModelHTTP) -> None:
    wire.fake.script(Reply(text="Hello there, world!", chunks=3, usage=(12, 7)))
    chunks = await collect(wire.provider(client))
    deltas = [c for c in chunks if isinstance(c, TextDelta)]
    assert len(deltas) == 3
    assert text_of(chunks) == "Hello there, world!"
    assert chunks[-2:] == [UsageChunk(Usage(12, 7)), Finish("end_turn")]


async def test_tool_calls_assembled_from_split_arguments(wire: Wire, client: ModelHTTP) -> None:
    weather = Call("get_weather", {"city": "Paris", "days": [1, 2], "unit": "°C"}, id="call_7", pieces=6)
    clock = Call("get_time", {"zone": "Europe/Paris"}, id="call_8", pieces=4)
    wire.fake.script(Reply(text="Let me check.", calls=(weather, clock)))
    chunks = await collect(wire.provider(client))
    calls = [c.call for c in chunks if isinstance(c, ToolCallChunk)]
    assert calls == [
        ToolCall(
            id="call_7", name="get_weather", arguments=freeze({"city": "Paris", "days": [1, 2], "unit": "°C"})
        ),
        ToolCall(id="call_8", name="get_time", arguments=freeze({"zone": "Europe/Paris"})),
    ]
    assert text_of(chunks) == "Let me check."
    assert chunks[-1] == Finish("tool_use")


async def test_unparseable_arguments_pass_through_as_text(wire: Wire, client: ModelHTTP) -> None:
    wire.fake.script(Reply(calls=(Call("broken", raw='{"city": "Par', pieces=2),)))
    chunks = await collect(wire.provider(client))
    (call,) = [c.call for c in chunks if isinstance(c, ToolCallChunk)]
    assert call.arguments == '{"city": "Par'


async def test_length_limit_maps_to_max_tokens(wire: Wire, client: ModelHTTP) -> None:
    wire.fake.script(Reply(text="cut sho", stop="length" if wire.kind == "openai" else "max_tokens"))
    chunks = await collect(wire.provider(client))
    assert chunks[-1] == Finish("max_tokens")


# -- failures ------------------------------------------------------------------------------------


async def test_stalled_stream_times_out_retryable(wire: Wire, client: ModelHTTP) -> None:
    wire.fake.script(Stall(text="partial answer"))
    error, seen = await failure(wire.provider(client, timeout_s=0.5))
    assert error.retryable
    assert "timed out" in error.message
    assert text_of(seen) and "partial answer".startswith(text_of(seen))


async def test_malformed_chunk_is_a_retryable_error(wire: Wire, client: ModelHTTP) -> None:
    wire.fake.script(Malformed())
    error, _ = await failure(wire.provider(client))
    assert error.retryable
    assert "malformed chunk" in error.message


async def test_stream_closed_early_is_an_error(wire: Wire, client: ModelHTTP) -> None:
    wire.fake.script(Cut(text="half of it"))
    error, seen = await failure(wire.provider(client))
    assert error.retryable
    assert "ended before" in error.message
    assert not [c for c in seen if isinstance(c, Finish)]


async def test_client_errors_are_not_retryable(wire: Wire, client: ModelHTTP) -> None:
    wire.fake.script(Status(400, error_type="invalid_request_error"))
    port = RetryingModel(wire.provider(client), retries=2, timeout_s=5.0, sleep=Sleeps())
    error, _ = await failure(port)
    assert (error.status, error.retryable) == (400, False)
    assert "HTTP 400 invalid_request_error" in error.message
    assert wire.kind in error.message
    assert "scripted failure" not in error.message  # the body is never quoted
    assert len(wire.fake.requests) == 1


async def test_connection_refused_is_retryable(wire: Wire, client: ModelHTTP) -> None:
    with socket.socket() as sock:  # a port that was free a moment ago and has no listener
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    error, _ = await failure(wire.provider(client, base_url=closed))
    assert error.retryable
    assert "connection failed" in error.message


async def test_anthropic_error_event(anthropic: Wire, client: ModelHTTP) -> None:
    anthropic.fake.script(StreamError("overloaded_error"), StreamError("invalid_request_error"))
    overloaded, _ = await failure(anthropic.provider(client))
    refused, _ = await failure(anthropic.provider(client))
    assert overloaded.retryable and "overloaded_error" in overloaded.message
    assert not refused.retryable


# -- keys ----------------------------------------------------------------------------------------


async def test_key_reaches_the_right_header_and_no_error(wire: Wire, client: ModelHTTP) -> None:
    wire.fake.script(Reply(text="ok"), Status(401), Status(429, retry_after="3"), Status(500))
    await collect(wire.provider(client))
    headers = wire.fake.requests[0].headers
    if wire.kind == "openai":
        assert headers["authorization"] == f"Bearer {SECRET}"
    else:
        assert headers["x-api-key"] == SECRET
        assert headers["anthropic-version"] == "2023-06-01"
    for status in (401, 429, 500):
        error, _ = await failure(wire.provider(client))
        assert error.status == status
        assert SECRET not in f"{error} {error.message} {error.details} {error.envelope()}"


async def test_missing_key_variable_is_named_not_retried(wire: Wire, client: ModelHTTP) -> None:
    error, _ = await failure(wire.provider(client, environ={}))
    assert not error.retryable
    assert "CORRAL_TEST_KEY" in error.message
    assert wire.fake.requests == []


# -- retries and fallbacks -----------------------------------------------------------------------


async def test_429_waits_as_told_then_succeeds(wire: Wire, client: ModelHTTP) -> None:
    wire.fake.script(Status(429, retry_after="1"), Reply(text="after the wait"))
    sleeps = Sleeps()
    chunks = await collect(RetryingModel(wire.provider(client), retries=2, timeout_s=5.0, sleep=sleeps))
    assert text_of(chunks) == "after the wait"
    assert len(wire.fake.requests) == 2
    assert sleeps == [1.0]


async def test_retry_after_is_capped_at_timeout(openai: Wire, client: ModelHTTP) -> None:
    openai.fake.script(Status(429, retry_after="120"), Reply(text="ok"))
    sleeps = Sleeps()
    await collect(RetryingModel(openai.provider(client), retries=2, timeout_s=0.5, sleep=sleeps))
    assert sleeps == [0.5]


async def test_real_sleep_with_retry_after_zero(openai: Wire, client: ModelHTTP) -> None:
    openai.fake.script(Status(503, retry_after="0"), Reply(text="ok"))
    chunks = await collect(RetryingModel(openai.provider(client), retries=1, timeout_s=1.0))
    assert text_of(chunks) == "ok"
    assert len(openai.fake.requests) == 2


async def test_500_backs_off_then_succeeds(wire: Wire, client: ModelHTTP) -> None:
    wire.fake.script(Status(500), Status(502), Reply(text="third time"))
    sleeps = Sleeps()
    chunks = await collect(RetryingModel(wire.provider(client), retries=2, timeout_s=5.0, sleep=sleeps))
    assert text_of(chunks) == "third time"
    assert len(wire.fake.requests) == 3
    assert 0.25 <= sleeps[0] <= 0.5 and 0.5 <= sleeps[1] <= 1.0  # exponential, with jitter


async def test_persistent_500_fails_after_retries_plus_one(wire: Wire, client: ModelHTTP) -> None:
    wire.fake.script(*[Status(500)] * 4)
    port = RetryingModel(wire.provider(client), retries=2, timeout_s=5.0, sleep=Sleeps())
    error, _ = await failure(port)
    assert (error.status, error.retryable) == (500, True)
    assert len(wire.fake.requests) == 3
    assert wire.fake.pending == 1


async def test_no_retry_once_output_has_streamed(wire: Wire, client: ModelHTTP) -> None:
    wire.fake.script(Cut(text="already said"), Reply(text="would repeat"))
    port = RetryingModel(wire.provider(client), retries=2, timeout_s=5.0, sleep=Sleeps())
    error, seen = await failure(port)
    assert error.retryable
    assert text_of(seen)
    assert len(wire.fake.requests) == 1


async def test_fallback_moves_to_the_next_provider(
    openai: Wire, anthropic: Wire, client: ModelHTTP
) -> None:
    openai.fake.script(Status(503))
    anthropic.fake.script(Reply(text="from the fallback"))
    port = FallbackModel([openai.provider(client), anthropic.provider(client)])
    assert port.definition.name == "openai-test"
    chunks = await collect(port)
    assert text_of(chunks) == "from the fallback"
    assert (len(openai.fake.requests), len(anthropic.fake.requests)) == (1, 1)


async def test_fallback_last_error_propagates(
    openai: Wire, anthropic: Wire, client: ModelHTTP
) -> None:
    openai.fake.script(Status(500))
    anthropic.fake.script(Status(400, error_type="invalid_request_error"))
    error, _ = await failure(FallbackModel([openai.provider(client), anthropic.provider(client)]))
    assert error.status == 400
    assert "anthropic" in error.message


async def test_fallback_not_after_output(openai: Wire, anthropic: Wire, client: ModelHTTP) -> None:
    openai.fake.script(Cut(text="started"))
    error, _ = await failure(FallbackModel([openai.provider(client), anthropic.provider(client)]))
    assert "openai" in error.message
    assert anthropic.fake.requests == []


async def test_retries_inside_fallback(openai: Wire, anthropic: Wire, client: ModelHTTP) -> None:
    openai.fake.script(Status(500), Status(500))
    anthropic.fake.script(Status(429, retry_after="0"), Reply(text="second model, second try"))
    sleeps = Sleeps()
    port = FallbackModel(
        [
            RetryingModel(openai.provider(client), retries=1, timeout_s=5.0, sleep=sleeps),
            RetryingModel(anthropic.provider(client), retries=1, timeout_s=5.0, sleep=sleeps),
        ]
    )
    chunks = await collect(port)
    assert text_of(chunks) == "second model, second try"
    assert (len(openai.fake.requests), len(anthropic.fake.requests)) == (2, 2)


# -- request translation -------------------------------------------------------------------------

SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
TOOL_TURN = ModelRequest(
    instructions="You are terse.",
    messages=(
        UserMessage(content="find x and y"),
        AssistantMessage(
            content="Looking.",
            tool_calls=(
                ToolCall(id="call_1", name="lookup", arguments=freeze({"q": "x"})),
                ToolCall(id="call_2", name="lookup", arguments=freeze({"q": "y"})),
            ),
        ),
        ToolResultMessage(tool_call_id="call_1", name="lookup", content="x is 1"),
        ToolResultMessage(tool_call_id="call_2", name="lookup", content="no y", is_error=True),
    ),
    tools=(ToolSpec(name="lookup", description="Look a thing up.", input_schema=freeze(SCHEMA)),),
)


async def test_openai_request_body(openai: Wire, client: ModelHTTP) -> None:
    openai.fake.script(Reply(text="x=1"))
    await collect(openai.provider(client, temperature=0.2, max_output_tokens=256), TOOL_TURN)
    (sent,) = openai.fake.requests
    assert sent.path == "/v1/chat/completions"
    body = sent.body
    assert (body["model"], body["stream"], body["stream_options"]) == (
        "openai-model",
        True,
        {"include_usage": True},
    )
    assert (body["max_tokens"], body["temperature"]) == (256, 0.2)
    assert body["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "find x and y"},
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"q": "x"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"q": "y"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "x is 1"},
        {"role": "tool", "tool_call_id": "call_2", "content": "no y"},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {"name": "lookup", "description": "Look a thing up.", "parameters": SCHEMA},
        }
    ]


async def test_anthropic_request_body(anthropic: Wire, client: ModelHTTP) -> None:
    anthropic.fake.script(Reply(text="x=1"))
    follow_up = ModelRequest(
        instructions=TOOL_TURN.instructions,
        messages=(*TOOL_TURN.messages, UserMessage(content="and z?")),
        tools=TOOL_TURN.tools,
    )
    await collect(anthropic.provider(client, max_output_tokens=256), follow_up)
    (sent,) = anthropic.fake.requests
    assert sent.path == "/v1/messages"
    body = sent.body
    assert (body["model"], body["max_tokens"], body["stream"], body["system"]) == (
        "anthropic-model",
        256,
        True,
        "You are terse.",
    )
    assert "temperature" not in body
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "find x and y"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "call_1", "name": "lookup", "input": {"q": "x"}},
                {"type": "tool_use", "id": "call_2", "name": "lookup", "input": {"q": "y"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "x is 1", "is_error": False},
                {"type": "tool_result", "tool_use_id": "call_2", "content": "no y", "is_error": True},
                {"type": "text", "text": "and z?"},
            ],
        },
    ]
    assert body["tools"] == [{"name": "lookup", "description": "Look a thing up.", "input_schema": SCHEMA}]


# -- the fakes themselves ------------------------------------------------------------------------


async def test_openai_fake_satisfies_the_official_sdk(openai: Wire) -> None:
    sdk = pytest.importorskip("openai")
    openai.fake.script(
        Reply(text="streamed", calls=(Call("lookup", {"q": "x"}, pieces=3),)),
        Reply(text="whole", usage=(3, 2)),
    )
    with anyio.fail_after(10):
        async with sdk.AsyncOpenAI(base_url=openai.base_url, api_key=SECRET, max_retries=0) as api:
            stream = await api.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            deltas = [chunk.choices[0].delta async for chunk in stream if chunk.choices]
            whole = await api.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert "".join(d.content or "" for d in deltas) == "streamed"
    pieces = [t.function.arguments for d in deltas for t in d.tool_calls or ()]
    assert "".join(p or "" for p in pieces) == '{"q": "x"}'
    assert whole.choices[0].message.content == "whole"
    assert whole.usage is not None and whole.usage.total_tokens == 5


def test_retry_after_header_forms() -> None:
    assert retry_after({"retry-after": "2"}) == 2.0
    assert retry_after({"retry-after": "1.5"}) == 1.5
    assert retry_after({}) is None
    assert retry_after({"retry-after": "soon"}) is None
    assert retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0  # in the past
