"""The official `openai` client against Corral's OpenAI-compatible routes.

Corral serves the repository's own definitions; the client is pointed at it
as at any OpenAI-compatible endpoint, so what is checked is what such a
client actually parses.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import anyio
import httpx
import openai
import pytest

from tests.support.servers import REPO_DEFINITIONS, corral_server

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with corral_server(REPO_DEFINITIONS, tmp_path_factory.mktemp("openai-state")) as url:
        yield url


@pytest.fixture
async def client(base_url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with httpx.AsyncClient(trust_env=False, timeout=20) as http:
        yield openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0, http_client=http)


@pytest.fixture
async def http(base_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=base_url, trust_env=False, timeout=20) as plain:
        yield plain


async def test_models_are_the_agents(client: openai.AsyncOpenAI) -> None:
    models = [m async for m in client.models.list()]
    assert [m.id for m in models] == ["assistant"]
    assert models[0].object == "model" and models[0].owned_by


async def test_completion(client: openai.AsyncOpenAI) -> None:
    with anyio.fail_after(15):
        completion = await client.chat.completions.create(
            model="assistant", messages=[{"role": "user", "content": "count words in one two three four"}])
    assert completion.object == "chat.completion" and completion.model == "assistant"
    [choice] = completion.choices
    assert choice.message.role == "assistant" and choice.message.content == "Word count: 4"
    assert choice.finish_reason == "stop"
    assert completion.usage is not None and completion.usage.completion_tokens > 0
    usage = completion.usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


async def test_completion_with_history(client: openai.AsyncOpenAI, http: httpx.AsyncClient) -> None:
    history = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "hello there"},
        {"role": "assistant", "content": "I am the offline assistant."},
        {"role": "user", "content": [{"type": "text", "text": "count words in "},
                                     {"type": "text", "text": "a b"}]},
    ]
    with anyio.fail_after(15):
        completion = await client.chat.completions.create(model="assistant", messages=history)
    assert completion.choices[0].message.content == "Word count: 2"

    # the turn ran in a conversation of its own, on top of the earlier messages
    listed = await http.get("/v1/conversations", params={"agent": "assistant", "limit": 1})
    newest = listed.json()["items"][0]
    assert newest["metadata"] == {"source": "openai"}
    transcript = (await http.get(f"/v1/conversations/{newest['id']}/messages")).json()["items"]
    said = [(m["role"], m["content"]) for m in transcript if m["role"] != "tool" and m["content"]]
    assert said == [("user", "hello there"), ("assistant", "I am the offline assistant."),
                    ("user", "count words in a b"), ("assistant", "Word count: 2")]


async def test_streaming(client: openai.AsyncOpenAI) -> None:
    prompt = [{"role": "user", "content": "count words in to be or not to be"}]
    with anyio.fail_after(15):
        whole = await client.chat.completions.create(model="assistant", messages=prompt)
        stream = await client.chat.completions.create(model="assistant", messages=prompt, stream=True,
                                                      stream_options={"include_usage": True})
        chunks = [chunk async for chunk in stream]
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(texts) > 1 and "".join(texts) == whole.choices[0].message.content == "Word count: 6"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert all(c.object == "chat.completion.chunk" and c.model == "assistant" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    usage = chunks[-1]
    assert usage.choices == [] and usage.usage is not None and usage.usage.total_tokens > 0


async def test_streaming_without_usage(client: openai.AsyncOpenAI) -> None:
    with anyio.fail_after(15):
        stream = await client.chat.completions.create(
            model="assistant", messages=[{"role": "user", "content": "hi"}], stream=True)
        chunks = [chunk async for chunk in stream]
    assert all(c.choices for c in chunks) and chunks[-1].choices[0].finish_reason == "stop"
    assert "".join(c.choices[0].delta.content or "" for c in chunks).startswith("I am the offline assistant.")


async def test_model_pinned_by_digest(client: openai.AsyncOpenAI, http: httpx.AsyncClient) -> None:
    digest = (await http.get("/v1/agents/assistant")).json()["digest"]
    with anyio.fail_after(15):
        completion = await client.chat.completions.create(
            model=f"assistant@{digest}", messages=[{"role": "user", "content": "count words in x"}])
    assert completion.model == f"assistant@{digest}"
    assert completion.choices[0].message.content == "Word count: 1"


@pytest.mark.parametrize("model", ["nobody", "assistant@sha256:" + "0" * 64])
async def test_unknown_model(client: openai.AsyncOpenAI, model: str) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 404
    assert caught.value.code in ("agent_not_found", "digest_not_found")
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(model=model, stream=True,
                                             messages=[{"role": "user", "content": "hi"}])


async def test_bad_requests(client: openai.AsyncOpenAI) -> None:
    for messages in ([], [{"role": "assistant", "content": "no answer"}], [{"role": "user", "content": ""}]):
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model="assistant", messages=messages)
        assert caught.value.code == "invalid_request"
