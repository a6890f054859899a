"""Hooks against real hook scripts (tests/hooks/, written as for Claude Code) and a real loopback
HTTP server.

Every hook is compiled from YAML by the real compiler, so `files` resolution, event aliases,
matcher normalization and `on_error` defaults are the product's own.
"""

from __future__ import annotations

import json
import logging
import shutil
import socket
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from server.compiler.compiler import Compiler
from server.compiler.definitions import HookDefinition
from server.errors import DefinitionsInvalid
from server.messages import AssistantMessage, Message, ToolCall, UserMessage
from server.runtime.hooks import EVENT_NAMES, Hooks, Transcript, Verdict
from tests.fakes.uvicorn_thread import serve
from tests.support.processes import alive, wait_until

PY = sys.executable
SCRIPTS = Path(__file__).parent / "hooks"
SECRET = "s3cret-hook-token-9f8e7d"
BASE = {"session_id": "conv_1", "cwd": "/srv/project",
        "corral": {"agent": "coder", "digest": "sha256:abc", "turn_id": "turn_1"}}
BASH = {"tool_name": "Bash", "tool_input": {"command": "ls -la"}, "tool_use_id": "toolu_1"}


def script(name: str, *args: str) -> list[str]:
    return [PY, f"hooks/{name}.py", *args]


def compile_hooks(root: Path, *specs: dict[str, Any]) -> tuple[list[HookDefinition], Path]:
    """Write the hook scripts and one YAML file of Hook documents under `root`; compile them."""
    shutil.copytree(SCRIPTS, root / "hooks", ignore=shutil.ignore_patterns("__pycache__"))
    documents = [{"kind": "Hook", "name": f"h{i}", **spec} for i, spec in enumerate(specs)]
    (root / "hooks.yaml").write_text(yaml.safe_dump_all(documents, sort_keys=False))
    compiler = Compiler(root)
    try:
        compiled = compiler.compile()
    except DefinitionsInvalid as exc:
        raise AssertionError("\n".join(map(str, exc.errors))) from None
    hooks = [compiled.get("Hook", doc["name"]) for doc in documents]
    assert all(isinstance(hook, HookDefinition) for hook in hooks)
    return hooks, compiler.root  # type: ignore[return-value]


async def run_hooks(root: Path, specs: list[dict[str, Any]], event: str, payload: dict[str, Any],
                    environ: dict[str, str] | None = None, bound: float = 15) -> Verdict:
    definitions, root = compile_hooks(root, *specs)
    async with httpx.AsyncClient(trust_env=False) as http:
        hooks = Hooks(definitions, root=root, http=http, environ=environ or {}, base=BASE)
        with anyio.fail_after(bound):
            return await hooks.run(event, payload)


def bash(command: str) -> dict[str, Any]:
    return {**BASH, "tool_input": {"command": command}}


# --- command hooks -------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("command", ["rm -rf /", "cd /tmp && rm -fr build", "rm -r -f ~"])
async def test_exit_2_denies_with_stderr_as_the_reason(tmp_path: Path, command: str) -> None:
    hook = {"event": "pre_tool_use", "matcher": "Bash", "command": script("block_rm")}
    verdict = await run_hooks(tmp_path, [hook], "pre_tool_use", bash(command))
    assert verdict == Verdict("deny", f"Blocked: `{command}` deletes recursively; remove files one by one.")


@pytest.mark.anyio
async def test_an_executable_script_named_as_a_string_runs_from_the_definition_directory(
        tmp_path: Path) -> None:
    # As in a Claude Code settings file: the script itself, with its shebang (here: this Python).
    executable = tmp_path / "bin" / "guard"
    executable.parent.mkdir()
    executable.write_text(f"#!{PY}\n" + (SCRIPTS / "block_rm.py").read_text().split("\n", 1)[1])
    executable.chmod(0o755)
    hook = {"event": "pre_tool_use", "command": "bin/guard"}
    definitions, root = compile_hooks(tmp_path, hook)
    assert definitions[0].command == ("bin/guard",) and set(definitions[0].files) == {"bin/guard"}
    async with httpx.AsyncClient(trust_env=False) as http:
        hooks = Hooks(definitions, root=root, http=http, environ={}, base=BASE)
        with anyio.fail_after(15):
            verdict = await hooks.run("pre_tool_use", bash("rm -rf /"))
    assert verdict.decision == "deny" and verdict.reason and verdict.reason.startswith("Blocked:")


