"""Corral as an MCP server, driven by the official `mcp` Python client.

Every case runs over streamable HTTP (a real uvicorn on loopback) and over
stdio (`python -m server.cli mcp DIR`), each in both protocol eras: the
modern sessionless one (`mode="auto"` lands on 2026-07-28) and the
handshake era (`mode="legacy"`, 2025-11-25). Facts the MCP surface does not
show (the transcript, a turn's status) are read from the HTTP API over the
same state directory.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp.types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ToolsListChanged
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from tests.support.servers import REPO, REPO_DEFINITIONS, corral_server
from tests.support.trees import copy_definitions, write_tree

pytestmark = pytest.mark.anyio
ERA = {"auto": "2026-07-28", "legacy": "2025-11-25"}
REQUEST_TIMEOUT = -32001

# The repository's definitions plus an agent that naps in a command tool (to
# be cancelled) and one whose max_steps cannot fit a tool call (to fail).
EXTRA = {
    "extra.yaml": """
        kind: Model
        name: napper
        provider: scripted
        script:
          - when: "(?i)^nap"
            tool_call: { name: nap }
            reply: rested
        ---
        kind: Tool
        name: nap
        description: Sleep for twenty seconds.
        command: { argv: [sleep, "20"], timeout_s: 30 }
        ---
        kind: Agent
        name: sleeper
        description: Naps when asked to.
        model: napper
        tools: [nap]
        ---
        kind: Agent
        name: hasty
        model: offline
        tools: [utc_time]
        max_steps: 1
    """,
}
HELPER = {"helper.yaml": "kind: Agent\nname: helper\ndescription: Added while serving.\nmodel: offline\n"}


@dataclass
class Target:
    """One way to reach Corral's MCP server: a transport and a protocol era."""

    transport: str
    mode: str
    definitions: Path
    state_dir: Path
    url: str = ""

    def client(self, **options: Any) -> Client:
        if self.transport == "http":
            return Client(self.url + "/mcp", mode=self.mode, **options)
        env = {"PATH": os.environ["PATH"], "HOME": str(self.state_dir.parent),
               "CORRAL_STATE_DIR": str(self.state_dir)}  # the env is not inherited (SDK notes P17)
        params = StdioServerParameters(command=sys.executable, env=env, cwd=str(REPO),
                                       args=["-m", "server.cli", "mcp", str(self.definitions)])
        return Client(params, mode=self.mode, **options)

    @contextmanager
    def api(self) -> Iterator[httpx.Client]:
        """The HTTP API over the same state: the live server, or, for stdio, one started afterwards."""
        if self.url:
            with httpx.Client(base_url=self.url, timeout=10) as http:
                yield http
            return
        with corral_server(self.definitions, self.state_dir) as url, \
                httpx.Client(base_url=url, timeout=10) as http:
            yield http


@pytest.fixture(params=[("http", "auto"), ("http", "legacy"), ("stdio", "auto"), ("stdio", "legacy")],
                ids="-".join)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    definitions = tmp_path / "definitions"
    copy_definitions(REPO_DEFINITIONS, definitions)
    write_tree(definitions, EXTRA)
    transport, mode = request.param
    found = Target(transport, mode, definitions, tmp_path / "state")
    if transport == "stdio":
        yield found
        return
    with corral_server(definitions, found.state_dir, watch=True) as url:
        found.url = url
        yield found


