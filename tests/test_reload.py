"""Reload triggers and locked mode: the reload route, SIGHUP, `corral lock`, `serve --locked`.

The CLI runs as a real subprocess (`python -m server.cli`), every run bounded
by a time-out: a server that should refuse to start and does not fails the
test instead of hanging it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from server.compiler.compiler import Compiler
from tests.conftest import corral_server
from tests.swapping import (
    agent_digest,
    create_conversation,
    edited_yaml,
    next_swap,
    say,
    set_digest,
    swaps,
    versioned_definitions,
    watcher_live,
    write_atomic,
)

REPO = Path(__file__).resolve().parent.parent


def corral(*args: str, env: dict[str, str] | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "server.cli", *args], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=timeout)


def server_env(state_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    return env | {"CORRAL_STATE_DIR": str(state_dir), **extra}


async def reload(client: httpx.AsyncClient) -> dict[str, Any]:
    r = await client.post("/v1/definitions/reload")
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.anyio
async def test_locked_mode_rejects_drift_until_the_lock_is_renewed(tmp_path: Path) -> None:
    defs = versioned_definitions(tmp_path / "defs", "v1")
    assert corral("lock", str(defs)).returncode == 0
    v1 = agent_digest(defs)
    with corral_server(defs, tmp_path / "state", locked=True) as url:
        async with httpx.AsyncClient(base_url=url, timeout=20, trust_env=False) as client:
            with anyio.fail_after(60):
                conversation = await create_conversation(client, "edited")
                locked_set = await set_digest(client)
                write_atomic(defs / "edited.yaml", edited_yaml("v2"))
                rejected = await reload(client)
                kept = await say(client, conversation, "hello")
                relocked = corral("lock", str(defs))
                applied = await reload(client)
                unchanged = await reload(client)
                moved = await say(client, conversation, "hello")
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
                seen = len(await swaps(client))
                write_atomic(defs / "edited.yaml", edited_yaml("v2"))
                rejected = await next_swap(client, seen, lambda r: any(
                    e.get("ref") == "agent/edited" for e in r["errors"]))
                relocked = corral("lock", str(defs))  # the watcher sees the new corral.lock
                applied = await next_swap(client, seen, lambda r: r["status"] == "applied")
                answer = await say(client, await create_conversation(client, "edited"), "hello")

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
    serve = [sys.executable, "-m", "server.cli", "serve", str(defs), "--port", "0"]
    refused: dict[str, subprocess.CompletedProcess] = {}

    async def run(how: str, argv: list[str], env: dict[str, str]) -> None:
        refused[how] = await anyio.run_process(argv, cwd=REPO, env=env, check=False)

    with anyio.fail_after(60):  # a server that starts anyway never exits: this fails the test
        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "flag", [*serve, "--locked"], server_env(tmp_path / "a"))
            tg.start_soon(run, "env", serve, server_env(tmp_path / "b", CORRAL_LOCKED="1"))

    for how, process in refused.items():
        stderr = process.stderr.decode()
        assert process.returncode != 0, how
        assert "corral.lock" in stderr and "agent/edited" in stderr, stderr
        assert "Traceback" not in stderr, stderr


async def _base_url(log: Path, process: subprocess.Popen) -> str:
    """The address uvicorn reports once it serves (polling its log; bound it outside)."""
    while True:
        found = re.search(r"running on (http://127\.0\.0\.1:\d+)", log.read_text("utf-8", "replace"))
        if found:
            return found.group(1)
        assert process.poll() is None, log.read_text("utf-8", "replace")
        await anyio.sleep(0.05)


@pytest.mark.anyio
async def test_sighup_reloads_the_definitions(tmp_path: Path) -> None:
    defs = versioned_definitions(tmp_path / "defs", "v1")
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "server.cli", "serve", str(defs), "--port", "0", "--no-watch"],
            stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=server_env(tmp_path / "state"))
    try:
        with anyio.fail_after(30):
            url = await _base_url(log, process)
            async with httpx.AsyncClient(base_url=url, timeout=10, trust_env=False) as client:
                before = await set_digest(client)
                write_atomic(defs / "edited.yaml", edited_yaml("v2"))
                expected = Compiler(defs).compile().digest
                process.send_signal(signal.SIGHUP)
                while (now := await set_digest(client)) == before:
                    await anyio.sleep(0.05)
                latest = (await swaps(client))[0]
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
    assert now == expected != before
    assert (latest["status"], latest["trigger"], latest["current"]) == ("applied", "sighup", expected)
    # a clean stop: uvicorn ends by re-raising the SIGTERM it handled
    assert process.returncode in (0, -signal.SIGTERM), log.read_text("utf-8", "replace")