@pytest.mark.anyio
async def test_exit_0_without_output_allows(tmp_path: Path) -> None:
    hook = {"event": "pre_tool_use", "matcher": "Bash", "command": script("block_rm")}
    assert await run_hooks(tmp_path, [hook], "pre_tool_use", bash("rm notes.txt")) == Verdict()


@pytest.mark.anyio
async def test_updated_input_rewrites_the_arguments(tmp_path: Path) -> None:
    hook = {"event": "pre_tool_use", "command": script("rewrite", "command", "ls")}
    verdict = await run_hooks(tmp_path, [hook], "pre_tool_use", bash("ls -la"))
    assert verdict == Verdict("allow", "command rewritten", updated_input={"command": "ls"})


@pytest.mark.anyio
async def test_additional_context_for_a_prompt(tmp_path: Path) -> None:
    hooks = [{"event": "UserPromptSubmit", "command": script("add_context")},
             {"event": "user_prompt_submit", "command": script("say", "Plain text is context too.")}]
    verdict = await run_hooks(tmp_path, hooks, "user_prompt_submit", {"prompt": "fix the bug"})
    assert verdict == Verdict(context=("Sprint 42 is in progress (prompt was 11 chars).",
                                       "Plain text is context too."))


@pytest.mark.anyio
async def test_plain_text_is_ignored_for_tool_events(tmp_path: Path) -> None:
    hook = {"event": "pre_tool_use", "command": script("say", "checked, looks fine")}
    assert await run_hooks(tmp_path, [hook], "pre_tool_use", BASH) == Verdict()


@pytest.mark.anyio
async def test_command_hook_gets_the_payload_the_project_dir_and_cwd(tmp_path: Path) -> None:
    seen = tmp_path / "seen.json"
    hook = {"event": "post_tool_use", "command": script("record", str(seen))}
    payload = {**BASH, "tool_response": {"stdout": "total 0", "exit_code": 0}}
    assert await run_hooks(tmp_path / "defs", [hook], "post_tool_use", payload) == Verdict()
    root = str((tmp_path / "defs").resolve())
    assert json.loads(seen.read_text()) == {
        "stdin": {**BASE, "permission_mode": "default", "hook_event_name": "PostToolUse", **payload},
        "cwd": root, "CORRAL_PROJECT_DIR": None, "CLAUDE_PROJECT_DIR": root,  # no CORRAL_* reaches a hook
    }


@pytest.mark.anyio
async def test_transcript_path_is_the_conversation_so_far_written_before_each_run(tmp_path: Path) -> None:
    seen = tmp_path / "seen.json"
    definitions, root = compile_hooks(tmp_path / "defs",
                                      {"event": "pre_tool_use", "command": script("record", str(seen))})
    call = ToolCall(id="toolu_1", name="Bash", arguments={"command": "ls"})
    messages: list[Message] = [UserMessage(content="list the files"), AssistantMessage(tool_calls=(call,))]
    transcript = Transcript.of(tmp_path / "transcripts", "conv_1", lambda: messages)
    async with httpx.AsyncClient(trust_env=False) as http:
        hooks = Hooks(definitions, root=root, http=http, environ={}, base=BASE, transcript=transcript)
        with anyio.fail_after(15):
            await hooks.run("pre_tool_use", BASH)
            path = tmp_path / "transcripts" / "conv_1.jsonl"
            assert json.loads(seen.read_text())["stdin"] == {
                **BASE, "transcript_path": str(path), "permission_mode": "default",
                "hook_event_name": "PreToolUse", **BASH}
            assert [json.loads(line) for line in path.read_text().splitlines()] == [
                m.to_json() for m in messages]
            messages.append(UserMessage(content="and again"))
            await hooks.run("pre_tool_use", BASH)
    assert len(path.read_text().splitlines()) == 3  # brought up to date before the run
    assert Transcript.of(tmp_path, "../../etc/x", list).path.parent == tmp_path  # an id is never a path


