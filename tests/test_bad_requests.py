"""Bad input that used to get through: each is a clear 4xx (or, for a definition, compiles), never a
crash or a silent default. All through a real server on loopback (and `corral validate`).

- a body of 100,000 nested `[` (json's parser recursed until the stack ran out: a 500 and a dropped
  connection), and a parsable one nested deep enough to overflow what runs on it later;
- an agent reference that is none of `name`, `name@sha256:<64 hex>`, `name@alias` (`name@` made a
  conversation on the current definition), on every surface that takes one;
- a JSON boolean that is not `true`/`false` (`"stream": "yes"` streamed);
- an argv element longer than a file name may be (a `python -c` script), which compiled as
  "File name too long" because every element was looked up as a path.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client

from tests.support.client import Conversation
from tests.support.servers import REPO, clean_environ, corral_server
from tests.support.trees import write_tree

pytestmark = pytest.mark.anyio

TREE = {
    "agent.yaml": """
        kind: Model
        name: bot
        provider: scripted
        default: "echo: {input}"
        ---
        kind: Agent
        name: echo
        description: Echoes.
        model: bot
    """,
}
DEEP = b"[" * 100_000
FORMS = "use NAME, NAME@sha256:<64 hex digits> or NAME@ALIAS"
MALFORMED = ["echo@", "@echo", "echo@sha256:zz", "echo@sha256:" + "0" * 63, "echo@b@c", "echo@sha256",
             "echo@Prod", "echo@-x"]


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("bad-requests")
    with corral_server(write_tree(root / "defs", TREE), root / "state") as base_url:
        yield base_url


@pytest.fixture
async def client(url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=url, timeout=15, trust_env=False) as http:
        yield http


def error_of(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    return error


async def post_raw(client: httpx.AsyncClient, path: str, body: bytes) -> httpx.Response:
    return await client.post(path, content=body, headers={"Content-Type": "application/json"})


# --- 1. nesting ---------------------------------------------------------------------------------


async def test_a_body_nested_100000_deep_is_a_400_and_the_server_goes_on(client: httpx.AsyncClient) -> None:
    conversation = await Conversation.create(client, "echo")
    messages = f"{conversation.path}/messages"
    for path in ("/v1/conversations", messages, "/v1/chat/completions"):
        error = error_of(await post_raw(client, path, DEEP), 400, "invalid_request")
        assert "nested" in error["message"]
    # Parsable, but deep enough that validating or storing it would recurse past the limit.
    nested = "[" * 900 + "]" * 900
    body = f'{{"agent": "echo", "metadata": {{"deep": {nested}}}}}'.encode()
    error = error_of(await post_raw(client, "/v1/conversations", body), 400, "invalid_request")
    assert "nested" in error["message"]
    # The MCP SDK parses its own body: it answers a JSON-RPC parse error, and nothing crashes.
    mcp = await client.post("/mcp", content=DEEP, headers={"Content-Type": "application/json",
                                                           "Accept": "application/json, text/event-stream"})
    assert mcp.status_code == 400 and mcp.json()["error"]["code"] == -32700, mcp.text
    # Still serving, on the same connection and on new ones.
    assert (await client.get("/healthz")).status_code == 200
    reply = await conversation.send("still here")
    assert reply.status_code == 200 and reply.json()["output"] == "echo: still here", reply.text


# --- 2. references ------------------------------------------------------------------------------


async def test_a_malformed_reference_is_a_400_naming_the_accepted_forms(client: httpx.AsyncClient) -> None:
    for ref in MALFORMED:
        chat = {"model": ref, "messages": [{"role": "user", "content": "hi"}]}
        for response in (await client.post("/v1/conversations", json={"agent": ref}),
                         await client.post("/v1/chat/completions", json=chat),
                         await client.get(f"/v1/agents/{ref}")):
            error = error_of(response, 400, "invalid_request")
            assert FORMS in error["message"] and repr(ref) in error["message"], (ref, error)
    created = (await client.get("/v1/conversations", params={"limit": 1000})).json()["items"]
    assert not [c for c in created if c["agent"] in MALFORMED]  # not one was created
    # The accepted forms still resolve, or are a 404 when they name nothing served.
    digest = (await client.get("/v1/agents/echo")).json()["digest"]
    pinned = await client.post("/v1/conversations", json={"agent": f"echo@{digest}"})
    assert pinned.status_code == 201 and pinned.json()["digest"] == digest
    error_of(await client.post("/v1/conversations", json={"agent": "echo@prod"}), 404, "agent_not_found")
    error_of(await client.post("/v1/conversations", json={"agent": "nobody"}), 404, "agent_not_found")
    error_of(await client.post("/v1/conversations", json={"agent": "echo@sha256:" + "0" * 64}), 404,
             "digest_not_found")


async def test_a_malformed_mcp_pin_is_an_invalid_request(url: str) -> None:
    with anyio.fail_after(30):
        async with Client(url + "/mcp") as mcp:
            for ref in [r for r in MALFORMED if r.startswith("echo@")]:
                result = await mcp.call_tool("echo", {"message": "hi", "agent": ref})
                text = result.content[0].text
                assert result.is_error and text.startswith("[invalid_request]") and FORMS in text, text
            fine = await mcp.call_tool("echo", {"message": "hi"})
            assert not fine.is_error


# --- 3. strict booleans -------------------------------------------------------------------------


async def test_a_boolean_field_takes_only_true_or_false(client: httpx.AsyncClient) -> None:
    conversation = await Conversation.create(client, "echo")
    for value in ("yes", "true", "false", 1, 0):
        sent = await conversation.send("hi", stream=value)
        assert error_of(sent, 400, "invalid_request")["details"][0]["field"] == "stream"
        chat = await client.post("/v1/chat/completions", json={
            "model": "echo", "stream": value, "messages": [{"role": "user", "content": "hi"}]})
        assert error_of(chat, 400, "invalid_request")["details"][0]["field"] == "stream"
    assert await conversation.turns() == []  # none ran
    # true and false still do what they say.
    plain = await conversation.send("a", stream=False)
    assert plain.status_code == 200 and plain.json()["output"] == "echo: a"
    await conversation.stream("b")  # answered 200, as an event stream


async def test_a_nul_character_in_a_message_or_title_is_a_400(client: httpx.AsyncClient) -> None:
    """No store keeps NUL in text (PostgreSQL refuses it): refused up front, on every store alike."""
    conversation = await Conversation.create(client, "echo")
    sent = await conversation.send("a\x00b")
    assert "NUL" in error_of(sent, 400, "invalid_request")["message"]
    chat = await client.post("/v1/chat/completions", json={
        "model": "echo", "messages": [{"role": "user", "content": "a\x00b"}]})
    error_of(chat, 400, "invalid_request")
    titled = await client.post("/v1/conversations", json={"agent": "echo", "title": "a\x00b"})
    error_of(titled, 400, "invalid_request")
    assert await conversation.turns() == []


# --- 4. long argv elements ----------------------------------------------------------------------

SCRIPT = "print('a long argument ran')  # " + "x" * 300  # one "path component" of 330 bytes


def long_argument_tree(root: Path) -> Path:
    assert len(SCRIPT.encode()) > 300 and "/" not in SCRIPT
    argv = json.dumps(["python3", "-c", SCRIPT])
    return write_tree(root, {
        "agent.yaml": f"""
            kind: Model
            name: bot
            provider: scripted
            script:
              - when: "^run$"
                tool_call: {{ name: long, arguments: {{}} }}
            ---
            kind: Tool
            name: long
            description: Runs a long python -c script.
            input_schema: {{ type: object }}
            command:
              argv: {argv}
              timeout_s: 20
            ---
            kind: Agent
            name: runner
            model: bot
            tools: [long]
        """,
    })


async def test_a_long_argv_element_is_an_argument(tmp_path: Path) -> None:
    defs = long_argument_tree(tmp_path / "defs")
    done = subprocess.run([sys.executable, "-m", "server.cli", "validate", str(defs)], cwd=REPO,
                          env=clean_environ(), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok: 3 definitions")
    with corral_server(defs, tmp_path / "state") as base_url:
        async with httpx.AsyncClient(base_url=base_url, timeout=30, trust_env=False) as client:
            spec = (await client.get("/v1/definitions/tool/long")).json()["spec"]
            assert spec["command"]["argv"][2] == SCRIPT and spec["files"] == {}
            reply = await (await Conversation.create(client, "runner")).send("run")
            assert reply.status_code == 200 and reply.json()["status"] == "completed", reply.text
            [result] = [m for m in reply.json()["messages"] if m["role"] == "tool"]
            assert not result["is_error"] and result["content"].strip() == "a long argument ran", result
