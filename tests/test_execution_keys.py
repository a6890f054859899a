"""Replay policy and execution keys (§9): what a resumed turn relies on, against real processes and servers.

A tool call has an execution key, the same on every attempt of the call; each kind of tool hands it
on: a command tool, and the command hooks that guard the call, as `CORRAL_EXECUTION_KEY` (the only
`CORRAL_*` variable they see); an http tool as an `Idempotency-Key` header, unless its definition
sets one; an MCP call in `_meta` as `corral/execution_key` (tests/mcp_fixture_server.py answers
what it received). The caller (the agent loop) puts the key in `ToolContext`; here each test does.

Every tool says whether a call cut off by a crash may run again (`replay_safe`): a Tool from its
`replay` field (`safe` / `unsafe`, default `unsafe`, which hashes as if the field did not exist:
no digest of a definition written before the field changes), an MCP tool from its server's
annotations, the skill tools always, a sub-agent never.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp.types as types
import pytest
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from server.compiler.compiler import Compiler
from server.compiler.definitions import (
    DefinitionSet,
    HookDefinition,
    MCPServerDefinition,
    ToolDefinition,
)
from server.compiler.documents import json_schema
from server.errors import DefinitionsInvalid
from server.runtime.guard import Guarded
from server.runtime.hooks import Hooks
from server.runtime.plans import Runtime
from server.tools.base import ToolContext, execution_key, for_call
from server.tools.command import CommandTool
from server.tools.http import HttpTool
from server.tools.mcp.catalog import replay_safe
from server.tools.mcp.connections import MCPConnections
from tests.fakes.uvicorn_thread import serve
from tests.mcp_fixture_server import fixture_app
from tests.support.trees import write_tree

pytestmark = pytest.mark.anyio

PY = sys.executable
FIXTURE = Path(__file__).resolve().parent / "mcp_fixture_server.py"
KEY = execution_key("turn_1", "call_1")
# Prints every CORRAL_* variable it was started with, as JSON.
CORRAL_VARS_PY = ("import json, os, sys\n"
                  "print(json.dumps({k: v for k, v in os.environ.items() if k.startswith('CORRAL_')}))\n")
# A hook: writes the CORRAL_* variables it was started with to the file argv[1] (and allows the call).
HOOK_PY = ("import json, os, sys\n"
           "sys.stdin.read()\n"
           "seen = {k: v for k, v in os.environ.items() if k.startswith('CORRAL_')}\n"
           "open(sys.argv[1], 'w').write(json.dumps(seen))\n")


def compiled(root: Path, files: dict[str, str]) -> DefinitionSet:
    try:
        return Compiler(write_tree(root, files)).compile()
    except DefinitionsInvalid as exc:
        raise AssertionError("\n".join(map(str, exc.errors))) from None


def context(root: Path, key: str = KEY) -> ToolContext:
    return ToolContext(conversation_id="conv_1", turn_id="turn_1", agent="a", digest="sha256:0", root=root,
                       call_id="call_1", execution_key=key)


def tool(definitions: DefinitionSet, name: str) -> ToolDefinition:
    found = definitions.get("Tool", name)
    assert isinstance(found, ToolDefinition)
    return found


# --- the key itself --------------------------------------------------------------------------


def test_an_execution_key_is_stable_per_call_and_distinct_across_calls() -> None:
    assert execution_key("turn_1", "call_1") == KEY  # what a second attempt of the turn computes
    assert re.fullmatch(r"ek_[0-9a-f]{32}", KEY)
    assert len({KEY, execution_key("turn_1", "call_2"), execution_key("turn_2", "call_1")}) == 3
    top = ToolContext("conv_1", "turn_1", "a", "sha256:0", Path("."))
    parent_call = for_call(top, "call_1")
    assert (parent_call.call_id, parent_call.execution_key) == ("call_1", KEY)
    # A sub-agent's turn runs on its parent call's context; its own "call_1" gets a key of its own.
    sub_call = for_call(parent_call, "call_1")
    assert sub_call.execution_key == for_call(parent_call, "call_1").execution_key != KEY


# --- command tools and hooks -----------------------------------------------------------------


COMMAND_TREE = {
    "tools.yaml": f"""
        kind: Tool
        name: env_dump
        command: {{argv: [{PY}, env.py], env: {{PLAIN: plain}}}}
    """,
    "env.py": CORRAL_VARS_PY,
    "hook.py": HOOK_PY,
}


async def test_a_command_tool_gets_its_key_and_no_other_corral_variable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_TEST_SERVER_SETTING", "from-the-server")
    definitions = compiled(tmp_path / "defs", COMMAND_TREE)
    command = CommandTool(tool(definitions, "env_dump"))
    with anyio.fail_after(15):
        keyed = await command.call({}, context(definitions.root))
        unkeyed = await command.call({}, context(definitions.root, key=""))
    assert not keyed.is_error, keyed.content
    assert json.loads(keyed.content) == {"CORRAL_EXECUTION_KEY": KEY}
    assert json.loads(unkeyed.content) == {}  # no key given: no variable, not an empty one


def hook_documents(seen: Path) -> str:
    return "---\n".join(
        yaml.safe_dump({"kind": "Hook", "name": f"{event}-record", "event": event, "matcher": "env_dump",
                        "command": [PY, "hook.py", str(seen / f"{event}.json")]})
        for event in ("pre_tool_use", "post_tool_use")
    ) + "---\n" + yaml.safe_dump({"kind": "Hook", "name": "web", "event": "pre_tool_use",
                                  "http": {"url": "http://127.0.0.1:1/replaced-below"}})


@pytest.fixture(scope="module")
def recorder() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A loopback HTTP server that records each request's path and headers (every value of each)."""
    received: list[dict[str, Any]] = []

    async def record(request: Request) -> Response:
        await request.body()
        received.append({"path": request.url.path,
                         "headers": {k: request.headers.getlist(k) for k in request.headers}})
        return PlainTextResponse("recorded")

    app = Starlette(routes=[Route("/{rest:path}", record, methods=["GET", "POST", "PUT"])])
    with serve(app) as url:
        yield url, received


