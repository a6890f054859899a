"""Two PostgreSQL replicas under faults (§9): a paused replica, a decision sent to a former owner, a retry.

Replicas `a` and `b` share one database, with a short lease (`LEASE_S`). A
replica paused (SIGSTOP) past its lease loses its turns to the other one;
when it goes on (SIGCONT) it still holds whatever it was doing in memory. It
must not act on any of it: it confirms its lease right before each side
effect (a hook, a tool, a person's answer), so nothing it started before
the pause is carried out after another replica took the turn over. And what
a client sends to it (a permission decision) still reaches the turn where it
runs now. A retried request with the same Idempotency-Key waits on any
replica for the turn's end, as the first request does. A turn's stream from
a replica that stops is broken off, never ended cleanly before the turn's
end, so its client reconnects with Last-Event-ID. Behind the documented
nginx configuration, a killed replica costs no request that is safe to
send again, and nginx's own errors are Corral's JSON envelope.

A tool's side effect is a line in a log (the call's execution key); a tool
or hook that must hold still waits for a gate file the test creates. Every
wait is bounded and on a condition.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from server.runtime.loop import UNKNOWN_OUTCOME
from tests.support.durable import TERMINAL, Follower, Node, client_for, lines, summary
from tests.support.events import Event, ended, named, read_events, sse
from tests.support.nginx import NginxProxy
from tests.support.postgres import PostgresServer
from tests.support.processes import wait_until
from tests.support.trees import open_gate, write_tree

pytestmark = pytest.mark.anyio

LEASE_S = 2.0
BOUND = 30.0

STEP_PY = """\
import os, sys, time
with open(sys.argv[1], "a") as log:  # the side effect, done at once
    log.write(os.environ.get("CORRAL_EXECUTION_KEY", "no key") + "\\n")
while len(sys.argv) > 2 and not os.path.exists(sys.argv[2]):  # then wait for the gate, if given one
    time.sleep(0.01)
print("stepped")
"""

HOLD_PY = """\
import json, os, sys, time
gate = json.load(sys.stdin)["tool_input"]["gate"]
open(gate + ".hooked", "w").close()  # the hook runs
while not os.path.exists(gate):  # and holds the call until the gate opens
    time.sleep(0.01)
