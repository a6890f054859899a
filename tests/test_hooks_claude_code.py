"""Claude Code's hook scripts run unchanged: real scripts as its documentation writes them, in real
turns of a real Corral on loopback, around a command Tool named `Bash` and the tools of a real MCP
server (tests/mcp_fixture_server.py over stdio, the MCPServer `fixture`).

- `examples/hooks/hooks/bash_command_validator.py` is the docs' "Bash command validation"
  example: exit 2 with its reasons on stderr blocks; for any other tool it exits 1, a
  non-blocking error in Claude Code (logged; the call goes on), whatever the hook's `on_error`.
- `hooks/no_push.sh` is plain POSIX shell, no jq: it refuses `git push` with exit 2.
- `hooks/record_transcript.py` writes down its input and what `transcript_path` held while it ran;
  its matcher `mcp__fixture__.*` is on the name hooks know an MCP tool by, while the model calls
  the tool `fixture__echo`.

The `Bash` tool appends its command to `ran.log`, so "the tool never ran" is read from disk.
"""

from __future__ import annotations

import json
import logging
import shutil
import stat
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from server.compiler.compiler import Compiler
from server.errors import DefinitionsInvalid
from tests.support.client import Conversation, talk
from tests.support.servers import corral_server
from tests.support.trees import write_tree

pytestmark = pytest.mark.anyio
PY = sys.executable
SCRIPTS = Path(__file__).parent / "hooks"
# The example ships the docs' validator; the tests run that very file.
VALIDATOR = Path(__file__).resolve().parents[1] / "examples/hooks/hooks/bash_command_validator.py"
FIXTURE = Path(__file__).parent / "mcp_fixture_server.py"
RAN_PY = """import pathlib, sys
with (pathlib.Path(sys.argv[1]) / "ran.log").open("a") as log:
    log.write(sys.argv[2] + "\\n")
print("ran: " + sys.argv[2])
"""
GREP_REASON = "• Use 'rg' (ripgrep) instead of 'grep' for better performance and features"
API_ONLY = ("seq", "turn_id", "created_at")  # what the API adds to a message's `to_json()`


def hook(name: str, matcher: str, command: list[str], **fields: Any) -> dict[str, Any]:
    return {"kind": "Hook", "name": name, "event": "PreToolUse", "matcher": matcher, "command": command,
            **fields}


def definitions(root: Path, markers: Path) -> Path:
    shutil.copytree(SCRIPTS, root / "hooks", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(VALIDATOR, root / "hooks" / VALIDATOR.name)
    validator = [PY, "hooks/bash_command_validator.py"]
    recorder = [PY, "hooks/record_transcript.py", str(markers / "mcp.jsonl")]
    documents = [
        hook("validate-bash", "Bash", validator),  # as the docs configure it
        hook("validate-everything", "*", validator, on_error="deny"),  # exit 1 is no failure to run
        hook("no-push", "Bash", ["sh", "hooks/no_push.sh"]),
        hook("record-mcp", "mcp__fixture__.*", recorder),
        {"kind": "Agent", "name": "coder", "model": "scripted", "tools": ["Bash", "fixture"],
         "hooks": ["validate-bash", "no-push", "record-mcp"]},
        {"kind": "Agent", "name": "everywhere", "model": "scripted", "tools": ["Bash", "fixture"],
         "hooks": ["validate-everything"]},
        {"kind": "MCPServer", "name": "fixture", "command": PY, "args": [str(FIXTURE)], "timeout_s": 10},
    ]
    write_tree(root, {
        "scripts/ran.py": RAN_PY,
        "definitions.yaml": "\n---\n".join(json.dumps(d) for d in documents),
        "base.yaml": rf"""
            kind: Model
            name: scripted
            provider: scripted
            script:
              - when: "^run (?P<command>.+)$"
                tool_call: {{ name: Bash, arguments: {{ command: "{{command}}" }} }}
                reply: "tool said: {{tool_result}}"
              - when: "^echo (?P<text>.+)$"
                tool_call: {{ name: fixture__echo, arguments: {{ text: "{{text}}" }} }}
                reply: "fixture said: {{tool_result}}"
            ---
            kind: Tool
            name: Bash
            description: Run a command (it only writes it down).
            input_schema:
              type: object
              properties: {{ command: {{ type: string }} }}
              required: [command]
            command:
              argv: ["{PY}", scripts/ran.py, "{markers}", "{{command}}"]
              timeout_s: 10
        """,
    })
    return root


@dataclass
class Served:
    url: str
    state: Path
    markers: Path

    def ran(self) -> list[str]:
        log = self.markers / "ran.log"
        return log.read_text().splitlines() if log.exists() else []

    def recorded(self, conversation_id: str) -> list[dict[str, Any]]:
        """What `record-mcp` wrote down in this conversation, in order."""
        log = self.markers / "mcp.jsonl"
        lines = log.read_text().splitlines() if log.exists() else []
        return [r for r in map(json.loads, lines) if r["input"]["session_id"] == conversation_id]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("claude-code-hooks")
    markers = root / "markers"
    markers.mkdir()
    with corral_server(definitions(root / "defs", markers), root / "state") as url:
        yield Served(url, root / "state", markers)


@pytest.fixture
async def client(served: Served) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=served.url, timeout=30, trust_env=False) as http:
        yield http