@pytest.mark.anyio
@pytest.mark.parametrize(("on_error", "expected"), [
    (None, Verdict("deny", "hook h0 timed out after 0.5s")),  # the default for pre_tool_use
    ("allow", Verdict()),
])
async def test_a_hanging_hook_is_killed_and_follows_on_error(
        tmp_path: Path, on_error: str | None, expected: Verdict) -> None:
    pidfile = tmp_path / "hang.pid"
    hook = {"event": "pre_tool_use", "command": script("hang", str(pidfile)), "timeout_s": 0.5}
    if on_error:
        hook["on_error"] = on_error
    verdict = await run_hooks(tmp_path / "defs", [hook], "pre_tool_use", BASH)
    assert verdict == expected
    pid = int(pidfile.read_text())
    await wait_until(lambda: not alive(pid))


@pytest.mark.anyio
async def test_a_cancelled_run_kills_its_hooks(tmp_path: Path) -> None:
    pidfile = tmp_path / "hang.pid"
    definitions, root = compile_hooks(tmp_path / "defs",
                                      {"event": "pre_tool_use", "command": script("hang", str(pidfile))})
    async with httpx.AsyncClient(trust_env=False) as http:
        hooks = Hooks(definitions, root=root, http=http, environ={}, base=BASE)
        with anyio.fail_after(15):
            async with anyio.create_task_group() as group:
                group.start_soon(hooks.run, "pre_tool_use", BASH)
                await wait_until(pidfile.exists, bound=10)
                group.cancel_scope.cancel()
    pid = int(pidfile.read_text())
    await wait_until(lambda: not alive(pid))


@pytest.mark.anyio
@pytest.mark.parametrize(("event", "payload"), [
    ("pre_tool_use", BASH),  # where on_error defaults to deny: a crash is not a failure to run
    ("user_prompt_submit", {"prompt": "hi"}),
    ("post_tool_use", {**BASH, "tool_response": "ok"}),
    ("stop", {}),
])
async def test_a_crashing_hook_is_a_non_blocking_error_that_is_logged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, event: str, payload: dict) -> None:
    # As in Claude Code: any exit status but 0 and 2 lets the call (or the turn) go on.
    hook = {"event": event, "command": script("crash")}
    with caplog.at_level(logging.WARNING, logger="corral.hooks"):
        assert await run_hooks(tmp_path, [hook], event, payload) == Verdict()
    [record] = [r for r in caplog.records if r.name == "corral.hooks"]
    assert record.levelno == logging.WARNING
    assert record.getMessage().startswith(f"hook h0 on {event}: exit code 1, stderr: ")
    assert f"RuntimeError: cannot handle {EVENT_NAMES[event]}" in record.getMessage()
    assert "a non-blocking error" in record.getMessage()


@pytest.mark.anyio
async def test_a_hook_that_cannot_start_follows_on_error(tmp_path: Path) -> None:
    specs = [{"event": "pre_tool_use", "command": ["./no-such-hook"]},
             {"event": "pre_tool_use", "command": ["./no-such-hook"], "on_error": "allow"}]
    definitions, root = compile_hooks(tmp_path, *specs)
    async with httpx.AsyncClient(trust_env=False) as http:
        deny, allow = (Hooks([d], root=root, http=http, environ={}, base=BASE) for d in definitions)
        with anyio.fail_after(15):
            assert await deny.run("pre_tool_use", BASH) == Verdict(
                "deny", "hook h0 could not start: program not found: ./no-such-hook")
            assert await allow.run("pre_tool_use", BASH) == Verdict()


@pytest.mark.anyio
@pytest.mark.parametrize(("argv", "warning"), [
    (script("say", "{not json"), "printed invalid JSON, read as plain text"),
    (script("say", '{"hookSpecificOutput": {"permissionDecision": "maybe"}}'),
     "unknown permissionDecision 'maybe': its answer is ignored"),
    (script("say", '{"hookSpecificOutput": "deny"}'), "hookSpecificOutput is not an object"),
    (script("say", '{"decision": "block", "reason": "no"}', "3"), "exit code 3"),  # JSON: on exit 0 only
])
async def test_answers_the_protocol_cannot_read_are_non_blocking_errors(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, argv: list[str], warning: str) -> None:
    hook = {"event": "pre_tool_use", "command": argv}  # on_error: deny, which does not apply
    with caplog.at_level(logging.WARNING, logger="corral.hooks"):
        assert await run_hooks(tmp_path, [hook], "pre_tool_use", BASH) == Verdict()
    assert f"hook h0 on pre_tool_use: {warning}" in caplog.text


