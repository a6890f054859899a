"""A storage failure fails the turn it hit, never the server; a store that cannot be written at all
takes the server down (§7).

The fault is real and comes from outside, as a chaos test would make it: the
file-size limit of the running `corral serve` process is lowered to one byte
(`prlimit`), so every write SQLite makes fails with "database or disk is
full", and raised again to end the fault. Turns are held open at a gate
(`tests.live`), so which turn is mid-flight when the fault begins is decided
by the test, not by timing.
"""

from __future__ import annotations

import contextlib
import resource
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.live import ended, gated_definitions, named, open_gate, read_events
from tests.server_process import ServerProcess

pytestmark = pytest.mark.anyio
FSIZE = resource.RLIMIT_FSIZE


@contextmanager
def unwritable(pid: int) -> Iterator[None]:
    """No file of the process can grow past one byte while the block runs."""
    soft, hard = resource.prlimit(pid, FSIZE)
    resource.prlimit(pid, FSIZE, (1, hard))
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):  # it may have exited, as a dead store should
            resource.prlimit(pid, FSIZE, (soft, hard))


async def start_turn(client: httpx.AsyncClient, cid: str, content: str, answers: dict[str, Any]) -> None:
    answers[cid] = await client.post(f"/v1/conversations/{cid}/messages", json={"content": content})


async def new_conversation(client: httpx.AsyncClient) -> str:
    r = await client.post("/v1/conversations", json={"agent": "gated"})
    assert r.status_code == 201, r.text
    return r.json()["id"]


async def test_a_failed_write_fails_its_turn_and_the_server_goes_on(tmp_path: Path) -> None:
    defs, gate = gated_definitions(tmp_path / "defs"), tmp_path / "gate"
    answers: dict[str, Any] = {}
    with ServerProcess(defs, tmp_path / "state", env={"CORRAL_STORAGE_GRACE_S": "60"}) as server, \
            anyio.fail_after(60):
        assert server.proc is not None
        async with httpx.AsyncClient(base_url=server.url, timeout=30, trust_env=False) as client:
            hit = await new_conversation(client)
            async with anyio.create_task_group() as tg:
                tg.start_soon(start_turn, client, hit, f"wait {gate}", answers)
                started = await read_events(client, hit, named("tool.started"))
                turn_id = next(e.data["turn_id"] for e in started if e.name == "turn.started")
                with unwritable(server.proc.pid):
                    open_gate(gate)  # the tool ends; recording its result fails
                    await server_answered(answers, hit)
                    health = await client.get("/healthz")  # one failed write is no dead store
            answer = answers[hit]
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert (body["turn_id"], body["status"]) == (turn_id, "failed"), body
            assert body["error"]["code"] == "storage_error"
            assert health.status_code == 200
            # The store is writable again: the ending that could not be written is, and once.
            events = await read_events(client, hit, ended(turn_id))
            assert events[-1].name == "turn.failed" and events[-1].data["error"]["code"] == "storage_error"
            turns = (await client.get(f"/v1/conversations/{hit}/turns")).json()["items"]
            assert [(t["id"], t["status"]) for t in turns] == [(turn_id, "failed")]
            conversation = (await client.get(f"/v1/conversations/{hit}")).json()
            assert conversation["status"] == "idle"
            # every other conversation goes on, and so does this one
            for cid in (await new_conversation(client), hit):
                again = await client.post(f"/v1/conversations/{cid}/messages", json={"content": "hello"})
                assert again.status_code == 200 and again.json()["output"] == "echo: hello", again.text
        assert server.proc.poll() is None  # still running
    assert "could not record the end of turn" in server.stderr


async def server_answered(answers: dict[str, Any], cid: str) -> None:
    with anyio.fail_after(30):
        while cid not in answers:
            await anyio.sleep(0.02)


async def test_a_store_that_cannot_be_written_fails_health_and_exits_non_zero(tmp_path: Path) -> None:
    defs, first_gate, held_gate = gated_definitions(tmp_path / "defs"), tmp_path / "first", tmp_path / "held"
    env = {"CORRAL_STORAGE_GRACE_S": "1", "CORRAL_SHUTDOWN_GRACE_S": "30"}
    answers: dict[str, Any] = {}
    with ServerProcess(defs, tmp_path / "state", env=env) as server, anyio.fail_after(60):
        assert server.proc is not None
        async with httpx.AsyncClient(base_url=server.url, timeout=30, trust_env=False) as client:
            hit, held = await new_conversation(client), await new_conversation(client)
            async with anyio.create_task_group() as tg:
                tg.start_soon(start_turn, client, hit, f"wait {first_gate}", answers)
                tg.start_soon(start_turn, client, held, f"wait {held_gate}", answers)
                await read_events(client, hit, named("tool.started"))
                await read_events(client, held, named("tool.started"))
                with unwritable(server.proc.pid):
                    open_gate(first_gate)
                    await server_answered(answers, hit)
                    line = await anyio.to_thread.run_sync(
                        server.wait_for_line, lambda text: "giving up" in text, 30)
                    assert line is not None, server.stderr
                    # The held turn keeps the drain open: the server is still there to say it fails.
                    for probe in ("/healthz", "/readyz"):
                        failing = await client.get(probe)
                        assert failing.status_code == 503, (probe, failing.text)
                        assert failing.json()["error"]["code"] == "storage_error"
                    refused = await client.post(f"/v1/conversations/{hit}/messages",
                                                json={"content": "hello"})
                    assert refused.status_code == 503, refused.text
                    open_gate(held_gate)
                    code = await anyio.to_thread.run_sync(server.wait, 30)
    assert code == 1, server.stderr
    assert answers[hit].json()["error"]["code"] == "storage_error"
    assert "error: the store could not commit" in server.stderr

