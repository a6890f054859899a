"""Strings no store can keep, and metadata too large to keep, on SQLite and on PostgreSQL (§7, §10).

A JSON string with a lone surrogate (`"\\ud800"`, or the raw bytes UTF-8
would give one) is a 400 `invalid_request` wherever a body arrives; a pair
of escapes is one character and fine. A model that sends a lone surrogate,
or splits a pair across two stream chunks, does not fail its turn: a split
pair is rejoined, and a lone one is stored as U+FFFD. Metadata over 16 KiB
as JSON is a 400.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.fakes import Reply, serve
from tests.support.client import Conversation
from tests.support.fake_models import Fakes
from tests.support.servers import corral_server
from tests.support.trees import write_tree

pytestmark = pytest.mark.anyio
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def fakes() -> Fakes:
    return Fakes()


def definitions(root: Path, openai_url: str) -> Path:
    return write_tree(root, {"defs.yaml": f"""
        kind: Model
        name: gpt
        provider: openai
        model: gpt-fake
        base_url: {openai_url}/v1
        api_key: ${{CORRAL_TEST_OPENAI_KEY}}
        timeout_s: 5
        retries: 0
        ---
        kind: Agent
        name: plain
        model: gpt
    """})


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def base_url(request: pytest.FixtureRequest, fakes: Fakes,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp(f"edges-{request.param}")
    settings: dict[str, Any] = {}
    postgres = request.getfixturevalue("postgres_server") if request.param == "postgres" else None
    if postgres is not None:
        settings["database_url"] = postgres.create_database()
    try:
        with pytest.MonkeyPatch.context() as env, serve(fakes.openai.app) as openai_url:
            env.setenv("CORRAL_TEST_OPENAI_KEY", "sk-fake-openai")
            with corral_server(definitions(root / "defs", openai_url), root / "state", **settings) as url:
                yield url
    finally:
        if postgres is not None:
            with contextlib.suppress(RuntimeError):
                postgres.drop_database(settings["database_url"])


@pytest.fixture
async def client(base_url: str, fakes: Fakes) -> AsyncIterator[httpx.AsyncClient]:
    async with fakes.client(base_url) as http:
        yield http


def refused(response: httpx.Response, says: str = "lone surrogate") -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request" and says in json.dumps(error), error


# --- lone surrogates in requests -------------------------------------------------------------------


LONE = [b'"\\ud800"', b'"a\\uDC00b"', b'"\\ude00\\ud83d"', b'"\xed\xa0\x80"']  # the last: raw bytes


@pytest.mark.parametrize("lone", LONE)
async def test_a_lone_surrogate_in_a_body_is_a_400(client: httpx.AsyncClient, fakes: Fakes,
                                                   lone: bytes) -> None:
    refused(await client.post("/v1/conversations", headers=JSON,
                              content=b'{"agent": "plain", "metadata": {"note": ' + lone + b"}}"))
    refused(await client.post("/v1/conversations", headers=JSON,
                              content=b'{"agent": "plain", "metadata": {' + lone + b": 1}}"))  # a key
    conversation = await Conversation.create(client, "plain", metadata={"kept": True})
    refused(await client.patch(conversation.path, headers=JSON,
                               content=b'{"metadata": {"list": [1, {"deep": ' + lone + b"}]}}"))
    refused(await client.post(f"{conversation.path}/messages", headers=JSON,
                              content=b'{"content": ' + lone + b"}"))
    refused(await client.post("/v1/chat/completions", headers=JSON, content=(
        b'{"model": "plain", "messages": [{"role": "user", "content": ' + lone + b"}]}")))
    assert (await conversation.get())["metadata"] == {"kept": True}
    assert fakes.openai.requests == []  # no turn ran


async def test_a_surrogate_pair_is_one_character(client: httpx.AsyncClient, fakes: Fakes) -> None:
    fakes.openai.script(Reply(text="fine"))
    created = await client.post("/v1/conversations", headers=JSON,
                                content=b'{"agent": "plain", "metadata": {"mood": "\\ud83d\\ude00"}}')
    assert created.status_code == 201, created.text
    assert created.json()["metadata"] == {"mood": "\U0001f600"}
    with anyio.fail_after(20):
        answer = await client.post(f"/v1/conversations/{created.json()['id']}/messages", headers=JSON,
                                   content=b'{"content": "\\uD83D\\uDE00?"}')
    assert answer.status_code == 200 and answer.json()["output"] == "fine", answer.text
    assert fakes.openai.requests[0].body["messages"][-1]["content"] == "\U0001f600?"


async def test_a_lone_surrogate_in_an_mcp_tool_call_is_invalid(client: httpx.AsyncClient,
                                                               fakes: Fakes) -> None:
    # MCP's 2026 transport parses the body with json.loads, which keeps a lone surrogate
    headers = JSON | {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2026-07-28",
                      "Mcp-Method": "tools/call", "Mcp-Name": "plain"}
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
            "io.modelcontextprotocol/clientCapabilities": {}}
    body = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                       "params": {"name": "plain", "arguments": {"message": "hi @"}, "_meta": meta}})
    with anyio.fail_after(20):
        response = await client.post("/mcp", headers=headers, content=body.replace("@", "\\ud800"))
    assert response.status_code == 200, response.text
    result = response.json()["result"]
    assert result["isError"] is True and result["content"][0]["text"].startswith("[invalid_request]"), result
    assert fakes.openai.requests == []


# --- lone surrogates from the model ----------------------------------------------------------------


async def completion(client: httpx.AsyncClient, *, stream: bool = False) -> str:
    body = {"model": "plain", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    with anyio.fail_after(20):
        if not stream:
            response = await client.post("/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
            return response.json()["choices"][0]["message"]["content"]
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            lines = [line async for line in response.aiter_lines() if line.startswith("data: {")]
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines]
    assert not any("error" in c for c in chunks), chunks
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


async def transcript_answer(client: httpx.AsyncClient) -> str:
    listed = (await client.get("/v1/conversations", params={"limit": 1})).json()["items"]
    messages = (await client.get(f"/v1/conversations/{listed[0]['id']}/messages")).json()["items"]
    return messages[-1]["content"]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_pair_split_across_chunks_is_rejoined(client: httpx.AsyncClient, fakes: Fakes,
                                                      stream: bool) -> None:
    # two code units, sent as two chunks: "a\ud83d" then "\ude00b", each a JSON escape on the wire
    fakes.openai.script(Reply(text="a\ud83d\ude00b", chunks=2))
    assert await completion(client, stream=stream) == "a\U0001f600b"
    assert await transcript_answer(client) == "a\U0001f600b"


@pytest.mark.parametrize("stream", [False, True])
async def test_a_lone_surrogate_from_the_model_is_stored_as_a_replacement(client: httpx.AsyncClient,
                                                                          fakes: Fakes,
                                                                          stream: bool) -> None:
    fakes.openai.script(Reply(text="x\ud800y\udc00", chunks=4))
    assert await completion(client, stream=stream) == "x\ufffdy\ufffd"
    assert await transcript_answer(client) == "x\ufffdy\ufffd"


# --- metadata size -----------------------------------------------------------------------------------


def metadata_of(size: int) -> dict[str, str]:
    """Metadata whose compact JSON is exactly `size` bytes (an "é" is two of them)."""
    value = "é" * ((size - len('{"k":""}')) // 2)
    metadata = {"k": value + "x" * (size - len(json.dumps({"k": value}, ensure_ascii=False,
                                                               separators=(",", ":")).encode()))}
    assert len(json.dumps(metadata, ensure_ascii=False, separators=(",", ":")).encode()) == size
    return metadata


async def test_metadata_is_at_most_16_kib(client: httpx.AsyncClient) -> None:
    limit = 16 * 1024
    too_large = {"agent": "plain", "metadata": metadata_of(limit + 1)}
    refused(await client.post("/v1/conversations", json=too_large), "16384")
    conversation = await Conversation.create(client, "plain", metadata=metadata_of(limit))
    assert (await conversation.get())["metadata"] == metadata_of(limit)
    refused(await client.patch(conversation.path, json={"metadata": metadata_of(limit + 1)}), "16384")
    assert (await conversation.get())["metadata"] == metadata_of(limit)  # unchanged
    patched = await client.patch(conversation.path, json={"metadata": {"small": 1}})
    assert patched.status_code == 200 and patched.json()["metadata"] == {"small": 1}
