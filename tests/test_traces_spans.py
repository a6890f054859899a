"""The spans inside a turn beyond model requests and tools (§13): hooks, a permission wait, a
sub-agent's turn under its tool call, a compaction and a swap, exported by a real `corral serve` to
a real OTLP receiver; and the steps `GET …/turns/{turn_id}` shows of the turn that waited (its
hook among them), with no exporter.

Agent `boss` (scripted) delegates to the sub-agent `helper`, or calls `careful`, a tool that asks a
person first; its `pre_tool_use` hook `note` writes the `TRACEPARENT` it was run with to a file.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.client import Conversation
from tests.support.otlp import OtlpReceiver, ReceivedSpan, by_name, env
from tests.support.servers import ServerProcess
from tests.support.trees import write_tree

pytestmark = pytest.mark.anyio

NOTE_PY = "import os, sys; sys.stdin.read(); open(sys.argv[1], 'w').write(os.environ.get('TRACEPARENT', ''))"


def definitions(root: Path, noted: Path) -> Path:
    return write_tree(root, {
        "defs.yaml": f"""
            kind: Model
            name: offline
            provider: scripted
            context_window: 100000
            script:
              - when: "^delegate"
                tool_call: {{ name: helper, arguments: {{ message: "inner" }} }}
                reply: "helper said: {{tool_result}}"
              - when: "^risky"
                tool_call: {{ name: careful }}
                reply: "careful said: {{tool_result}}"
            default: "echo: {{input}}"
            ---
            kind: Tool
            name: careful
            permission: ask
            input_schema: {{ type: object, properties: {{}} }}
            command: {{ argv: [python3, -c, "print('carefully done')"] }}
            ---
            kind: Hook
            name: note
            event: pre_tool_use
            command: [python3, -c, "{NOTE_PY}", "{noted}"]
            ---
            kind: Agent
            name: helper
            description: Answers whatever it is asked.
            model: offline
            ---
            kind: Agent
            name: boss
            model: offline
            tools: [careful]
            agents: [helper]
            hooks: [note]
            context: {{ strategy: truncate, keep_recent_turns: 1 }}
        """,
    })


def one(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    [found] = by_name(spans, name)
    return found


async def risky_turn(client: httpx.AsyncClient, conversation: Conversation) -> dict:
    """`risky`, answered 202 while it waits; allowed; the turn once it ended."""
    reply = await conversation.send("risky")
    assert reply.status_code == 202, reply.text
    [request] = reply.json()["permission_requests"]
    decided = await client.post(f"{conversation.path}/permissions/{request['request_id']}",
                                json={"decision": "allow"})
    assert decided.status_code == 200, decided.text
    ended = await client.get(f"{conversation.path}/turns/{reply.json()['turn_id']}", params={"wait": 30})
    assert ended.status_code == 200 and ended.json()["status"] == "completed", ended.text
    return ended.json()


async def test_hooks_permission_waits_sub_agents_and_swaps_are_spans(tmp_path: Path) -> None:
    noted = tmp_path / "noted"
    defs = definitions(tmp_path / "defs", noted)
    with OtlpReceiver() as receiver, ServerProcess(defs, tmp_path / "state", env=env(receiver)) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30, trust_env=False) as client:
            conversation = await Conversation.create(client, "boss")
            with anyio.fail_after(60):
                assert (await conversation.say("delegate"))["output"] == "helper said: echo: inner"
                await risky_turn(client, conversation)
                compacted = (await client.post(f"{conversation.path}/compact")).json()
                assert compacted["compacted"] is True, compacted
                (defs / "more.yaml").write_text("kind: Agent\nname: extra\nmodel: offline\n")
                swapped = (await client.post("/v1/definitions/reload")).json()
            assert swapped["status"] == "applied"
            helper_digest = (await client.get("/v1/agents/helper")).json()["digest"]
        spans = receiver.wait(lambda got: len(by_name(got, "invoke_agent boss")) == 2
                              and bool(by_name(got, "corral.swap")))
    ids = {s.span_id: s for s in spans}
    # the sub-agent's turn, under the tool call that ran it, with its own digest and model requests
    delegated = one(spans, "execute_tool helper")
    helper = one(spans, "invoke_agent helper")
    assert helper.parent_span_id == delegated.span_id
    assert (helper.attributes["gen_ai.agent.version"], helper.attributes["corral.agent.digest"]) == (
        helper_digest, helper_digest)
    assert delegated.attributes["corral.agent.digest"] == conversation.created["digest"] != helper_digest
    assert [ids[s.parent_span_id].name for s in by_name(spans, "chat offline")
            if ids[s.parent_span_id].name != "invoke_agent boss"] == ["invoke_agent helper"]
    # the hook ran inside each tool call, and its command saw its own span as TRACEPARENT
    hooks = by_name(spans, "hook note")
    assert sorted(ids[h.parent_span_id].name for h in hooks) == [
        "execute_tool careful", "execute_tool helper"]
    assert {(h.attributes["corral.hook.event"], h.attributes["corral.outcome"]) for h in hooks} == {
        ("pre_tool_use", "allow")}
    [careful_hook] = [h for h in hooks if ids[h.parent_span_id].name == "execute_tool careful"]
    assert noted.read_text().split("-")[1:3] == [careful_hook.trace_id, careful_hook.span_id]
    # the wait for a person, inside the call it held up
    waited = one(spans, "permission careful")
    assert ids[waited.parent_span_id].name == "execute_tool careful"
    assert waited.attributes["corral.outcome"] == "allowed"
    # a compaction asked for (no turn runs it): the first turn's tool result cut
    compaction = one(spans, "compaction truncate")
    assert compaction.attributes | {"corral.compaction.source": "-"} == {
        "corral.compaction.strategy": "truncate", "corral.outcome": "compacted",
        "corral.compaction.before": compacted["before"], "corral.compaction.after": compacted["after"],
        "corral.compaction.messages": compacted["messages"], "corral.compaction.source": "-"}
    # the swap, a span of its own
    swap = one(spans, "corral.swap")
    assert swap.attributes == {"corral.swap.trigger": "api", "corral.swap.status": "applied",
                               "corral.set_digest.before": swapped["previous"],
                               "corral.set_digest.after": swapped["current"], "corral.swap.changes": 1,
                               "corral.swap.busy": 0}


async def test_a_turns_steps_without_any_exporter(tmp_path: Path) -> None:
    defs = definitions(tmp_path / "defs", tmp_path / "noted")
    with ServerProcess(defs, tmp_path / "state") as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30, trust_env=False) as client:
            conversation = await Conversation.create(client, "boss")
            with anyio.fail_after(60):
                turn = await risky_turn(client, conversation)
    steps = turn["steps"]
    assert [(s["kind"], s["name"], s["attempt"], s["outcome"]) for s in steps] == [
        ("model", "boss", 1, "ok"), ("tool", "careful", 1, "ok"), ("hook", "note", 1, "allow"),
        ("permission", "careful", 1, "allowed"), ("model", "boss", 1, "ok")]
    assert all(s["started_at"] <= s["ended_at"] for s in steps)
    first, last = steps[0]["usage"], steps[-1]["usage"]  # what each model request used, the turn's in all
    assert {k: first[k] + last[k] for k in first} == turn["usage"] and min(first.values()) > 0
    tool, hook, wait = steps[1:4]  # the hook, then the wait, inside the tool call
    assert tool["started_at"] <= hook["started_at"] <= hook["ended_at"] <= wait["started_at"]
    assert wait["ended_at"] <= tool["ended_at"]
    assert len(turn["trace_id"]) == 32