def hook_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "corral.hooks" and r.levelno == logging.WARNING]


async def test_the_documented_validator_blocks_bash_with_exit_2_and_its_stderr_as_the_reason(
        served: Served, client: httpx.AsyncClient) -> None:
    _, blocked = await talk(client, "coder", "run grep -r TODO src")
    assert blocked["status"] == "completed"
    assert blocked["output"] == f"tool said: permission denied for Bash: {GREP_REASON}"
    assert "grep -r TODO src" not in served.ran()
    _, allowed = await talk(client, "coder", "run ls -la")
    assert allowed["output"] == "tool said: ran: ls -la" and "ls -la" in served.ran()


async def test_a_plain_shell_hook_blocks_with_exit_2(served: Served, client: httpx.AsyncClient) -> None:
    _, answer = await talk(client, "coder", "run git push origin main")
    reason = "Blocked: git push needs a review first."
    assert answer["output"] == f"tool said: permission denied for Bash: {reason}"
    assert "git push origin main" not in served.ran()


async def test_exit_1_is_logged_and_the_call_goes_on(served: Served, client: httpx.AsyncClient,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="corral.hooks"):
        _, answer = await talk(client, "everywhere", "echo through anyway")  # not Bash: the script exits 1
    assert answer["status"] == "completed" and answer["output"] == "fixture said: through anyway"
    [warning] = hook_warnings(caplog)
    assert warning.startswith("hook validate-everything on pre_tool_use: exit code 1 (a non-blocking error")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="corral.hooks"):
        _, blocked = await talk(client, "everywhere", "run grep needle hay.txt")  # the same hook still blocks
    assert blocked["output"] == f"tool said: permission denied for Bash: {GREP_REASON}"
    assert "grep needle hay.txt" not in served.ran() and hook_warnings(caplog) == []


async def test_a_matcher_on_mcp__server__tool_fires_and_the_model_still_sees_server__tool(
        served: Served, client: httpx.AsyncClient) -> None:
    conversation, answer = await talk(client, "coder", "echo over mcp")
    assert answer["output"] == "fixture said: over mcp"
    [call] = [c for m in answer["messages"] for c in m.get("tool_calls", ())]
    [result] = [m for m in answer["messages"] if m["role"] == "tool"]
    assert call["name"] == result["name"] == "fixture__echo"
    [recorded] = served.recorded(conversation.id)
    assert recorded["input"]["hook_event_name"] == "PreToolUse"
    assert recorded["input"]["tool_name"] == "mcp__fixture__echo"
    assert recorded["input"]["tool_input"] == {"text": "over mcp"}
    assert recorded["input"]["tool_use_id"] == call["id"]
    await conversation.say("run echo not mcp")  # the Bash tool: the matcher leaves it alone
    assert len(served.recorded(conversation.id)) == 1


async def test_transcript_path_holds_the_conversation_so_far_and_permission_mode_is_default(
        served: Served, client: httpx.AsyncClient) -> None:
    conversation = await Conversation.create(client, "coder")
    await conversation.say("hello")
    await conversation.say("echo first")
    await conversation.say("echo second")
    stored = [{k: v for k, v in m.items() if k not in API_ONLY} for m in await conversation.messages()]
    first, second = served.recorded(conversation.id)
    path = served.state / "transcripts" / f"{conversation.id}.jsonl"
    for seen in (first, second):
        assert Path(seen["input"]["transcript_path"]) == path
        assert seen["input"]["permission_mode"] == "default"
        assert seen["input"]["session_id"] == conversation.id
    # hello / hello, then the user's message and the model's call: what the turn added so far
    assert first["transcript"] == stored[:4]
    assert [m["role"] for m in first["transcript"]] == ["user", "assistant", "user", "assistant"]
    assert first["transcript"][3]["tool_calls"][0]["name"] == "fixture__echo"
    assert second["transcript"] == stored[:8]  # the first tool call's turn, whole, is history now
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_Bash_and_bash_in_one_set_is_a_compile_error(tmp_path: Path) -> None:
    tool = "kind: Tool\nname: {name}\ncommand: {{argv: [echo, hi]}}\n"
    write_tree(tmp_path, {
        "claude.yaml": tool.format(name="Bash"),
        "more/tools.yaml": "kind: Model\nname: m\nprovider: scripted\n---\n" + tool.format(name="bash"),
    })
    with pytest.raises(DefinitionsInvalid) as caught:
        Compiler(tmp_path).compile()
    assert sorted(map(str, caught.value.errors)) == [
        "claude.yaml:2:1: Tool/Bash: name: Tool names are unique regardless of case: "
        "'Bash' and 'bash' differ only in case; rename one",
        "more/tools.yaml:6:1: Tool/bash: name: Tool names are unique regardless of case: "
        "'bash' and 'Bash' differ only in case; rename one",
    ]