async def test_the_hooks_guarding_a_call_get_its_key_too(
        tmp_path: Path, recorder: tuple[str, list[dict[str, Any]]]) -> None:
    url, received = recorder
    seen = tmp_path / "seen"
    seen.mkdir()
    hooks_yaml = hook_documents(seen).replace("http://127.0.0.1:1/replaced-below", f"{url}/hook")
    definitions = compiled(tmp_path / "defs", {**COMMAND_TREE, "hooks.yaml": hooks_yaml})
    hook_definitions = [d for d in definitions.of_kind("Hook") if isinstance(d, HookDefinition)]
    async with httpx.AsyncClient(trust_env=False) as http:
        hooks = Hooks(hook_definitions, root=definitions.root, http=http, environ={}, base={})
        guarded = Guarded(CommandTool(tool(definitions, "env_dump")), "allow", hooks, None)
        with anyio.fail_after(15):
            output = await guarded.call({}, context(definitions.root))
    assert json.loads(output.content) == {"CORRAL_EXECUTION_KEY": KEY}
    for event in ("pre_tool_use", "post_tool_use"):
        assert json.loads((seen / f"{event}.json").read_text()) == {"CORRAL_EXECUTION_KEY": KEY}, event
    # An http hook gets nothing new: no Idempotency-Key (that header is the http tools' way).
    (hook_request,) = [r for r in received if r["path"] == "/hook"]
    assert "idempotency-key" not in hook_request["headers"]


# --- http tools ------------------------------------------------------------------------------


async def test_an_http_tool_sends_the_key_as_idempotency_key_unless_it_sets_its_own(
        tmp_path: Path, recorder: tuple[str, list[dict[str, Any]]]) -> None:
    url, received = recorder
    definitions = compiled(tmp_path / "defs", {"tools.yaml": f"""
        kind: Tool
        name: plain
        http: {{method: POST, url: "{url}/plain"}}
        ---
        kind: Tool
        name: own
        input_schema: {{type: object, properties: {{id: {{type: string}}}}}}
        http: {{method: PUT, url: "{url}/own", headers: {{idempotency-KEY: "order-{{id}}"}}}}
    """})
    async with httpx.AsyncClient(trust_env=False) as http:
        plain = HttpTool(tool(definitions, "plain"), http)
        own = HttpTool(tool(definitions, "own"), http)
        with anyio.fail_after(15):
            outputs = [await plain.call({}, context(definitions.root)),
                       await plain.call({}, context(definitions.root, key="")),
                       await own.call({"id": "7"}, context(definitions.root))]
    assert all(not o.is_error for o in outputs), outputs
    keyed, unkeyed, owned = (r["headers"] for r in received if r["path"] in ("/plain", "/own"))
    assert keyed["idempotency-key"] == [KEY]
    assert "idempotency-key" not in unkeyed
    assert owned["idempotency-key"] == ["order-7"]  # the tool's own header wins, and is sent once