@pytest.mark.anyio
async def test_stdout_that_is_not_json_is_plain_text_context_for_a_prompt(tmp_path: Path) -> None:
    hook = {"event": "user_prompt_submit", "command": script("say", "{branch} is main")}
    verdict = await run_hooks(tmp_path, [hook], "user_prompt_submit", {"prompt": "hi"})
    assert verdict == Verdict(context=("{branch} is main",))


@pytest.mark.anyio
@pytest.mark.parametrize(("event", "answer", "expected"), [
    ("post_tool_use", {"decision": "block", "reason": "output has a password"},
     Verdict("deny", "output has a password")),
    ("pre_tool_use", {"decision": "approve", "reason": "safe"}, Verdict("allow", "safe")),
    ("pre_tool_use", {"continue": False, "stopReason": "budget spent"}, Verdict("deny", "budget spent")),
    ("pre_tool_use", {"decision": "block"}, Verdict("deny", "blocked by hook h0")),
    ("pre_tool_use", {"hookSpecificOutput": {"permissionDecision": "deny"}, "decision": "approve"},
     Verdict("deny", "blocked by hook h0")),
    ("post_tool_use", {"hookSpecificOutput": {"hookEventName": "PostToolUse", "additionalContext": "ok"}},
     Verdict(context=("ok",))),
])
async def test_json_answers(tmp_path: Path, event: str, answer: dict, expected: Verdict) -> None:
    hook = {"event": event, "command": script("say", json.dumps(answer))}
    assert await run_hooks(tmp_path, [hook], event, {**BASH, "tool_response": "x"}) == expected


@pytest.mark.anyio
async def test_stop_hook_makes_the_agent_continue_once(tmp_path: Path) -> None:
    definitions, root = compile_hooks(tmp_path / "defs",
                                      {"event": "Stop", "command": script("stop_block", str(tmp_path))})
    async with httpx.AsyncClient(trust_env=False) as http:
        hooks = Hooks(definitions, root=root, http=http, environ={}, base=BASE)
        with anyio.fail_after(15):
            first = await hooks.run("stop", {"stop_hook_active": False})
            second = await hooks.run("Stop", {"stop_hook_active": False})
    reason = "Run the tests before you finish."
    assert first == Verdict("deny", reason, stop_continue=reason)
    assert second == Verdict()


@pytest.mark.anyio
async def test_continue_false_overrides_a_stop_block(tmp_path: Path) -> None:
    hooks = [{"event": "stop", "command": script("stop_block", str(tmp_path))},
             {"event": "stop", "command": script("say", '{"continue": false, "stopReason": "enough"}')}]
    verdict = await run_hooks(tmp_path / "defs", hooks, "stop", {})
    assert verdict == Verdict("deny", "Run the tests before you finish.\nenough")
    assert verdict.stop_continue is None


# --- several hooks -------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_deny_beats_ask_beats_allow(tmp_path: Path) -> None:
    rewrite = {"event": "pre_tool_use", "command": script("rewrite", "command", "rm -rf /tmp/x")}
    ask = {"event": "pre_tool_use", "command": script("ask")}
    block = {"event": "pre_tool_use", "command": script("block_rm")}
    rm = bash("rm -rf /")
    assert await run_hooks(tmp_path / "1", [rewrite, ask, block], "pre_tool_use", rm) == Verdict(
        "deny", "Blocked: `rm -rf /` deletes recursively; remove files one by one.",
        updated_input={"command": "rm -rf /tmp/x"})
    assert await run_hooks(tmp_path / "2", [rewrite, ask, block], "pre_tool_use", bash("ls")) == Verdict(
        "ask", "Bash needs a human", updated_input={"command": "rm -rf /tmp/x"})


@pytest.mark.anyio
async def test_reasons_of_the_winning_decision_are_joined_in_declared_order(tmp_path: Path) -> None:
    hooks = [{"event": "pre_tool_use", "command": script("say", "first reason", "2")},
             {"event": "pre_tool_use", "command": script("ask")},
             {"event": "pre_tool_use", "command": script("say", "second reason", "2")}]
    verdict = await run_hooks(tmp_path, hooks, "pre_tool_use", BASH)
    assert verdict == Verdict("deny", "first reason\nsecond reason")


