"""A resumed turn goes on in its trace (§13, §9): after a SIGKILL on SQLite, and on another PostgreSQL
replica, the next attempt's `invoke_agent` span has the first attempt's trace id.

The turn's model (scripted) calls `step`, a `replay: safe` tool that logs that it ran and then waits
on a gate (a file): the server is killed once the log says the tool runs and the first `chat` span has
reached the receiver (the trace is known), the gate opens, and the turn is resumed (by the restarted
server, or by replica `b` once `a`'s lease lapses). Every wait is on a condition, bounded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from tests.support.client import Conversation
from tests.support.durable import Node, client_for, lines
from tests.support.otlp import OtlpReceiver, ReceivedSpan, by_name, env
from tests.support.postgres import PostgresServer
from tests.support.processes import wait_until
from tests.support.trees import open_gate, write_tree

pytestmark = pytest.mark.anyio

BOUND = 45.0
STEP_PY = """\
import os, sys, time
with open(sys.argv[1], "a") as log:
    log.write("ran\\n")
while not os.path.exists(sys.argv[2]):
    time.sleep(0.01)
print("stepped")
"""


def definitions(root: Path) -> Path:
    return write_tree(root, {
        "step.py": STEP_PY,
        "defs.yaml": """
            kind: Model
            name: offline
            provider: scripted
            script:
              - when: "^step (?P<log>\\\\S+) (?P<gate>\\\\S+)"
                tool_call: { name: step, arguments: { log: "{log}", gate: "{gate}" } }
                reply: "done: {tool_result}"
            ---
            kind: Tool
            name: step
            replay: safe
            input_schema: { type: object, properties: { log: { type: string }, gate: { type: string } } }
            command: { argv: [python3, step.py, "{log}", "{gate}"], timeout_s: 60 }
            ---
            kind: Agent
            name: worker
            model: offline
            tools: [step]
        """,
    })


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as received:
        yield received


def attempt(spans: list[ReceivedSpan], n: int) -> list[ReceivedSpan]:
    return [s for s in by_name(spans, "invoke_agent worker") if s.attributes["corral.attempt"] == n]


async def cut_and_resume(first: Node, resumer: Node, receiver: OtlpReceiver, work: Path,
                         restart: bool) -> tuple[ReceivedSpan, ReceivedSpan, dict]:
    """Start the turn on `first`, kill it mid-tool, let `resumer` go on; the first `chat` span, the
    second attempt's span and the turn as GET shows it at the end."""
    log, gate = work / "log", work / "gate"
    async with client_for(first.url) as client:
        conversation = await Conversation.create(client, "worker")
        async with anyio.create_task_group() as tg:
            tg.start_soon(conversation.try_send, f"step {log} {gate}")
            await wait_until(lambda: lines(log), BOUND)
            spans = await anyio.to_thread.run_sync(
                lambda: receiver.wait(lambda got: bool(by_name(got, "chat offline")), BOUND))
            await first.kill()
            tg.cancel_scope.cancel()
    [chat] = by_name(spans, "chat offline")
    open_gate(gate)
    if restart:
        await resumer.start()
    spans = await anyio.to_thread.run_sync(lambda: receiver.wait(lambda got: bool(attempt(got, 2)), BOUND))
    [second] = attempt(spans, 2)
    async with client_for(resumer.url) as client:
        turns = (await client.get(f"{conversation.path}/turns")).json()["items"]
        reply = await client.get(f"{conversation.path}/turns/{turns[0]['id']}", params={"wait": 30})
    return chat, second, reply.json()


def check(chat: ReceivedSpan, second: ReceivedSpan, turn: dict) -> None:
    assert turn["status"] == "completed" and turn["attempts"] == 2, turn
    assert second.trace_id == chat.trace_id == turn["trace_id"]  # one trace across both attempts
    assert second.parent_span_id == ""  # no caller's trace: each attempt is a root of the turn's trace
    attributes = second.attributes
    assert (attributes["corral.turn.id"], attributes["corral.outcome"]) == (turn["id"], "completed")
    steps = [(s["kind"], s["name"], s["attempt"], s["outcome"]) for s in turn["steps"]]
    assert steps == [("model", "worker", 1, "ok"), ("tool", "step", 1, "interrupted"),
                     ("tool", "step", 2, "ok"), ("model", "worker", 2, "ok")], steps


async def test_a_turn_resumed_after_a_kill_goes_on_in_its_trace(tmp_path: Path,
                                                                 receiver: OtlpReceiver) -> None:
    node = Node("single", definitions(tmp_path / "defs"), tmp_path / "state", env=env(receiver))
    try:
        await node.start()
        work = tmp_path / "work"
        work.mkdir()
        chat, second, turn = await cut_and_resume(node, node, receiver, work, restart=True)
    finally:
        node.stop()
    check(chat, second, turn)
    assert second.resource["service.name"] == "corral"


async def test_a_turn_taken_over_by_another_replica_goes_on_in_its_trace(
        tmp_path: Path, receiver: OtlpReceiver, postgres_server: PostgresServer) -> None:
    database = postgres_server.create_database()
    defs = definitions(tmp_path / "defs")
    nodes = [Node(name, defs, tmp_path / f"state-{name}", env=env(
        receiver, OTEL_SERVICE_NAME=f"corral-{name}", CORRAL_DATABASE_URL=database, CORRAL_LEASE_S="2",
        CORRAL_REPLICA_ID=name)) for name in "ab"]
    try:
        for node in nodes:
            await node.start()
        work = tmp_path / "work"
        work.mkdir()
        chat, second, turn = await cut_and_resume(nodes[0], nodes[1], receiver, work, restart=False)
    finally:
        for node in nodes:
            node.stop()
        with contextlib.suppress(RuntimeError):
            postgres_server.drop_database(database)
    check(chat, second, turn)
    assert (chat.resource["service.name"], second.resource["service.name"]) == ("corral-a", "corral-b")