# --- MCP tools -------------------------------------------------------------------------------


def mcp_server(root: Path, document: str) -> tuple[MCPServerDefinition, Path]:
    definitions = compiled(root, {"s.yaml": document})
    server = definitions.get("MCPServer", "fixture")
    assert isinstance(server, MCPServerDefinition)
    return server, definitions.root


@pytest.fixture(params=["stdio", "http"])
def fixture_server(request: pytest.FixtureRequest,
                   tmp_path: Path) -> Iterator[tuple[MCPServerDefinition, Path]]:
    """The fixture MCP server, as a stdio child process or served over HTTP in this process."""
    if request.param == "stdio":
        args = json.dumps([str(FIXTURE)])
        yield mcp_server(tmp_path / "defs", f"kind: MCPServer\nname: fixture\ncommand: {PY}\nargs: {args}\n")
        return
    with serve(fixture_app()) as url:
        yield mcp_server(tmp_path / "defs", f"kind: MCPServer\nname: fixture\nurl: {url}/mcp\n")


async def test_an_mcp_call_carries_the_key_in_meta_and_replay_follows_annotations(
        fixture_server: tuple[MCPServerDefinition, Path]) -> None:
    server, root = fixture_server
    connections = MCPConnections()
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(connections.run)
            tools = {t.spec.name: t for t in await connections.tools(server, root)}
            keyed = await tools["fixture__execution_key"].call({}, context(root))
            unkeyed = await tools["fixture__execution_key"].call({}, context(root, key=""))
            (missing,) = await connections.tools(server, root, only="no_such_tool")
            tg.cancel_scope.cancel()
    assert (keyed.content, keyed.is_error) == (KEY, False)
    assert (unkeyed.content, unkeyed.is_error) == ("", False)
    safe = {name: port.replay_safe for name, port in tools.items()}
    assert safe == {"fixture__execution_key": True, "fixture__traceparent": True,  # readOnlyHint
                    "fixture__put": True,  # idempotentHint, not read-only
                    "fixture__add": False, "fixture__echo": False,  # no annotations: unsafe
                    "fixture__hang": False, "fixture__pid": False}
    assert missing.replay_safe is False


@pytest.mark.parametrize(("hints", "safe"), [
    (None, False),
    (types.ToolAnnotations(), False),
    (types.ToolAnnotations(read_only_hint=True), True),
    (types.ToolAnnotations(read_only_hint=False, idempotent_hint=True), True),
    (types.ToolAnnotations(read_only_hint=False, idempotent_hint=False, destructive_hint=True), False),
])
def test_mcp_replay_follows_read_only_and_idempotent_hints(hints: types.ToolAnnotations | None,
                                                           safe: bool) -> None:
    assert replay_safe(types.Tool(name="t", input_schema={"type": "object"}, annotations=hints)) is safe


# --- replay on Tool definitions --------------------------------------------------------------

# Written before `replay` existed, and hashed then: these digests must never change.
GOLDEN_TREE = {"tools.yaml": """
    kind: Tool
    name: echo
    description: Echo a word.
    input_schema: {type: object, properties: {word: {type: string}}}
    command: {argv: [echo, "{word}"], timeout_s: 5}
    ---
    kind: Tool
    name: fetch
    input_schema: {type: object, properties: {id: {type: string}}}
    http: {url: "https://api.example.com/items/{id}", headers: {Authorization: "Bearer ${TOKEN}"}}
    permission: ask
    ---
    kind: Model
    name: m
    provider: scripted
    ---
    kind: Agent
    name: a
    model: m
    tools: [echo, fetch]
"""}
GOLDEN = {
    "agent/a": "sha256:24c3e96ccf2b21101ee4f6faca057073db95f6514ac6b48c17097c5b4b64d693",
    "model/m": "sha256:585af55632d1fea55fec2758826374eb640d5a984590607d714cae7e52c274f9",
    "tool/echo": "sha256:302b6bb0d2ce3539d2b052f76dfa0377f325a3cc55fb37d69c9cdf5b982e1f4a",
    "tool/fetch": "sha256:f61d615ed89936959002d4b7132bd1ccee0bb41d299212d3a5ceb1a808c067fc",
}