@pytest.mark.anyio
async def test_updated_inputs_apply_in_declared_order(tmp_path: Path) -> None:
    hooks = [{"event": "pre_tool_use", "command": script("rewrite", "command", "first")},
             {"event": "pre_tool_use", "command": script("rewrite", "timeout", "30")},
             {"event": "pre_tool_use", "command": script("rewrite", "command", "second")}]
    verdict = await run_hooks(tmp_path, hooks, "pre_tool_use", BASH)
    assert verdict.updated_input == {"command": "second", "timeout": "30"}
    assert verdict.reason == "command rewritten\ntimeout rewritten\ncommand rewritten"


@pytest.mark.anyio
async def test_matching_hooks_run_concurrently(tmp_path: Path) -> None:
    # Each waits until the other has started: run one after the other, the first would fail.
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    hooks = [{"event": "pre_tool_use", "command": script("barrier", str(barrier), "a", "b")},
             {"event": "pre_tool_use", "command": script("barrier", str(barrier), "b", "a")}]
    assert await run_hooks(tmp_path / "defs", hooks, "pre_tool_use", BASH) == Verdict()


# --- matching ------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_matcher_rules(tmp_path: Path) -> None:
    say = script("say", "")
    specs = [{"event": "pre_tool_use", "matcher": "", "command": say},
             {"event": "PreToolUse", "matcher": "*", "command": say},
             {"event": "pre_tool_use", "matcher": "Bash|Edit", "command": say},
             {"event": "pre_tool_use", "matcher": "mcp__.*", "command": say},
             {"event": "post_tool_use", "matcher": "fixture__.*", "command": say},
             {"event": "user_prompt_submit", "matcher": "Bash", "command": say}]
    definitions, root = compile_hooks(tmp_path, *specs)
    assert [d.matcher for d in definitions][:2] == ["", ""]
    assert definitions[1].event == "pre_tool_use"
    async with httpx.AsyncClient(trust_env=False) as http:
        hooks = Hooks(definitions, root=root, http=http, environ={}, base=BASE)

    def names(event: str, tool: str | None = None) -> list[str]:
        return [hook.name for hook in hooks.matching(event, tool)]

    assert names("pre_tool_use", "Bash") == ["h0", "h1", "h2"]
    assert names("PreToolUse", "Edit") == ["h0", "h1", "h2"]
    assert names("pre_tool_use", "BashOutput") == ["h0", "h1"]  # whole names only
    assert names("pre_tool_use", "mcp__github__search") == ["h0", "h1", "h3"]
    assert names("post_tool_use", "fixture__echo") == ["h4"]
    assert names("post_tool_use", "my_fixture__echo") == []
    assert names("user_prompt_submit") == ["h5"]  # matchers apply to tool events only
    assert names("stop") == []
    with pytest.raises(ValueError, match="unknown hook event"):
        hooks.matching("post_tool")


@pytest.mark.anyio
async def test_tool_name_is_taken_from_the_payload(tmp_path: Path) -> None:
    hook = {"event": "pre_tool_use", "matcher": "Edit", "command": script("say", "no", "2")}
    assert await run_hooks(tmp_path / "1", [hook], "pre_tool_use", BASH) == Verdict()
    edit = {**BASH, "tool_name": "Edit"}
    assert await run_hooks(tmp_path / "2", [hook], "pre_tool_use", edit) == Verdict("deny", "no")