"""


def definitions(root: Path) -> Path:
    logged = "{ type: object, properties: { log: { type: string }, gate: { type: string } },"
    logged += " required: [log] }"
    return write_tree(root, {
        "models.yaml": r"""
            kind: Model
            name: offline
            provider: scripted
            script:
              - when: "^hooked (?P<log>\\S+) (?P<gate>\\S+)"
                tool_call: { name: unsafe_step, arguments: { log: "{log}", gate: "{gate}" } }
                reply: "{tool_result}"
              - when: "^gated (?P<log>\\S+) (?P<gate>\\S+)"
                tool_call: { name: gated_step, arguments: { log: "{log}", gate: "{gate}" } }
                reply: "gated: {tool_result}"
              - when: "^ask (?P<log>\\S+)"
                tool_call: { name: asked_step, arguments: { log: "{log}" } }
                reply: "asked: {tool_result}"
            default: "echo: {input}"
        """,
        "tools.yaml": f"""
            kind: Tool
            name: unsafe_step
            description: Append the execution key to a log (not to be done twice).
            input_schema: {logged}
            command: {{ argv: [python3, step.py, "{{log}}"], timeout_s: 60 }}
            ---
            kind: Tool
            name: gated_step
            description: Append the execution key to a log, then wait for the gate.
            input_schema: {logged}
            command: {{ argv: [python3, step.py, "{{log}}", "{{gate}}"], timeout_s: 60 }}
            ---
            kind: Tool
            name: asked_step
            description: Append the execution key to a log, once a person allows it.
            permission: ask
            input_schema: {logged}
            command: {{ argv: [python3, step.py, "{{log}}"], timeout_s: 60 }}
        """,
        "hooks.yaml": f"""
            kind: Hook
            name: hold
            event: pre_tool_use
            matcher: "^unsafe_step$"
            command: ["{sys.executable}", hold.py]
            timeout_s: 60
        """,
        "agents.yaml": """
            kind: Agent
            name: worker
            description: Runs the step tools.
            model: offline
            tools: [unsafe_step, gated_step, asked_step]
            hooks: [hold]
        """,
        "step.py": STEP_PY,
        "hold.py": HOLD_PY,
    })


@pytest.fixture
async def pair(postgres_server: PostgresServer, tmp_path: Path) -> AsyncIterator[tuple[Node, Node]]:
    """Replicas `a` and `b` on a fresh database, with a short lease."""
    database = postgres_server.create_database()
    defs = definitions(tmp_path / "defs")
    nodes = [Node(name, defs, tmp_path / f"state-{name}", env={
        "CORRAL_DATABASE_URL": database, "CORRAL_LEASE_S": str(LEASE_S), "CORRAL_REPLICA_ID": name,
        "CORRAL_SHUTDOWN_GRACE_S": "1"}) for name in "ab"]
    try:
        for node in nodes:
            node.launch()
        for node in nodes:
            await anyio.to_thread.run_sync(node.ready)
        yield nodes[0], nodes[1]
    finally:
        for node in nodes:
            node.stop()
        with contextlib.suppress(RuntimeError):
            postgres_server.drop_database(database)


async def conversation(node: Node) -> str:
    async with client_for(node.url) as client:
        r = await client.post("/v1/conversations", json={"agent": "worker"})
    assert r.status_code == 201, r.text
    return r.json()["id"]


async def send(node: Node, conversation_id: str, content: str, replies: list[Any],
               key: str | None = None) -> None:
    """`POST .../messages` to `node`; the response (or the error) is appended to `replies`."""
    headers = {"Idempotency-Key": key} if key else {}
    async with client_for(node.url, timeout=120) as client:
        try:
            replies.append(await client.post(f"/v1/conversations/{conversation_id}/messages",
                                             json={"content": content}, headers=headers))
        except httpx.HTTPError as exc:
            replies.append(exc)


async def taken_over(a: Node, turn_id: str) -> None:
    """`a`, continued, says another replica took its turn over."""
    line = await anyio.to_thread.run_sync(
        a.server.wait_for_line, lambda text: turn_id in text and "took it over" in text, BOUND)
    assert line is not None, a.log()


async def test_a_paused_replica_runs_no_tool_after_losing_its_lease(pair: tuple[Node, Node],
                                                                    tmp_path: Path) -> None:
    """`a` is paused while a `pre_tool_use` hook holds an unsafe call; `b` takes the turn over and
    records the call's outcome as unknown; the hook ends and `a` goes on: it does not run the tool."""
    a, b = pair
    log, gate = tmp_path / "log", tmp_path / "gate"
    conversation_id = await conversation(a)
    follower = Follower(conversation_id, lambda: [b.url])
    replies: list[Any] = []
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(follower.run)
            tg.start_soon(send, a, conversation_id, f"hooked {log} {gate}", replies)
            await wait_until(lambda: Path(f"{gate}.hooked").exists(), BOUND)  # a's hook holds the call
            turn_id = (await follower.wait(named("turn.started"), BOUND)).data["turn_id"]
            a.pause()
            try:
                follower.reconnect()
                await follower.wait(named("turn.resumed"), BOUND)
                unknown = await follower.wait(named("tool.finished"), BOUND)
                assert unknown.data.get("outcome") == "unknown", unknown
                end = await follower.wait(ended(turn_id), BOUND)
                assert end.name == "turn.completed" and end.data["output"] == UNKNOWN_OUTCOME, end
                open_gate(gate)  # a's hook ends while a is paused: a goes on straight to the tool
            finally:
                a.go_on()
            await taken_over(a, turn_id)
            await wait_until(lambda: replies, BOUND)
            tg.cancel_scope.cancel()
    finally:
        open_gate(gate)
    assert lines(log) == [], "the unsafe tool ran after its outcome was recorded as unknown"
    assert follower.check() == [], follower.check()
    names = [e.name for e in follower.of(turn_id)]
    assert names.count("tool.started") == names.count("tool.finished") == 1, summary(follower.events)


