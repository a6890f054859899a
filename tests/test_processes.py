"""A tool's processes die with it: real process trees, their pids checked afterwards.

Each tree is the same script: the leader forks one child that stays in its
process group and one that calls setsid (a session, so a group, of its own),
both holding stdout and sleeping; once both exist it records the three pids
(atomically) and prints "hi", then exits or sleeps. The setsid child is the
one a process group kill misses. The environment test guards the
supervisor these run under: it must be invisible to the program.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import anyio
import httpx
import pytest

from server.tools.processes import Finished, run_process
from tests.support.client import Conversation
from tests.support.processes import alive, wait_until
from tests.support.servers import ServerProcess
from tests.support.trees import write_tree

PY = sys.executable
TREE_PY = """import os, sys, time
def child(new_session):
    ready, done = os.pipe()
    pid = os.fork()
    if pid == 0:
        if new_session:
            os.setsid()
        os.write(done, b".")
        time.sleep(60)
        os._exit(0)
    os.read(ready, 1)
    return pid
pids = [os.getpid(), child(False), child(True)]
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(" ".join(map(str, pids)))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
print("hi", flush=True)
if sys.argv[2] == "wait":
    time.sleep(60)
"""

pytestmark = pytest.mark.anyio


@pytest.fixture
def pidfile(tmp_path: Path) -> Iterator[Path]:
    """Where the tree records its pids; whatever of it is still alive at the end is killed."""
    path = tmp_path / "tree.pids"
    yield path
    for pid in pids_in(path) if path.exists() else []:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def pids_in(path: Path) -> list[int]:
    return [int(word) for word in path.read_text().split()]


def none_alive(pids: list[int]) -> bool:
    return not any(alive(pid) for pid in pids)


async def run_tree(pidfile: Path, then: str, timeout_s: float) -> Finished:
    return await run_process([PY, "-c", TREE_PY, str(pidfile), then], cwd=pidfile.parent,
                             env={"PATH": os.environ["PATH"]}, timeout_s=timeout_s, output_limit=1000)


async def test_leader_exit_ends_the_call_at_once_and_kills_the_children(pidfile: Path) -> None:
    started = time.monotonic()
    with anyio.fail_after(10):  # the children hold stdout for 60 s; the time-out is 30 s
        finished = await run_tree(pidfile, "exit", timeout_s=30)
    assert not finished.timed_out and finished.returncode == 0
    assert finished.stdout.text() == "hi\n"
    assert time.monotonic() - started < 10
    await wait_until(lambda: none_alive(pids_in(pidfile)))


async def test_time_out_kills_children_that_left_the_process_group(pidfile: Path) -> None:
    with anyio.fail_after(15):
        finished = await run_tree(pidfile, "wait", timeout_s=1)
    assert finished.timed_out
    await wait_until(lambda: none_alive(pids_in(pidfile)))


async def test_cancelled_caller_kills_the_whole_tree(pidfile: Path) -> None:
    with anyio.fail_after(15):
        async with anyio.create_task_group() as group:
            group.start_soon(partial(run_tree, pidfile, "wait", timeout_s=60))
            await wait_until(pidfile.exists, bound=10)
            group.cancel_scope.cancel()
    await wait_until(lambda: none_alive(pids_in(pidfile)))


@pytest.mark.parametrize("locale", [{"LANG": "C"}, {"LANG": "C", "LC_CTYPE": "C"}, {}])
async def test_the_program_gets_exactly_the_environment_given(tmp_path: Path, locale: dict[str, str]) -> None:
    # A guard on the supervisor, whose interpreter sets LC_CTYPE under a C locale (PEP 538).
    env = {"PATH": os.environ["PATH"], "ONE": "1", **locale}
    with anyio.fail_after(10):
        finished = await run_process(["env"], cwd=tmp_path, env=env, timeout_s=10, output_limit=10000)
    assert finished.returncode == 0
    assert dict(line.split("=", 1) for line in finished.stdout.text().splitlines()) == env


def tree_definitions(root: Path) -> Path:
    """"tree PATH" calls the `tree` tool, which records its pids in PATH and blocks for 60 s."""
    argv = json.dumps([PY, "-c", TREE_PY, "{path}", "wait"])
    return write_tree(root, {
        "models.yaml": r"""
            kind: Model
            name: scripted
            provider: scripted
            script:
              - when: "^tree (?P<path>\\S+)"
                tool_call: { name: tree, arguments: { path: "{path}" } }
                reply: "done"
        """,
        "tools.yaml": f"""
            kind: Tool
            name: tree
            description: Start a process tree that records its pids in path, then block.
            input_schema:
              type: object
              properties: {{ path: {{ type: string }} }}
              required: [path]
            command:
              argv: {argv}
              timeout_s: 60
        """,
        "agents.yaml": """
            kind: Agent
            name: trees
            description: Runs the tree tool.
            model: scripted
            tools: [tree]
        """,
    })


async def test_a_killed_server_takes_its_tools_processes_with_it(tmp_path: Path, pidfile: Path) -> None:
    defs = tree_definitions(tmp_path / "defs")
    with ServerProcess(defs, tmp_path / "state") as server, anyio.fail_after(40):
        async with httpx.AsyncClient(base_url=server.url, timeout=30, trust_env=False) as client:
            conversation = await Conversation.create(client, "trees")
            async with anyio.create_task_group() as group:
                group.start_soon(conversation.try_send, f"tree {pidfile}")  # never answered: the server dies
                await wait_until(pidfile.exists, bound=20)
                pids = pids_in(pidfile)
                assert all(alive(pid) for pid in pids)
                server.signal(signal.SIGKILL)
                await anyio.to_thread.run_sync(server.wait, 10)
    assert conversation.lost and not conversation.replies
    await wait_until(lambda: none_alive(pids))


# An MCP stdio server that first starts the same two children (one in its process group, one in a
# session of its own), records the three pids, and then becomes the fixture MCP server (same pid).
MCP_TREE_PY = TREE_PY.split("print(")[0] + """
os.execv(sys.executable, [sys.executable, sys.argv[2]])
"""


def mcp_tree_definitions(root: Path, pidfile: Path) -> Path:
    """"pid" asks the stdio MCP server `fixture` (started as the tree above) for its pid."""
    fixture = Path(__file__).resolve().parent / "mcp_fixture_server.py"
    return write_tree(root, {
        "tree.py": MCP_TREE_PY,
        "defs.yaml": f"""
            kind: Model
            name: scripted
            provider: scripted
            script:
              - when: "^pid"
                tool_call: {{ name: fixture__pid }}
                reply: "pid={{tool_result}}"
            ---
            kind: MCPServer
            name: fixture
            command: {PY}
            args: [tree.py, {json.dumps(str(pidfile))}, {json.dumps(str(fixture))}]
            timeout_s: 20
            ---
            kind: Agent
            name: plugged
            description: Uses the fixture MCP server.
            model: scripted
            tools: [fixture]
        """,
    })


async def test_a_killed_server_takes_its_stdio_mcp_servers_with_it(tmp_path: Path, pidfile: Path) -> None:
    defs = mcp_tree_definitions(tmp_path / "defs", pidfile)
    with ServerProcess(defs, tmp_path / "state") as server, anyio.fail_after(60):
        async with httpx.AsyncClient(base_url=server.url, timeout=30, trust_env=False) as client:
            conversation = await Conversation.create(client, "plugged")
            answer = (await conversation.send("pid")).json()
        pids = pids_in(pidfile)
        assert answer["output"] == f"pid={pids[0]}", answer  # the MCP server is the tree's leader
        assert all(alive(pid) for pid in pids)
        server.signal(signal.SIGKILL)
        await anyio.to_thread.run_sync(server.wait, 10)
        await wait_until(lambda: none_alive(pids), bound=15)