def with_replay(value: str) -> dict[str, str]:
    text = GOLDEN_TREE["tools.yaml"]
    return {"tools.yaml": text.replace("timeout_s: 5}\n", f"timeout_s: 5}}\n    replay: {value}\n", 1)}


def test_replay_unsafe_and_an_omitted_replay_hash_as_before_the_field_existed(tmp_path: Path) -> None:
    omitted = compiled(tmp_path / "omitted", GOLDEN_TREE)
    unsafe = compiled(tmp_path / "unsafe", with_replay("unsafe"))
    assert omitted.digests() == unsafe.digests() == GOLDEN
    assert omitted.digest == unsafe.digest
    echo = tool(unsafe, "echo")
    assert "replay" not in echo.spec and echo.replay == "unsafe" and not echo.replay_safe


def test_replay_safe_is_part_of_the_digest(tmp_path: Path) -> None:
    safe = compiled(tmp_path / "safe", with_replay("safe"))
    changed = {ref for ref, digest in safe.digests().items() if GOLDEN[ref] != digest}
    assert changed == {"tool/echo", "agent/a"}  # the tool, and the agent that reaches it
    echo = tool(safe, "echo")
    assert echo.spec["replay"] == "safe" and echo.replay_safe


def test_an_unknown_replay_value_is_an_error_at_its_place(tmp_path: Path) -> None:
    with pytest.raises(DefinitionsInvalid) as caught:
        Compiler(write_tree(tmp_path / "defs", with_replay("sometimes"))).compile()
    (error,) = caught.value.errors
    assert (error.file, error.line, error.column) == ("tools.yaml", 6, 1)  # as for `permission`
    assert (error.kind, error.name, error.field) == ("Tool", "echo", "replay")
    assert "'safe' or 'unsafe'" in error.message
    assert str(error).startswith("tools.yaml:6:1: Tool/echo: replay:")


def test_the_document_schema_lists_replay() -> None:
    replay = json_schema()["$defs"]["ToolDocument"]["properties"]["replay"]
    assert replay["enum"] == ["safe", "unsafe"] and replay["default"] == "unsafe"


async def test_every_tool_of_an_agent_says_whether_it_may_be_replayed(tmp_path: Path) -> None:
    definitions = compiled(tmp_path / "defs", {
        "tools.yaml": f"""
            kind: Tool
            name: lookup
            command: {{argv: [{PY}, -c, "print(1)"]}}
            replay: safe
            ---
            kind: Tool
            name: send
            command: {{argv: [{PY}, -c, "print(1)"]}}
            ---
            kind: Tool
            name: fetch
            http: {{url: "http://127.0.0.1:1/x"}}
            replay: safe
            ---
            kind: Tool
            name: post
            http: {{method: POST, url: "http://127.0.0.1:1/x"}}
            replay: unsafe
        """,
        "agents.yaml": """
            kind: Model
            name: m
            provider: scripted
            ---
            kind: Agent
            name: main
            model: m
            tools: [lookup, send, fetch, post]
            agents: [helper]
            skills: [haiku]
            ---
            kind: Agent
            name: helper
            model: m
        """,
        "skills/haiku/SKILL.md": "---\nname: haiku\ndescription: Write haiku.\n---\nThree lines.\n",
    })
    closure = definitions.closure("main")
    assert closure is not None
    async with httpx.AsyncClient(trust_env=False) as http:
        tools = await Runtime(http, environ={}).tools(closure)
    assert {name: port.replay_safe for name, port in tools.items()} == {
        "lookup": True, "send": False, "fetch": True, "post": False,
        "activate_skill": True, "read_skill_resource": True,  # read-only
        "helper": False,  # a sub-agent's turn is resumed, never run again
    }