async def test_a_decision_sent_to_the_former_owner_reaches_the_turn(pair: tuple[Node, Node],
                                                                   tmp_path: Path) -> None:
    """A turn waits on a permission on `a`; `a` is paused past its lease and `b` takes the turn over
    (the request stays pending); `a` goes on, and the decision is sent to `a`: `b` runs the tool."""
    a, b = pair
    log = tmp_path / "log"
    conversation_id = await conversation(a)
    follower = Follower(conversation_id, lambda: [b.url])
    async with anyio.create_task_group() as tg:
        tg.start_soon(follower.run)
        replies: list[Any] = []
        tg.start_soon(send, a, conversation_id, f"ask {log}", replies)
        asked = await follower.wait(named("permission.requested"), BOUND)
        turn_id, request_id = asked.data["turn_id"], asked.data["request_id"]
        a.pause()
        try:
            follower.reconnect()
            await follower.wait(named("turn.resumed"), BOUND)
        finally:
            a.go_on()
        async with client_for(a.url) as client:
            r = await client.post(f"/v1/conversations/{conversation_id}/permissions/{request_id}",
                                  json={"decision": "allow"})
        assert r.status_code == 200, r.text
        end = await follower.wait(ended(turn_id), BOUND)
        tg.cancel_scope.cancel()
    assert end.name == "turn.completed" and end.data["output"] == "asked: stepped", end
    assert len(lines(log)) == 1, lines(log)
    assert follower.check() == [], follower.check()


async def test_a_retry_on_another_replica_waits_for_the_turn(pair: tuple[Node, Node], tmp_path: Path) -> None:
    """The first request (with an Idempotency-Key) runs on `a`; its retry on `b` waits for the turn's end
    and answers the same result, not the turn's state at the moment it arrived."""
    a, b = pair
    log, gate = tmp_path / "log", tmp_path / "gate"
    conversation_id = await conversation(a)
    first: list[Any] = []
    retried: list[Any] = []
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(send, a, conversation_id, f"gated {log} {gate}", first, "k-1")
            await wait_until(lambda: lines(log), BOUND)  # in its tool on a
            tg.start_soon(send, b, conversation_id, f"gated {log} {gate}", retried, "k-1")
            # b follows the turn (it says so), or (as before) answered at once
            await wait_until(lambda: retried or "a retried request follows turn" in b.server.stderr, BOUND)
            open_gate(gate)
    finally:
        open_gate(gate)
    [one], [two] = first, retried
    assert isinstance(one, httpx.Response) and one.status_code == 200, one
    assert isinstance(two, httpx.Response) and two.status_code == 200, two
    assert (two.json()["status"], two.json()["output"]) == ("completed", "gated: stepped"), two.text
    assert two.json()["turn_id"] == one.json()["turn_id"]
    assert two.json()["messages"] == one.json()["messages"]
    assert len(lines(log)) == 1


async def test_a_stopping_replica_breaks_a_turn_stream_off(pair: tuple[Node, Node], tmp_path: Path) -> None:
    """A turn streams from `a` and `a` stops (SIGTERM) mid-tool: the stream is broken off, never ended
    cleanly before the turn's end; the client reconnects to `b` with Last-Event-ID and sees the turn
    end, once."""
    a, b = pair
    log, gate = tmp_path / "log", tmp_path / "gate"
    conversation_id = await conversation(a)
    seen: list[Event] = []
    try:
        async with client_for(a.url) as client:
            with pytest.raises(httpx.RemoteProtocolError):
                body = {"content": f"gated {log} {gate}", "stream": True}
                async with client.stream("POST", f"/v1/conversations/{conversation_id}/messages",
                                         json=body) as r:
                    assert r.status_code == 200
                    async for event in sse(r):
                        seen.append(event)
                        if event.name == "tool.started":
                            a.serving = False
                            a.server.signal(signal.SIGTERM)
        await anyio.to_thread.run_sync(a.server.wait, BOUND)  # a stopped (it handed the turn over)
        turn_id = seen[0].data["turn_id"]
        assert not [e for e in seen if e.name in TERMINAL], summary(seen)
        async with client_for(b.url) as client:
            rest = await read_events(client, conversation_id, ended(turn_id), seen[-1].id)
    finally:
        open_gate(gate)
    ids = [e.id for e in seen + rest]
    assert ids == list(range(1, len(ids) + 1)), summary(seen + rest)
    assert [e.name for e in seen + rest if e.name in TERMINAL] == ["turn.completed"], summary(seen + rest)


