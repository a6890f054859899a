"""Hooks in real turns: a real Corral on loopback runs the real hook scripts of tests/hooks/ (copied
into the definition directory, as a project would keep them) around a real command tool.

The `bash` tool appends its argument to `ran.log` before answering, so "the tool never ran" is read
from disk, not inferred from what the model said. The scripted model calls it for "run COMMAND"
and answers `tool said: {tool_result}`; any other message is echoed, which shows the user message
as the model got it (with whatever context a hook added).
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.fakes.uvicorn_thread import serve
from tests.support.client import Conversation, talk
from tests.support.events import ended, named
from tests.support.servers import corral_server
from tests.support.trees import write_tree

pytestmark = pytest.mark.anyio
PY = sys.executable
SCRIPTS = Path(__file__).parent / "hooks"
RAN_PY = """import pathlib, sys
with (pathlib.Path(sys.argv[1]) / "ran.log").open("a") as log:
    log.write(sys.argv[2] + "\\n")
print("ran: " + sys.argv[2])
"""
ALLOW_JSON = json.dumps({"hookSpecificOutput": {"hookEventName": "PreToolUse",
                                                 "permissionDecision": "allow"}})
HTTP_DENY = {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",
                                    "permissionDecisionReason": "the HTTP hook says no"}}


def hook(name: str, event: str, command: list[str], **fields: Any) -> dict[str, Any]:
    return {"kind": "Hook", "name": name, "event": event, "command": command, **fields}


def script(name: str, *args: str) -> list[str]:
    return [PY, f"hooks/{name}.py", *args]


def hook_documents(marker_dir: Path, hook_url: str) -> list[dict[str, Any]]:
    tool = {"matcher": "bash"}
    return [
        hook("block-rm", "PreToolUse", script("block_rm"), **tool),
        hook("rewrite", "pre_tool_use", script("rewrite", "command", "echo rewritten"), **tool),
        hook("add-context", "UserPromptSubmit", script("add_context")),
        hook("hang-deny", "pre_tool_use", script("hang"), timeout_s=0.5, **tool),
        hook("hang-allow", "pre_tool_use", script("hang"), timeout_s=0.5, on_error="allow", **tool),
        hook("crash-deny", "pre_tool_use", script("crash"), **tool),
        hook("crash-allow", "pre_tool_use", script("crash"), on_error="allow", **tool),
        hook("missing-deny", "pre_tool_use", ["./no-such-program"], **tool),
        {"kind": "Hook", "name": "http-deny", "event": "pre_tool_use", "matcher": "bash|other",
         "http": {"url": hook_url}, "timeout_s": 10},
        hook("allow", "pre_tool_use", script("say", ALLOW_JSON), **tool),
        hook("ask", "pre_tool_use", script("ask"), **tool),
        hook("deny", "pre_tool_use", script("say", "three hooks, and this one says no", "2"), **tool),
        hook("no-prompts", "user_prompt_submit", script("say", "no prompts on Fridays", "2")),
        hook("stop-once", "Stop", ["env", f"STOP_MARKER_DIR={marker_dir}", *script("stop_block")]),
    ]


AGENTS = {
    "blocker": ["block-rm"], "rewriter": ["rewrite"], "contexter": ["add-context"],
    "hang-deny": ["hang-deny"], "hang-allow": ["hang-allow"], "crash-deny": ["crash-deny"],
    "crash-allow": ["crash-allow"], "missing-deny": ["missing-deny"], "http-hooked": ["http-deny"],
    "strictest": ["allow", "ask", "deny"],
    "asker": ["allow", "ask"], "gatekeeper": ["no-prompts"], "persistent": ["stop-once"],
}


def definitions(root: Path, marker_dir: Path, hook_url: str) -> Path:
    shutil.copytree(SCRIPTS, root / "hooks", ignore=shutil.ignore_patterns("__pycache__"))
    agents = [{"kind": "Agent", "name": name, "model": "scripted", "tools": ["bash"], "hooks": hooks}
              for name, hooks in AGENTS.items()]
    documents = [*hook_documents(marker_dir, hook_url), *agents]
    write_tree(root, {
        "scripts/ran.py": RAN_PY,
        "definitions.yaml": "\n---\n".join(json.dumps(d) for d in documents),
        "base.yaml": rf"""
            kind: Model
            name: scripted
            provider: scripted
            script:
              - when: "^run (?P<command>.+)$"
                tool_call: {{ name: bash, arguments: {{ command: "{{command}}" }} }}
                reply: "tool said: {{tool_result}}"
            ---
            kind: Tool
            name: bash
            description: Run a command (it only writes it down).
            input_schema:
              type: object
              properties: {{ command: {{ type: string }} }}
              required: [command]
            command:
              argv: ["{PY}", scripts/ran.py, "{marker_dir}", "{{command}}"]
              timeout_s: 10
        """,
    })
    return root


class HookServer:
    """A loopback HTTP hook: records every payload and denies."""

    def __init__(self) -> None:
        self.payloads: list[dict[str, Any]] = []
        self.app = Starlette(routes=[Route("/hook", self.receive, methods=["POST"])])

    async def receive(self, request: Request) -> JSONResponse:
        self.payloads.append(await request.json())
        return JSONResponse(HTTP_DENY)


class Served:
    """The Corral serving these agents, its HTTP hook, and what the `bash` tool ran."""

    def __init__(self, url: str, marker_dir: Path, hook_server: HookServer):
        self.url = url
        self.marker_dir = marker_dir
        self.hook_server = hook_server

    def ran(self) -> list[str]:
        log = self.marker_dir / "ran.log"
        return log.read_text().splitlines() if log.exists() else []


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("hooks-e2e")
    marker_dir = root / "markers"
    marker_dir.mkdir()
    hook_server = HookServer()
    with serve(hook_server.app) as hook_url:
        defs = definitions(root / "defs", marker_dir, hook_url + "/hook")
        with corral_server(defs, root / "state") as url:
            yield Served(url, marker_dir, hook_server)


@pytest.fixture
async def client(served: Served) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=served.url, timeout=15, trust_env=False) as http:
        yield http


def tool_results(answer: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in answer["messages"] if m["role"] == "tool"]


async def test_block_rm_refuses_and_the_model_reads_why(served: Served, client: httpx.AsyncClient) -> None:
    _, answer = await talk(client, "blocker", "run rm -rf /")
    reason = "Blocked: `rm -rf /` deletes recursively; remove files one by one."
    assert answer["status"] == "completed"
    assert answer["output"] == f"tool said: permission denied for bash: {reason}"
    [result] = tool_results(answer)
    assert result["is_error"] and reason in result["content"]
    assert "rm -rf /" not in served.ran()
    _, harmless = await talk(client, "blocker", "run rm notes.txt")  # the same hook lets this one through
    assert harmless["output"] == "tool said: ran: rm notes.txt" and "rm notes.txt" in served.ran()


async def test_updated_input_is_what_the_tool_gets(served: Served, client: httpx.AsyncClient) -> None:
    _, answer = await talk(client, "rewriter", "run cat /etc/shadow")
    assert answer["output"] == "tool said: ran: echo rewritten"
    assert "cat /etc/shadow" not in served.ran() and "echo rewritten" in served.ran()


async def test_additional_context_reaches_the_model(client: httpx.AsyncClient) -> None:
    conversation, answer = await talk(client, "contexter", "what is going on?")
    context = "Sprint 42 is in progress (prompt was 17 chars)."
    assert answer["output"] == f"what is going on?\n\n{context}"  # the echo of what the model got
    messages = await conversation.messages()
    assert messages[0]["role"] == "user" and messages[0]["content"].endswith(context)


@pytest.mark.parametrize(("agent", "runs", "failure"), [
    ("hang-deny", False, "hook hang-deny timed out after 0.5s"),
    ("hang-allow", True, None),
    ("missing-deny", False, "hook missing-deny could not start: program not found: ./no-such-program"),
    # A hook that ran and crashed (exit 1) is a non-blocking error, whatever its on_error: as in
    # Claude Code, only exit 2 or a JSON deny blocks.
    ("crash-deny", True, None),
    ("crash-allow", True, None),
])
async def test_a_hook_that_fails_to_run_follows_on_error_and_a_crash_does_not_block(
        served: Served, client: httpx.AsyncClient, agent: str, runs: bool, failure: str | None) -> None:
    command = f"echo from {agent}"
    _, answer = await talk(client, agent, f"run {command}")
    assert answer["status"] == "completed"
    if runs:
        assert answer["output"] == f"tool said: ran: {command}"
    else:
        assert answer["output"] == f"tool said: permission denied for bash: {failure}"
    assert (command in served.ran()) is runs


async def test_an_http_hook_gets_the_payload_and_its_deny_holds(served: Served,
                                                                client: httpx.AsyncClient) -> None:
    conversation, answer = await talk(client, "http-hooked", "run echo over http")
    assert answer["output"] == "tool said: permission denied for bash: the HTTP hook says no"
    assert "echo over http" not in served.ran()
    [call] = [c for m in answer["messages"] for c in m.get("tool_calls", ())]
    [payload] = [p for p in served.hook_server.payloads if p["session_id"] == conversation.id]
    assert payload["hook_event_name"] == "PreToolUse"
    assert payload["tool_name"] == "bash" and payload["tool_input"] == {"command": "echo over http"}
    assert payload["tool_use_id"] == call["id"]
    assert payload["corral"] == {"agent": "http-hooked", "digest": answer["digest"],
                                 "turn_id": answer["turn_id"]}
    assert Path(payload["cwd"]).is_dir()


async def test_deny_beats_ask_beats_allow(served: Served, client: httpx.AsyncClient) -> None:
    _, answer = await talk(client, "strictest", "run echo strictest")
    assert answer["output"] == "tool said: permission denied for bash: three hooks, and this one says no"
    assert "echo strictest" not in served.ran()

    conversation = await Conversation.create(client, "asker")
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(conversation.send, "run echo asked")
            events = await conversation.events(named("permission.requested"))
            asked = events[-1].data
            assert asked["reason"] == "bash needs a human" and asked["arguments"] == {"command": "echo asked"}
            assert "echo asked" not in served.ran()
            decided = await client.post(
                f"{conversation.path}/permissions/{asked['request_id']}",
                json={"decision": "allow"})
            assert decided.status_code == 200, decided.text
        events = await conversation.events(ended())
    assert events[-1].name == "turn.completed" and "echo asked" in served.ran()


async def test_a_blocked_prompt_fails_the_turn(client: httpx.AsyncClient) -> None:
    conversation, answer = await talk(client, "gatekeeper", "run echo never")
    assert answer["status"] == "failed"
    assert answer["error"]["code"] == "prompt_blocked"
    assert "no prompts on Fridays" in answer["error"]["message"]
    events = await conversation.events(ended())
    assert events[-1].name == "turn.failed" and events[-1].data["error"]["code"] == "prompt_blocked"
    assert not [e for e in events if e.name == "tool.started"]


async def test_a_stop_hook_that_blocks_once_gets_one_more_step(client: httpx.AsyncClient) -> None:
    conversation, answer = await talk(client, "persistent", "all done")
    assert answer["status"] == "completed" and answer["output"] == "Run the tests before you finish."
    messages = await conversation.messages()
    assert [(m["role"], m["content"]) for m in messages] == [
        ("user", "all done"), ("assistant", "all done"),
        ("user", "Run the tests before you finish."), ("assistant", "Run the tests before you finish."),
    ]
    again = await conversation.say("bye")
    assert again["output"] == "bye"  # it blocked once per conversation, as the script says


async def test_a_hook_script_counts_in_the_agent_digest(tmp_path: Path) -> None:
    root = tmp_path / "defs"
    (root / "hooks").mkdir(parents=True)
    shutil.copy(SCRIPTS / "block_rm.py", root / "hooks" / "block_rm.py")
    write_tree(root, {"agent.yaml": f"""
        kind: Model
        name: scripted
        provider: scripted
        ---
        kind: Hook
        name: guard
        event: pre_tool_use
        command: ["{PY}", hooks/block_rm.py]
        ---
        kind: Agent
        name: guarded
        model: scripted
        hooks: [guard]
    """})
    with corral_server(root, tmp_path / "state") as url:
        async with httpx.AsyncClient(base_url=url, timeout=15, trust_env=False) as http:
            before = (await http.get("/v1/agents/guarded")).json()["digest"]
            hook_before = (await http.get("/v1/definitions/hook/guard")).json()["digest"]
            with (root / "hooks" / "block_rm.py").open("a") as f:
                f.write("# stricter soon\n")
            report = (await http.post("/v1/definitions/reload")).json()
            after = (await http.get("/v1/agents/guarded")).json()["digest"]
            hook_after = (await http.get("/v1/definitions/hook/guard")).json()["digest"]
    assert report["status"] == "applied"
    assert {(c["kind"], c["name"]) for c in report["changes"]} == {("Hook", "guard"), ("Agent", "guarded")}
    assert before != after and hook_before != hook_after
