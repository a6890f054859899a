"""One process owns an embedded state directory (CONTRACT §7), and a taken port is one line.

A `corral serve` owns its state directory; a second `corral serve` (or
`corral mcp`) on it refuses with one `error:` line naming the owner's pid and
URL, exit 3; `corral chat AGENT` without `--url` talks to the owner. None of
them touches the owner's running turn: the turn blocks in a command tool (on
a gate the test opens) while they start, and ends with the tool's own
result, on its first attempt. Real processes throughout; every wait is on a
condition, bounded.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.events import ended, read_events
from tests.support.processes import wait_until
from tests.support.servers import REPO, ServerProcess, clean_environ
from tests.support.trees import open_gate, write_tree

pytestmark = pytest.mark.anyio

PY = sys.executable
BOUND = 60.0
UNAVAILABLE = 3  # errors.EXIT_UNAVAILABLE: busy, or cannot be reached
STEP_PY = """\
import os, sys, time
with open(sys.argv[1], "a") as log:
    log.write(os.environ.get("CORRAL_EXECUTION_KEY", "no key") + "\\n")
while not os.path.exists(sys.argv[2]):
    time.sleep(0.01)
print("stepped")
"""


def definitions(root: Path) -> Path:
    return write_tree(root, {
        "defs.yaml": """
            kind: Model
            name: offline
            provider: scripted
            script:
              - when: "^step (?P<log>\\\\S+) (?P<gate>\\\\S+)"
                tool_call: { name: step, arguments: { log: "{log}", gate: "{gate}" } }
                reply: "{tool_result}"
            default: "echo: {input}"
            ---
            kind: Tool
            name: step
            description: Append the execution key to a log (not to be done twice), then wait for the gate.
            input_schema: { type: object, properties: { log: { type: string }, gate: { type: string } } }
            command: { argv: [python3, step.py, "{log}", "{gate}"], timeout_s: 120 }
            ---
            kind: Agent
            name: worker
            description: Runs the step tool.
            model: offline
            tools: [step]
        """,
        "step.py": STEP_PY,
    })


def corral(args: list[str], state: Path, defs: Path, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """`corral ARGS` on `state` to its end (bounded), its output kept."""
    env = clean_environ({"CORRAL_STATE_DIR": str(state), "CORRAL_DEFINITIONS": str(defs)})
    return subprocess.run([PY, "-m", "server.cli", *args], cwd=REPO, env=env, input=stdin,
                          capture_output=True, text=True, timeout=BOUND)


def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


def started_or_refused(line: str) -> bool:
    return "running on" in line or line.startswith("error:")


def test_a_second_serve_on_the_state_refuses_naming_the_owner(tmp_path: Path) -> None:
    defs, state = definitions(tmp_path / "defs"), tmp_path / "state"
    with ServerProcess(defs, state) as owner:
        assert owner.proc is not None
        second = corral(["serve", str(defs), "--port", "0", "--no-watch"], state, defs)
        assert second.returncode == UNAVAILABLE, second.stderr
        line = one_error_line(second.stderr)
        assert f"pid {owner.proc.pid}" in line and owner.url in line, line
        mcp = corral(["mcp", str(defs), "--no-watch"], state, defs)
        assert mcp.returncode == UNAVAILABLE, mcp.stderr
        assert f"pid {owner.proc.pid}" in one_error_line(mcp.stderr)
        assert httpx.get(owner.url + "/readyz", trust_env=False).status_code == 200  # it goes on serving


def test_a_lock_file_left_by_a_dead_owner_blocks_nothing(tmp_path: Path) -> None:
    defs, state = definitions(tmp_path / "defs"), tmp_path / "state"
    with ServerProcess(defs, state) as first:
        pass  # killed (SIGKILL) on leaving: its record stays behind
    record = json.loads((state / "corral.db.owner").read_text())
    assert record["url"] == first.url
    with ServerProcess(defs, state) as again:
        assert httpx.get(again.url + "/readyz", trust_env=False).status_code == 200


async def test_the_owners_running_turn_is_untouched_by_chat_and_a_second_serve(tmp_path: Path) -> None:
    defs, state = definitions(tmp_path / "defs"), tmp_path / "state"
    log, gate = tmp_path / "step.log", tmp_path / "gate"
    second = ServerProcess(defs, state)  # launched while the owner's turn runs
    async with contextlib.AsyncExitStack() as cleanup:
        cleanup.callback(second.kill)
        owner = cleanup.enter_context(ServerProcess(defs, state))
        client = await cleanup.enter_async_context(httpx.AsyncClient(base_url=owner.url, timeout=BOUND,
                                                                     trust_env=False))
        conversation = (await client.post("/v1/conversations", json={"agent": "worker"})).json()["id"]
        reply: dict[str, httpx.Response] = {}

        async def send() -> None:
            reply["turn"] = await client.post(f"/v1/conversations/{conversation}/messages",
                                              json={"content": f"step {log} {gate}"})

        async with anyio.create_task_group() as tg:
            tg.start_soon(send)
            await wait_until(log.exists, BOUND)  # the tool runs on the owner, held at the gate
            chat = await anyio.to_thread.run_sync(corral, ["chat", "worker"], state, defs, "hello\n")
            said = await anyio.to_thread.run_sync(second.launch().wait_for_line, started_or_refused, BOUND)
            open_gate(gate)
        # the turn ran on the owner alone: the tool's own result, one attempt, nothing resumed or unknown
        assert reply["turn"].status_code == 200, reply["turn"].text
        assert reply["turn"].json()["output"] == "stepped"
        turns = (await client.get(f"/v1/conversations/{conversation}/turns")).json()["items"]
        assert [(t["status"], t.get("attempts", 1)) for t in turns] == [("completed", 1)], turns
        with anyio.fail_after(BOUND):
            events = await read_events(client, conversation, ended(reply["turn"].json()["turn_id"]))
        assert [e.name for e in events if e.name in ("turn.resumed", "turn.started")] == ["turn.started"]
        assert [e.data.get("outcome") for e in events if e.name == "tool.finished"] == [None], events
        assert len(log.read_text().splitlines()) == 1
        # the chat talked to the owner; the second server refused
        assert chat.returncode == 0, chat.stderr
        assert "echo: hello" in chat.stdout
        chatted = re.search(r"conversation (\S+) on (\S+) ", chat.stderr)
        assert chatted is not None and chatted.group(2) == owner.url, chat.stderr
        listed = (await client.get("/v1/conversations")).json()["items"]
        assert chatted.group(1) in [c["id"] for c in listed]
        assert said is not None and said.startswith("error: "), second.stderr
        assert second.wait(BOUND) == UNAVAILABLE, second.stderr


def test_a_taken_port_is_one_error_line(tmp_path: Path) -> None:
    defs, state = definitions(tmp_path / "defs"), tmp_path / "state"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        served = corral(["serve", str(defs), "--port", str(port), "--no-watch"], state, defs)
    assert served.returncode == UNAVAILABLE, served.stderr
    line = one_error_line(served.stderr)
    assert f"127.0.0.1:{port}" in line and "in use" in line, line