def text_of(result: types.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def test_catalogue_follows_the_definitions(target: Target) -> None:
    changed = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    with anyio.fail_after(30):
        async with target.client(message_handler=on_message) as client:
            assert client.protocol_version == ERA[target.mode]
            await check_catalogue(client)
            if target.mode == "legacy":  # handshake era: a notification on the standalone stream
                write_tree(target.definitions, HELPER)
                await changed.wait()
            else:  # modern era: only on a subscriptions/listen stream
                async with client.listen(tools_list_changed=True) as changes:
                    write_tree(target.definitions, HELPER)
                    assert isinstance(await anext(changes), ToolsListChanged)
            tools = (await client.list_tools(cache_mode="refresh")).tools
            assert "helper" in {t.name for t in tools}


async def check_catalogue(client: Client) -> None:
    tools = (await client.list_tools()).tools
    assert {"assistant", "sleeper", "hasty"} <= {t.name for t in tools}
    assert "helper" not in {t.name for t in tools}
    for tool in tools:
        assert tool.description, tool.name  # `hasty` has none of its own: it gets a generated one
        assert "message" in tool.input_schema["required"], tool.name

    resources = (await client.list_resources()).resources
    assert "corral://definitions/agent/assistant" in {r.uri for r in resources}
    assert all(r.description for r in resources)
    read = await client.read_resource("corral://definitions/agent/assistant")
    yaml_text = read.contents[0].text
    assert yaml_text.startswith("# digest: sha256:") and "model: offline" in yaml_text
    with pytest.raises(MCPError) as unknown:
        await client.read_resource("corral://definitions/agent/nobody")
    assert unknown.value.code == types.INVALID_PARAMS

    prompts = (await client.list_prompts()).prompts
    assert "haiku" in {p.name for p in prompts} and all(p.description for p in prompts)
    prompt = await client.get_prompt("haiku", {"task": "autumn rain"})
    body = prompt.messages[0].content.text
    assert "5, 7 and 5 syllables" in body and body.endswith("Task: autumn rain")


async def test_conversation(target: Target) -> None:
    progress: list[tuple[float, str | None]] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, message))

    with anyio.fail_after(30):
        async with target.client() as client:
            first = await client.call_tool("assistant", {"message": "what time is it"},
                                           progress_callback=on_progress)
            assert not first.is_error, text_of(first)
            assert text_of(first).startswith("It is ")
            assert progress, "no progress notification during a tool-using turn"
            structured = first.structured_content
            conversation, digest = structured["conversation_id"], structured["digest"]
            assert digest.startswith("sha256:") and structured["turn_id"]

            second = await client.call_tool(
                "assistant", {"message": "count words in one two three", "conversation_id": conversation})
            assert text_of(second) == "Word count: 3"
            assert second.structured_content["conversation_id"] == conversation
            assert second.structured_content["turn_id"] != structured["turn_id"]

            pinned = await client.call_tool("assistant", {"message": "hello", "agent": f"assistant@{digest}"})
            assert not pinned.is_error, text_of(pinned)
            assert pinned.structured_content["digest"] == digest
            assert pinned.structured_content["conversation_id"] != conversation

            bad = await client.call_tool("assistant", {})
            assert bad.is_error and text_of(bad).startswith("[invalid_request]")
            failed = await client.call_tool("hasty", {"message": "what time is it"})
            assert failed.is_error and text_of(failed).startswith("[max_steps_exceeded]"), text_of(failed)

    with target.api() as http:
        messages = http.get(f"/v1/conversations/{conversation}/messages").json()["items"]
    said = [m["content"] for m in messages if m["role"] == "user"]
    assert said == ["what time is it", "count words in one two three"]
    assert [m["content"] for m in messages if m["role"] == "assistant"][-1] == "Word count: 3"


async def test_timeout_cancels_the_turn(target: Target) -> None:
    with anyio.fail_after(30):
        async with target.client() as client:
            first = await client.call_tool("sleeper", {"message": "hello"})
            conversation = first.structured_content["conversation_id"]
            with pytest.raises(MCPError) as timed_out:
                await client.call_tool("sleeper", {"message": "nap", "conversation_id": conversation},
                                       read_timeout_seconds=1.0)
            assert timed_out.value.code == REQUEST_TIMEOUT
            # The nap takes 20 s: the conversation is free again within 10 only if the turn was cancelled.
            with anyio.fail_after(10):
                while (after := await client.call_tool(
                        "sleeper", {"message": "awake?", "conversation_id": conversation})).is_error:
                    assert text_of(after).startswith("[conversation_busy]"), text_of(after)
                    await anyio.sleep(0.1)

    with target.api() as http:
        turns = http.get(f"/v1/conversations/{conversation}/turns").json()["items"]
    assert sorted(t["status"] for t in turns) == ["cancelled", "completed", "completed"], turns


INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                         "clientInfo": {"name": "raw", "version": "0"}}}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_api_key_guards_mcp(tmp_path: Path, mode: str) -> None:
    with corral_server(REPO_DEFINITIONS, tmp_path / "state", api_keys="k") as url:
        async with httpx.AsyncClient() as raw:
            refused = await raw.post(url + "/mcp", json=INITIALIZE, headers=MCP_HEADERS)
        assert refused.status_code == 401
        with anyio.fail_after(20):
            async with create_mcp_http_client(headers={"Authorization": "Bearer k"}) as http, \
                    Client(streamable_http_client(url + "/mcp", http_client=http), mode=mode) as client:
                assert client.protocol_version == ERA[mode]
                result = await client.call_tool("assistant", {"message": "count words in a b"})
                assert text_of(result) == "Word count: 2"


async def test_foreign_origin_is_refused(default_server: str) -> None:
    port = httpx.URL(default_server).port
    async with httpx.AsyncClient(base_url=default_server) as http:
        evil = await http.post("/mcp", json=INITIALIZE, headers=MCP_HEADERS | {"Origin": "http://evil.example"})
        assert evil.status_code == 403
        own = await http.post("/mcp", json=INITIALIZE,
                              headers=MCP_HEADERS | {"Origin": f"http://127.0.0.1:{port}"})
        assert own.status_code == 200, own.text
