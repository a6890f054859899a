"""A storage failure fails the turn it hit, never the server; a store that cannot be written at all
takes the server down (§7).

The fault is real and comes from outside, as a chaos test would make it: the
file-size limit of the running `corral serve` process is lowered to one byte
(`prlimit`), so every write SQLite makes fails with "database or disk is
full", and raised again to end the fault. Turns are held open at a gate
(`tests.support.trees`), so which turn is mid-flight when the fault begins is decided
by the test, not by timing.
"""

from __future__ import annotations

import contextlib
import re
import resource
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.client import Conversation
from tests.support.events import ended, named
from tests.support.processes import wait_until
from tests.support.servers import ServerProcess
from tests.support.trees import gated_definitions, open_gate

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


@contextmanager
def failing_inserts(database: Path, table: str) -> Iterator[None]:
    """Every INSERT into `table` fails with an SQLite error (not a constraint), while the block runs:
    a trigger calls a function no connection has, so only that one write of the server fails."""
    db = sqlite3.connect(database, isolation_level=None)
    db.execute(f"CREATE TRIGGER injected_fault BEFORE INSERT ON {table} BEGIN SELECT injected_fault(); END")
    try:
        yield
    finally:
        db.execute("DROP TRIGGER injected_fault")
        db.close()


async def test_a_turn_whose_first_write_fails_leaves_nothing_behind(tmp_path: Path) -> None:
    """The write that records a new turn fails: the client gets `storage_error`, and no event, turn or
    busy conversation is left of it (`corral_busy_conversations` stays 0)."""
    state = tmp_path / "state"
    with ServerProcess(gated_definitions(tmp_path / "defs"), state) as server, anyio.fail_after(60):
        async with httpx.AsyncClient(base_url=server.url, timeout=30, trust_env=False) as client:
            c = await Conversation.create(client, "gated")
            with failing_inserts(state / "corral.db", "turns"):
                refused = await c.send("hello")
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "storage_error"
            assert await c.turns() == [] and (await c.get())["status"] == "idle"
            metrics = (await client.get("/metrics")).text
            assert re.search(r"^corral_busy_conversations 0(\.0)?$", metrics, re.M), metrics
            answer = await c.say("hello again")  # the conversation goes on
            assert answer["status"] == "completed", answer
            events = await c.events(ended(answer["turn_id"]))
            turn_events = [e.name for e in events if e.name.startswith("turn.")]
            assert turn_events == ["turn.started", "turn.completed"]
            assert {e.data["turn_id"] for e in events if "turn_id" in e.data} == {answer["turn_id"]}


async def test_a_failed_write_fails_its_turn_and_the_server_goes_on(tmp_path: Path) -> None:
    defs, gate = gated_definitions(tmp_path / "defs"), tmp_path / "gate"
    with ServerProcess(defs, tmp_path / "state", env={"CORRAL_STORAGE_GRACE_S": "60"}) as server, \
            anyio.fail_after(60):
        assert server.proc is not None
        async with httpx.AsyncClient(base_url=server.url, timeout=30, trust_env=False) as client:
            hit = await Conversation.create(client, "gated")
            async with anyio.create_task_group() as tg:
                tg.start_soon(hit.send, f"wait {gate}")
                turn_id = await hit.started()
                with unwritable(server.proc.pid):
                    open_gate(gate)  # the tool ends; recording its result fails
                    await wait_until(lambda: hit.replies, bound=30)  # the server answered
                    health = await client.get("/healthz")  # one failed write is no dead store
            [answer] = hit.replies
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert (body["turn_id"], body["status"]) == (turn_id, "failed"), body
            assert body["error"]["code"] == "storage_error"
            assert health.status_code == 200
            # The store is writable again: the ending that could not be written is, and once.
            events = await hit.events(ended(turn_id))
            assert events[-1].name == "turn.failed" and events[-1].data["error"]["code"] == "storage_error"
            turns = await hit.turns()
            assert [(t["id"], t["status"]) for t in turns] == [(turn_id, "failed")]
            assert (await hit.get())["status"] == "idle"
            # every other conversation goes on, and so does this one
            for conversation in (await Conversation.create(client, "gated"), hit):
                again = await conversation.send("hello")
                assert again.status_code == 200 and again.json()["output"] == "echo: hello", again.text
        assert server.proc.poll() is None  # still running
    assert "could not record the end of turn" in server.stderr


async def test_a_store_that_cannot_be_written_fails_health_and_exits_non_zero(tmp_path: Path) -> None:
    defs, first_gate, held_gate = gated_definitions(tmp_path / "defs"), tmp_path / "first", tmp_path / "held"
    env = {"CORRAL_STORAGE_GRACE_S": "1", "CORRAL_SHUTDOWN_GRACE_S": "30"}
    with ServerProcess(defs, tmp_path / "state", env=env) as server, anyio.fail_after(60):
        assert server.proc is not None
        async with httpx.AsyncClient(base_url=server.url, timeout=30, trust_env=False) as client:
            hit, held = await Conversation.create(client, "gated"), await Conversation.create(client, "gated")
            async with anyio.create_task_group() as tg:
                tg.start_soon(hit.send, f"wait {first_gate}")
                tg.start_soon(held.send, f"wait {held_gate}")
                await hit.events(named("tool.started"))
                await held.events(named("tool.started"))
                with unwritable(server.proc.pid):
                    open_gate(first_gate)
                    await wait_until(lambda: hit.replies, bound=30)  # the server answered
                    line = await anyio.to_thread.run_sync(
                        server.wait_for_line, lambda text: "giving up" in text, 30)
                    assert line is not None, server.stderr
                    # The held turn keeps the drain open: the server is still there to say it fails.
                    for probe in ("/healthz", "/readyz"):
                        failing = await client.get(probe)
                        assert failing.status_code == 503, (probe, failing.text)
                        assert failing.json()["error"]["code"] == "storage_error"
                    refused = await hit.send("hello")
                    assert refused.status_code == 503, refused.text
                    open_gate(held_gate)
                    code = await anyio.to_thread.run_sync(server.wait, 30)
    assert code == 1, server.stderr
    assert hit.replies[0].json()["error"]["code"] == "storage_error"
    assert "error: the store could not commit" in server.stderr

