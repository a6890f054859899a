"""Reload triggers and locked mode: the reload route, SIGHUP, `corral lock`, `serve --locked`.

The CLI runs as a real subprocess (`python -m server.cli`), every run bounded
by a time-out: a server that should refuse to start and does not fails the
test instead of hanging it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import anyio
import httpx
import pytest

from server.compiler.compiler import Compiler
from tests.support.client import Conversation
from tests.support.events import server_events, swap_reported
from tests.support.servers import REPO, ServerProcess, corral_server
from tests.support.swaps import reload, set_digest, swaps, watcher_live
from tests.support.trees import agent_digest, edited_yaml, versioned_definitions, write_atomic


def corral(*args: str, env: dict[str, str] | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "server.cli", *args], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=timeout)


@pytest.mark.anyio
async def test_locked_mode_rejects_drift_until_the_lock_is_renewed(tmp_path: Path) -> None:
    defs = versioned_definitions(tmp_path / "defs", "v1")
    assert corral("lock", str(defs)).returncode == 0
    v1 = agent_digest(defs)
    with corral_server(defs, tmp_path / "state", locked=True) as url:
        async with httpx.AsyncClient(base_url=url, timeout=20, trust_env=False) as client:
            with anyio.fail_after(60):
                conversation = await Conversation.create(client, "edited")
                locked_set = await set_digest(client)
                write_atomic(defs / "edited.yaml", edited_yaml("v2"))
                rejected = await reload(client)
                kept = await conversation.say("hello")
                relocked = corral("lock", str(defs))
                applied = await reload(client)
                unchanged = await reload(client)
                moved = await conversation.say("hello")
                history = await swaps(client)

    assert rejected["status"] == "rejected" and rejected["trigger"] == "api"
    assert rejected["previous"] == rejected["current"] == locked_set and rejected["changes"] == []
    assert {e["code"] for e in rejected["errors"]} == {"lock_mismatch"}
    assert {e["ref"] for e in rejected["errors"]} == {"agent/edited", "model/m_edited"}
    drifted = next(e for e in rejected["errors"] if e["ref"] == "agent/edited")
    assert "agent/edited" in drifted["message"] and drifted["locked"] == v1
    assert (kept["digest"], kept["output"]) == (v1, "v1: hello")
    assert relocked.returncode == 0, relocked.stderr
    v2 = agent_digest(defs)
    assert applied["status"] == "applied" and applied["current"] == Compiler(defs).compile().digest
    agent_change = next(c for c in applied["changes"] if c["kind"] == "Agent")
    assert agent_change == {"kind": "Agent", "name": "edited", "change": "changed", "from": v1, "to": v2}
    assert unchanged["status"] == "unchanged"
    assert unchanged["previous"] == unchanged["current"] == applied["current"]
    assert (unchanged["changes"], unchanged["busy"], unchanged["errors"]) == ([], [], [])
    assert (moved["digest"], moved["output"]) == (v2, "v2: hello")
    assert [s["id"] for s in history[:2]] == [applied["id"], rejected["id"]]


@pytest.mark.anyio
async def test_locked_watcher_applies_an_edit_once_corral_lock_is_run(tmp_path: Path) -> None:
    defs = versioned_definitions(tmp_path / "defs", "v1")
    assert corral("lock", str(defs)).returncode == 0
    with corral_server(defs, tmp_path / "state", locked=True, watch=True) as url:
        async with httpx.AsyncClient(base_url=url, timeout=20, trust_env=False) as client:
            with anyio.fail_after(60):
                probe = await watcher_live(client, defs)  # a new definition: not in the lock
                async with server_events(client) as events:
                    write_atomic(defs / "edited.yaml", edited_yaml("v2"))
                    rejected = (await events.wait(swap_reported(lambda r: any(
                        e.get("ref") == "agent/edited" for e in r["errors"])))).data
                    relocked = corral("lock", str(defs))  # the watcher sees the new corral.lock
                    applied = (await events.wait(swap_reported(lambda r: r["status"] == "applied"))).data
                answer = await (await Conversation.create(client, "edited")).say("hello")

    assert probe["status"] == "rejected" and {e["ref"] for e in probe["errors"]} == {"model/probe"}
    assert (rejected["status"], rejected["trigger"]) == ("rejected", "watch")
    assert {e["ref"] for e in rejected["errors"]} == {"model/probe", "agent/edited", "model/m_edited"}
    assert relocked.returncode == 0, relocked.stderr
    assert (applied["status"], applied["trigger"]) == ("applied", "watch")
    assert applied["current"] == Compiler(defs).compile().digest
    assert answer["output"] == "v2: hello"


@pytest.mark.anyio
async def test_serve_refuses_to_start_locked_on_a_drifted_set(tmp_path: Path) -> None:
    defs = versioned_definitions(tmp_path / "defs", "v1")
    assert corral("lock", str(defs)).returncode == 0
    write_atomic(defs / "edited.yaml", edited_yaml("v2"))
    refused = {
        "flag": ServerProcess(defs, tmp_path / "a", args=("--locked",)).launch(),
        "env": ServerProcess(defs, tmp_path / "b", args=(), env={"CORRAL_LOCKED": "1"}).launch(),
    }
    try:
        with anyio.fail_after(60):  # a server that starts anyway never exits: this fails the test
            codes = {how: await anyio.to_thread.run_sync(server.wait, 60) for how, server in refused.items()}
    finally:
        for server in refused.values():
            server.kill()

    for how, server in refused.items():
        stderr = server.stderr
        assert codes[how] != 0, how
        assert "corral.lock" in stderr and "agent/edited" in stderr, stderr
        assert "Traceback" not in stderr, stderr


@pytest.mark.anyio
async def test_sighup_reloads_the_definitions(tmp_path: Path) -> None:
    defs = versioned_definitions(tmp_path / "defs", "v1")
    with ServerProcess(defs, tmp_path / "state") as server:
        with anyio.fail_after(30):
            async with httpx.AsyncClient(base_url=server.url, timeout=10, trust_env=False) as client:
                before = await set_digest(client)
                write_atomic(defs / "edited.yaml", edited_yaml("v2"))
                expected = Compiler(defs).compile().digest
                async with server_events(client) as events:
                    server.signal(signal.SIGHUP)
                    await events.wait(swap_reported())
                now = await set_digest(client)
                latest = (await swaps(client))[0]
        code = server.terminate()
    assert now == expected != before
    assert (latest["status"], latest["trigger"], latest["current"]) == ("applied", "sighup", expected)
    # a clean stop: uvicorn ends by re-raising the SIGTERM it handled
    assert code in (0, -signal.SIGTERM), server.stderr
