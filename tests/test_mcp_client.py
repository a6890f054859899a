"""MCPServer definitions: external MCP servers' tools used by agents, through the real HTTP API.

Corral runs on loopback; its agents reach `tests/mcp_fixture_server.py`
twice: as a stdio child process (`fixture`) and served over streamable HTTP
in this process (`web`). The scripted model asks for a tool by its
`server__tool` name and answers with the result, so each answer shows what
the tool returned. The fixture's tools/list follows a "variant" file, so a
test can change the catalog a server reports without changing its definition.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import httpx
import mcp.types as types
import pytest

from server.cli import main as corral_main
from server.compiler.compiler import Compiler
from server.compiler.definitions import MCPServerDefinition
from server.tools.base import ToolContext, ToolOutput
from server.tools.mcp.catalog import render_result, tool_name
from server.tools.mcp.connections import MCPConnections
from tests.fakes.uvicorn_thread import serve
from tests.mcp_fixture_server import fixture_app
from tests.support.client import Conversation, talk
from tests.support.events import named, server_events
from tests.support.processes import alive, wait_until
from tests.support.servers import corral_server
from tests.support.swaps import reload
from tests.support.trees import write_tree

pytestmark = pytest.mark.anyio

FIXTURE = Path(__file__).resolve().parent / "mcp_fixture_server.py"

MODEL = r"""
kind: Model
name: scripted
provider: scripted
script:
  - when: "^add"
    tool_call: { name: fixture__add, arguments: { a: 2, b: 3 } }
    reply: "sum={tool_result}"
  - when: "^pid"
    tool_call: { name: fixture__pid }
    reply: "pid={tool_result}"
  - when: "^echo (?P<text>\\w+)"
    tool_call: { name: fixture__echo, arguments: { text: "{text}" } }
    reply: "echo={tool_result}"
  - when: "^web add"
    tool_call: { name: web__add, arguments: { a: 4, b: 5 } }
    reply: "web={tool_result}"
  - when: "^hang"
    tool_call: { name: web__hang }
    reply: "hang: {tool_result}"
  - when: "^web echo"
    tool_call: { name: web__echo, arguments: { text: "x" } }
  - when: "^boo"
    tool_call: { name: ghost__unavailable }
  - when: "^remote echo (?P<text>\\w+)"
    tool_call: { name: remote__echo, arguments: { text: "{text}" } }
    reply: "echo={tool_result}"
"""


def stdio_server() -> str:
    args = json.dumps([str(FIXTURE)])
    return f"kind: MCPServer\nname: fixture\ncommand: {sys.executable}\nargs: {args}\ntimeout_s: 10\n"


def mcp_definitions(root: Path, web_url: str) -> Path:
    return write_tree(root, {
        "models.yaml": MODEL,
        "servers.yaml": stdio_server() + f"""---