def running_on(pair: tuple[Node, Node], log: Path) -> Node:
    """The replica whose tool process is appending to `log` (the process's parent)."""
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(log).encode() in (proc / "cmdline").read_bytes():
                parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                return next(n for n in pair if n.server.proc is not None and n.server.proc.pid == parent)
        except (OSError, StopIteration):
            continue
    raise AssertionError(f"no tool process writes {log}")


async def test_through_nginx_a_killed_replica_costs_no_keyed_request(pair: tuple[Node, Node],
                                                                    tmp_path: Path) -> None:
    """Behind the documented nginx config, the replica running a keyed request's turn is killed: nginx
    sends the request on to the other replica, which answers the turn's result once it has taken the turn
    over; a retry with the same key answers the same. With no replica left, nginx answers Corral's JSON
    error envelope, never its HTML page."""
    log, gate = tmp_path / "log", tmp_path / "gate"
    with NginxProxy([n.url for n in pair]) as proxy:
        async with client_for(proxy.url, timeout=120) as client:
            r = await client.post("/v1/conversations", json={"agent": "worker"})
            assert r.status_code == 201, r.text
            path = f"/v1/conversations/{r.json()['id']}/messages"
            for _ in range(4):  # nginx keeps connections open to both replicas
                assert (await client.get("/healthz")).status_code == 200
            body, key = {"content": f"gated {log} {gate}"}, {"Idempotency-Key": "k-nginx"}
            replies: list[httpx.Response] = []
            try:
                async with anyio.create_task_group() as tg:
                    async def keyed() -> None:
                        replies.append(await client.post(path, json=body, headers=key))

                    tg.start_soon(keyed)
                    await wait_until(lambda: lines(log), BOUND)  # in its tool
                    victim = running_on(pair, log)
                    await victim.kill()
            finally:
                open_gate(gate)
            [reply] = replies
            assert reply.status_code == 200, (reply.status_code, reply.text, proxy.access_log())
            first = reply.json()
            assert first["status"] == "completed" and first["output"].startswith("gated: "), first
            again = await client.post(path, json=body, headers=key)
            assert again.status_code == 200 and again.json()["turn_id"] == first["turn_id"], again.text
            assert again.json()["messages"] == first["messages"]
            [survivor] = [n for n in pair if n is not victim]
            await survivor.kill()
            for method in ("GET", "POST"):
                failed = await client.request(method, path, json=body)
                assert failed.status_code == 502, failed.text
                assert failed.headers["content-type"].startswith("application/json"), failed.headers
                assert failed.json()["error"]["code"] == "unreachable", failed.text
    assert len(lines(log)) == 1, lines(log)  # the unsafe tool was not run again


async def test_replicas_list_a_taken_over_turn_on_its_new_replica(pair: tuple[Node, Node],
                                                                  tmp_path: Path) -> None:
    """`GET /v1/replicas` counts the turns each replica holds now: once `b` took over the turn of `a`
    (killed), `a` (still listed, as heard from lately) runs none and `b` runs it."""
    a, b = pair
    conversation_id = await conversation(a)
    follower = Follower(conversation_id, lambda: [b.url])
    async with anyio.create_task_group() as tg:
        tg.start_soon(follower.run)
        tg.start_soon(send, a, conversation_id, f"ask {tmp_path / 'log'}", [])
        asked = await follower.wait(named("permission.requested"), BOUND)
        async with client_for(b.url) as client:
            async def listed() -> dict[str, Any]:
                return {r["id"]: r for r in (await client.get("/v1/replicas")).json()["items"]}

            with anyio.fail_after(BOUND):  # `a` is listed with the turn
                while (await listed())["a"]["running_turns"] != 1:
                    await anyio.sleep(0.05)
            await a.kill()
            await follower.wait(named("turn.resumed"), BOUND)
            running = {name: r["running_turns"] for name, r in (await listed()).items()}
            assert running == {"a": 0, "b": 1}, running
            decision = f"/v1/conversations/{conversation_id}/permissions/{asked.data['request_id']}"
            r = await client.post(decision, json={"decision": "deny"})
            assert r.status_code == 200, r.text
        await follower.wait(ended(asked.data["turn_id"]), BOUND)
        tg.cancel_scope.cancel()
