"""A Tool with `a2a: {url, headers}` calls a remote A2A agent (CONTRACT §14): here a second real
`corral serve`, behind an API key the tool sends as a `${VAR}` secret. One message per call, the
remote context kept per Corral conversation; `corral lock` pins the card by digest under
`a2a_cards`; a card that drifts is reported, and refused in locked mode.

The remote's scripted model answers "say X" with "said X"; the local one turns "ask X" into a call
of the `ask_remote` tool with message X and answers "remote said: <the tool's result>".
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from server.canonical import digest_of, thaw
from server.compiler.compiler import Compiler
from server.compiler.definitions import ToolDefinition
from server.errors import DefinitionsInvalid
from tests.support.servers import REPO, ServerProcess, clean_environ
from tests.support.trees import write_atomic, write_tree

pytestmark = pytest.mark.anyio
REMOTE_KEY = "rk-a2a-5c0f27e1b9"


def remote_definitions(root: Path, description: str = "Says things.") -> Path:
    documents = [
        {"kind": "Model", "name": "scripted", "provider": "scripted",
         "script": [{"when": "^say (?P<what>.+)$", "reply": "said {what}"}]},
        {"kind": "Agent", "name": "helper", "description": description, "model": "scripted"},
    ]
    return write_tree(root, {"defs.yaml": "\n---\n".join(json.dumps(d) for d in documents)})


def local_definitions(root: Path, remote_url: str) -> Path:
    documents = [
        {"kind": "Model", "name": "scripted", "provider": "scripted",
         "script": [{"when": "^ask (?P<what>.+)$",
                     "tool_call": {"name": "ask_remote", "arguments": {"message": "{what}"}},
                     "reply": "remote said: {tool_result}"}]},
        {"kind": "Tool", "name": "ask_remote", "description": "Ask the remote helper.",
         "a2a": {"url": f"{remote_url}/a2a/helper/.well-known/agent-card.json",
                 "headers": {"Authorization": "Bearer ${REMOTE_KEY}"}}},
        {"kind": "Agent", "name": "asker", "model": "scripted", "tools": ["ask_remote"]},
    ]
    return write_tree(root, {"defs.yaml": "\n---\n".join(json.dumps(d) for d in documents)})


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("remote")
    with ServerProcess(remote_definitions(root / "defs"), root / "state",
                       env={"CORRAL_API_KEYS": REMOTE_KEY, "CORRAL_LOG_LEVEL": "debug"}) as running:
        yield running


def local(defs: Path, state: Path, **env: str) -> ServerProcess:
    return ServerProcess(defs, state, env={"REMOTE_KEY": REMOTE_KEY, **env})


async def ask(client: httpx.AsyncClient, conversation_id: str, text: str) -> dict[str, Any]:
    reply = await client.post(f"/v1/conversations/{conversation_id}/messages", json={"content": text})
    assert reply.status_code == 200, reply.text
    return reply.json()


async def new_conversation(client: httpx.AsyncClient) -> str:
    reply = await client.post("/v1/conversations", json={"agent": "asker"})
    assert reply.status_code == 201, reply.text
    return reply.json()["id"]


async def remote_turn_inputs(remote: ServerProcess) -> list[list[str]]:
    """The inputs of each conversation of the remote helper, oldest conversation first."""
    async with httpx.AsyncClient(base_url=remote.url, headers={"Authorization": f"Bearer {REMOTE_KEY}"},
                                 timeout=30, trust_env=False) as client:
        conversations = (await client.get("/v1/conversations", params={"agent": "helper"})).json()["items"]
        out = []
        for conversation in reversed(conversations):
            turns = (await client.get(f"/v1/conversations/{conversation['id']}/turns")).json()["items"]
            out.append([t["input"] for t in turns])
        return out


def corral_lock(defs: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "server.cli", "lock", str(defs), *args], cwd=REPO,
                          env=clean_environ({"REMOTE_KEY": REMOTE_KEY}), capture_output=True, text=True,
                          timeout=60)


async def test_the_tool_asks_the_remote_agent_and_a_follow_up_continues_its_context(
        remote: ServerProcess, tmp_path: Path) -> None:
    defs = local_definitions(tmp_path / "defs", remote.url)
    with local(defs, tmp_path / "state", CORRAL_LOG_LEVEL="debug") as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=60, trust_env=False) as client:
            conversation = await new_conversation(client)
            first = await ask(client, conversation, "ask say hello")
            assert first["status"] == "completed" and first["output"] == "remote said: said hello"
            second = await ask(client, conversation, "ask say again")
            assert second["output"] == "remote said: said again"
            other = await new_conversation(client)
            assert (await ask(client, other, "ask say elsewhere"))["output"] == "remote said: said elsewhere"
        assert REMOTE_KEY not in server.stderr  # the secret header is never logged
        # nor, at debug, what the SDK would log: the card it fetched, the bodies it sent or received
        assert not re.search(r"(DEBUG|INFO) a2a\.", server.stderr + remote.stderr)
        assert "say hello" not in remote.stderr
    assert (await remote_turn_inputs(remote))[-2:] == [["say hello", "say again"], ["say elsewhere"]]


async def test_lock_pins_the_card_and_a_drifted_card_is_reported_and_refused_in_locked_mode(
        tmp_path: Path) -> None:
    remote_defs = remote_definitions(tmp_path / "remote")
    with ServerProcess(remote_defs, tmp_path / "remote-state", env={"CORRAL_API_KEYS": REMOTE_KEY}) as remote:
        card_url = f"{remote.url}/a2a/helper/.well-known/agent-card.json"
        auth = {"Authorization": f"Bearer {REMOTE_KEY}"}
        defs = local_definitions(tmp_path / "defs", remote.url)
        wrote = corral_lock(defs)
        assert wrote.returncode == 0, wrote.stderr
        lock = json.loads((defs / "corral.lock").read_text())
        served = httpx.get(card_url, headers=auth, trust_env=False).json()
        assert lock["a2a_cards"] == {"ask_remote": digest_of(served)}
        assert corral_lock(defs, "--check").returncode == 0

        # the remote agent changes: its card names another digest
        write_atomic(remote_defs / "defs.yaml", (remote_defs / "defs.yaml").read_text().replace(
            "Says things.", "Says other things."))
        reloaded = httpx.post(f"{remote.url}/v1/definitions/reload", headers=auth, trust_env=False,
                              timeout=30)
        assert reloaded.status_code == 200, reloaded.text
        checked = corral_lock(defs, "--check")
        assert checked.returncode == 1 and "a2a/ask_remote" in checked.stdout, checked.stdout + checked.stderr

        with local(defs, tmp_path / "locked-state", CORRAL_LOCKED="1") as server:
            async with httpx.AsyncClient(base_url=server.url, timeout=60, trust_env=False) as client:
                answer = await ask(client, await new_conversation(client), "ask say hi")
            assert "drifted from corral.lock" in answer["output"] and "refused" in answer["output"]
            assert "A2A tool ask_remote: agent card drifted" in server.stderr
        with local(defs, tmp_path / "unlocked-state") as server:  # unlocked: reported, and the call goes on
            async with httpx.AsyncClient(base_url=server.url, timeout=60, trust_env=False) as client:
                answer = await ask(client, await new_conversation(client), "ask say hi")
            assert answer["output"] == "remote said: said hi"
            assert "A2A tool ask_remote: agent card drifted" in server.stderr


def test_an_a2a_tool_compiles_with_a_message_schema_and_its_mistakes_are_named(tmp_path: Path) -> None:
    defs = local_definitions(tmp_path / "good", "http://127.0.0.1:1")
    tool = Compiler(defs).compile().get("Tool", "ask_remote")
    assert isinstance(tool, ToolDefinition) and tool.a2a is not None
    assert thaw(tool.input_schema) == {"type": "object", "properties": {"message": {"type": "string"}},
                                       "required": ["message"]}
    # the secret stays a reference: its value never enters the spec or the digest
    assert thaw(tool.a2a)["headers"] == {"Authorization": "Bearer ${REMOTE_KEY}"}
    bad = [
        {"kind": "Tool", "name": "both", "a2a": {"url": "http://127.0.0.1:1/a2a/x"},
         "command": {"argv": ["true"]}},
        {"kind": "Tool", "name": "nowhere", "a2a": {"url": "ftp://example.com/card.json"}},
        {"kind": "Tool", "name": "typo", "a2a": {"url": "http://127.0.0.1:1/a2a/x", "header": {}}},
    ]
    root = write_tree(tmp_path / "bad", {"defs.yaml": "\n---\n".join(json.dumps(d) for d in bad)})
    with pytest.raises(DefinitionsInvalid) as raised:
        Compiler(root).compile()
    problems = {(e.name, e.field): e.message for e in raised.value.errors}
    assert any(name == "both" and "exactly one of `http`, `command` or `a2a`" in message
               for (name, _), message in problems.items()), problems
    assert any(name == "nowhere" and "a2a.url" in field for name, field in problems), problems
    assert any(name == "typo" and "header" in field for name, field in problems), problems