kind: MCPServer
name: web
url: {web_url}/mcp
headers: {{ X-Fixture: "${{CORRAL_TEST_FIXTURE_TOKEN:-none}}" }}
timeout_s: 1
tools: {{ exclude: [echo] }}
---
kind: MCPServer
name: ghost
command: /nonexistent/mcp-server
""",
        "agents.yaml": """
            kind: Agent
            name: calc
            model: scripted
            tools: [fixture, web]
            ---
            kind: Agent
            name: picky
            model: scripted
            tools: [fixture/pid]
            ---
            kind: Agent
            name: haunted
            model: scripted
            tools: [ghost]
        """,
    })


def drift_definitions(root: Path, url: str) -> Path:
    return write_tree(root, {
        "models.yaml": MODEL,
        "servers.yaml": f"kind: MCPServer\nname: remote\nurl: {url}/mcp\n",
        "agents.yaml": "kind: Agent\nname: calc\nmodel: scripted\ntools: [remote]\n",
    })


@pytest.fixture(scope="module")
def web_url() -> Iterator[str]:
    with serve(fixture_app()) as url:
        yield url


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory, web_url: str) -> Iterator[str]:
    root = tmp_path_factory.mktemp("mcp_client")
    with corral_server(mcp_definitions(root / "defs", web_url), root / "state") as url:
        yield url


@pytest.fixture
async def client(base_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=base_url, timeout=30, trust_env=False) as http:
        yield http


async def say(client: httpx.AsyncClient, agent: str, *messages: str) -> list[str]:
    """Send `messages` in order in one new conversation of `agent`; their answers."""
    conversation = await Conversation.create(client, agent)
    answers = []
    for message in messages:
        answer = await conversation.say(message, bound=30)
        assert answer["status"] == "completed", answer
        answers.append(answer["output"])
    return answers


async def test_tools_of_a_stdio_and_an_http_server(client: httpx.AsyncClient) -> None:
    assert await say(client, "calc", "add", "web add") == ["sum=5", "web=9"]


async def test_a_killed_stdio_server_is_restarted_on_next_use(client: httpx.AsyncClient) -> None:
    (first,) = await say(client, "calc", "pid")
    pid = int(first.removeprefix("pid="))
    os.kill(pid, signal.SIGKILL)
    added, second = await say(client, "calc", "add", "pid")
    assert added == "sum=5"
    assert second.startswith("pid=") and int(second.removeprefix("pid=")) != pid


async def test_a_hanging_call_times_out_as_a_tool_error(client: httpx.AsyncClient) -> None:
    hung, added = await say(client, "calc", "hang", "web add")
    assert hung == "hang: tool hang of MCP server web timed out after 1s"
    assert added == "web=9"  # the server is still healthy


async def test_filters_decide_which_tools_are_offered(client: httpx.AsyncClient) -> None:
    (excluded,) = await say(client, "calc", "web echo")
    assert "no tool named 'web__echo'" in excluded and "web__add" in excluded
    pid, added = await say(client, "picky", "pid", "add")  # tools: [fixture/pid]
    assert pid.startswith("pid=")
    assert "no tool named 'fixture__add'; available: fixture__pid" in added


async def test_a_server_that_cannot_start_is_a_tool_error(client: httpx.AsyncClient) -> None:
    (answer,) = await say(client, "haunted", "boo")
    assert answer.startswith("MCP server ghost could not be started: No such file or directory")


# --- the lock -----------------------------------------------------------------


async def corral(*argv: str) -> int:
    return await anyio.to_thread.run_sync(corral_main, list(argv))


async def test_lock_records_catalogs_and_drift_is_reported_or_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    variant = tmp_path / "variant"  # the server's, not a definition's: editing it leaves every digest alone
    variant.write_text("1")
    with serve(fixture_app(variant)) as remote_url:
        defs = drift_definitions(tmp_path / "defs", remote_url)
        await drift_is_reported_or_refused(defs, variant, tmp_path, capsys)


async def drift_is_reported_or_refused(defs: Path, variant: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    with anyio.fail_after(30):
        assert await corral("lock", str(defs)) == 0
        catalogs = json.loads((defs / "corral.lock").read_text())["mcp_catalogs"]
        assert list(catalogs) == ["remote"] and catalogs["remote"].startswith("sha256:")

        variant.write_text("2")  # echo gains a parameter
        capsys.readouterr()
        assert await corral("lock", "--check", str(defs)) == 1
        out = capsys.readouterr().out
        assert f"~ mcp/remote {catalogs['remote']} -> sha256:" in out
        assert await corral("lock", "--check", "--skip-mcp", str(defs)) == 0

    with corral_server(defs, tmp_path / "open") as url:  # unlocked: reported, accepted
        async with httpx.AsyncClient(base_url=url, timeout=30, trust_env=False) as client:
            with anyio.fail_after(30):
                async with server_events(client) as events:
                    assert await say(client, "calc", "remote echo hi") == ["echo=hi"]
                    drifted = (await events.wait(named("mcp.catalog_drift"))).data
            assert drifted["server"] == "remote" and drifted["expected"] == catalogs["remote"]
            assert drifted["observed"] != catalogs["remote"] and drifted["refused"] is False

    with corral_server(defs, tmp_path / "locked", locked=True) as url:  # locked: refused
        async with httpx.AsyncClient(base_url=url, timeout=30, trust_env=False) as client:
            (answer,) = await say(client, "calc", "remote echo hi")
            assert "catalog drifted from corral.lock" in answer


# --- connections, directly ------------------------------------------------------


async def test_an_edited_definition_gets_a_new_connection_and_the_old_one_closes(tmp_path: Path) -> None:
    v1 = Compiler(write_tree(tmp_path / "v1", {"s.yaml": stdio_server()})).compile()
    edited = "kind: MCPServer\nname: fixture\ncommand: /nonexistent/mcp-server\n"
    v2 = Compiler(write_tree(tmp_path / "v2", {"s.yaml": edited})).compile()
    old, new = v1.get("MCPServer", "fixture"), v2.get("MCPServer", "fixture")
    assert isinstance(old, MCPServerDefinition) and isinstance(new, MCPServerDefinition)
    assert old.digest != new.digest
    connections = MCPConnections()

    async def pid(server: MCPServerDefinition, root: Path) -> int:
        tools = {t.spec.name: t for t in await connections.tools(server, root, only="pid")}
        output = await tools["fixture__pid"].call({}, ToolContext("c", "t", "calc", "sha256:0", root))
        assert not output.is_error, output.content
        return int(output.content)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(connections.run)
            first = await pid(old, v1.root)
            assert await pid(old, v1.root) == first  # one connection per digest, kept
            (unavailable,) = await connections.tools(new, v2.root, only="pid")
            output = await unavailable.call({}, ToolContext("c", "t", "calc", "sha256:0", v2.root))
            assert output.is_error and "could not be started" in output.content
            await wait_until(lambda: not alive(first), bound=30)  # the idle old connection is closed
            tg.cancel_scope.cancel()


def test_names_and_results_as_the_model_sees_them() -> None:
    assert tool_name("fixture", "add") == "fixture__add"
    odd = tool_name("files", "read.file/v2")
    assert odd.startswith("files__read_file_v2_") and odd != tool_name("files", "read_file/v2")
    assert len(tool_name("s" * 40, "t" * 40)) == 64
    result = types.CallToolResult(content=[
        types.TextContent(type="text", text="one"),
        types.ImageContent(type="image", data="AA==", mime_type="image/png"),
        types.TextContent(type="text", text="two"),
    ], is_error=True)
    assert render_result(result) == ToolOutput("one\n[image image/png]\ntwo", is_error=True)
    structured = types.CallToolResult(content=[], structured_content={"b": 1, "a": [2]})
    assert render_result(structured) == ToolOutput('{"a": [2], "b": 1}')


async def test_a_server_removed_by_a_swap_is_stopped(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "defs", {
        "models.yaml": MODEL,
        "servers.yaml": stdio_server(),
        "agents.yaml": "kind: Agent\nname: calc\nmodel: scripted\ntools: [fixture]\n",
    })
    with corral_server(root, tmp_path / "state") as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            _, answer = await talk(client, "calc", "pid", bound=30)
            pid = int(answer["output"].removeprefix("pid="))
            assert alive(pid)
            (root / "servers.yaml").unlink()
            (root / "agents.yaml").write_text("kind: Agent\nname: calc\nmodel: scripted\n")
            assert (await reload(client))["status"] == "applied"
            await wait_until(lambda: not alive(pid), bound=15)