@contextmanager
def refusing_port() -> Iterator[int]:
    """A loopback port that is bound but not listening, so connecting is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


# --- HTTP hooks ----------------------------------------------------------------------------------


@dataclass
class Receiver:
    """A loopback hook endpoint: records each request, answers from HTTP_ANSWERS by path."""

    url: str = ""
    received: list[tuple[str, dict[str, str], Any]] = field(default_factory=list)


HTTP_ANSWERS: dict[str, Callable[[], Response]] = {
    "/deny": lambda: JSONResponse({"hookSpecificOutput": {
        "hookEventName": "PreToolUse", "permissionDecision": "deny",
        "permissionDecisionReason": "policy says no"}}),
    "/empty": lambda: Response(b"", status_code=200),
    "/context": lambda: Response(b"from the web", status_code=200),
    "/fail": lambda: Response(b"internal error", status_code=500),
    "/huge": lambda: Response(b"x" * (300 * 1024), status_code=200),
}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    rec = Receiver()

    async def endpoint(request: Request) -> Response:
        body = await request.body()
        rec.received.append((request.url.path, dict(request.headers), json.loads(body)))
        if request.url.path == "/slow":
            await anyio.sleep_forever()
        return HTTP_ANSWERS[request.url.path]()

    app = Starlette(routes=[Route("/{path}", endpoint, methods=["POST"])])
    with serve(app, graceful_s=0.5) as url:
        rec.url = url
        yield rec


@pytest.mark.anyio
async def test_http_hook_gets_the_exact_payload_and_can_deny(tmp_path: Path, receiver: Receiver) -> None:
    hook = {"event": "PreToolUse", "matcher": "Bash", "http": {
        "url": f"{receiver.url}/deny", "headers": {"Authorization": "Bearer ${HOOK_TOKEN}"}}}
    verdict = await run_hooks(tmp_path, [hook], "pre_tool_use", BASH, environ={"HOOK_TOKEN": SECRET})
    assert verdict == Verdict("deny", "policy says no")
    [(_, headers, body)] = receiver.received
    assert body == {
        "session_id": "conv_1", "cwd": "/srv/project",
        "corral": {"agent": "coder", "digest": "sha256:abc", "turn_id": "turn_1"},
        "permission_mode": "default", "hook_event_name": "PreToolUse",
        "tool_name": "Bash", "tool_input": {"command": "ls -la"}, "tool_use_id": "toolu_1",
    }
    assert headers["authorization"] == f"Bearer {SECRET}"
    assert headers["content-type"] == "application/json"


@pytest.mark.anyio
@pytest.mark.parametrize(("path", "event", "expected"), [
    ("/empty", "pre_tool_use", Verdict()),
    ("/context", "session_start", Verdict(context=("from the web",))),
    ("/fail", "pre_tool_use", Verdict("deny", "hook h0 answered HTTP 500")),
    ("/fail", "post_tool_use", Verdict()),
    ("/huge", "pre_tool_use", Verdict("deny", "hook h0 answered more than 262144 bytes")),
    ("/slow", "user_prompt_submit", Verdict("deny", "hook h0 timed out after 0.5s")),
])
async def test_http_answers(tmp_path: Path, receiver: Receiver, path: str, event: str,
                            expected: Verdict) -> None:
    hook = {"event": event, "http": {"url": receiver.url + path}, "timeout_s": 0.5}
    assert await run_hooks(tmp_path, [hook], event, {**BASH, "prompt": "p"}) == expected


@pytest.mark.anyio
async def test_http_failures_never_show_the_secret(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with refusing_port() as port:
        hooks = [{"event": "pre_tool_use", "http": {
                     "url": f"http://127.0.0.1:{port}/?t=x", "headers": {"X-Token": "${HOOK_TOKEN}"}}},
                 {"event": "pre_tool_use", "http": {
                     "url": f"http://127.0.0.1:{port}/", "headers": {"X-Token": "${UNSET_TOKEN}"}}}]
        with caplog.at_level(logging.DEBUG, logger="corral.hooks"):
            verdict = await run_hooks(tmp_path, hooks, "pre_tool_use", BASH, environ={"HOOK_TOKEN": SECRET})
    assert verdict == Verdict("deny", "hook h0: request failed (ConnectError)\n"
                                      "hook h1: environment variable UNSET_TOKEN is not set")
    assert SECRET not in caplog.text
    assert "hook h0 on pre_tool_use" in caplog.text


@pytest.mark.anyio
async def test_payloads_carry_no_secret_from_the_environment(
        tmp_path: Path, receiver: Receiver, caplog: pytest.LogCaptureFixture) -> None:
    seen = tmp_path / "seen.json"
    hooks = [{"event": "pre_tool_use", "command": script("record", str(seen))},
             {"event": "pre_tool_use", "http": {
                 "url": f"{receiver.url}/empty", "headers": {"Authorization": "Bearer ${HOOK_TOKEN}"}}}]
    environ = {"HOOK_TOKEN": SECRET, "OPENAI_API_KEY": SECRET + "-openai"}
    with caplog.at_level(logging.DEBUG, logger="corral.hooks"):
        verdict = await run_hooks(tmp_path / "defs", hooks, "pre_tool_use", BASH, environ=environ)
    assert verdict == Verdict()
    [(_, headers, body)] = receiver.received
    assert headers["authorization"] == f"Bearer {SECRET}"  # the header is where the secret goes
    assert SECRET not in json.dumps(body)
    assert SECRET not in seen.read_text()
    assert SECRET not in caplog.text
    assert "hook h0 on pre_tool_use: allow" in caplog.text and "hook h1 on pre_tool_use: allow" in caplog.text
