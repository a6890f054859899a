"""Hot swap while conversations run: busy reports, old turns on old digests, rejects, bursts, load.

The watcher tests edit real files under a real `watchfiles` watcher; the load
test reloads through `POST /v1/definitions/reload` so that ten swaps happen
exactly when it says. Turns are held open by tools that return when the test
lets them (a gate file, a loopback endpoint), never by timing.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx
import pytest

from server.compiler.compiler import Compiler
from tests.support.client import Conversation
from tests.support.events import ended, named, server_events, swap_reported
from tests.support.servers import corral_server
from tests.support.swaps import reload, set_digest, swaps, watcher_live
from tests.support.trees import (
    agent_digest,
    broken_edited_yaml,
    edited_yaml,
    line_of,
    open_gate,
    versioned_definitions,
    write_atomic,
)

pytestmark = pytest.mark.anyio


def client_for(base_url: str) -> httpx.AsyncClient:
    # Idle connections are dropped well before uvicorn's 5 s keep-alive time-out closes them, so a
    # request never goes out on a connection the server is closing at that moment.
    limits = httpx.Limits(max_connections=300, max_keepalive_connections=300, keepalive_expiry=1.0)
    return httpx.AsyncClient(base_url=base_url, timeout=30, trust_env=False, limits=limits)


async def test_watched_edit_reports_the_busy_turn_which_ends_on_the_old_digest(tmp_path: Path) -> None:
    defs = versioned_definitions(tmp_path / "defs", "v1")
    v1, v2 = agent_digest(defs), agent_digest(versioned_definitions(tmp_path / "v2", "v2"))
    gate = tmp_path / "gate"
    with corral_server(defs, tmp_path / "state", watch=True) as url:
        async with client_for(url) as client:
            assert (await watcher_live(client, defs))["status"] == "applied"
            busy, other_busy, idle, other_idle = [
                await Conversation.create(client, agent) for agent in ("edited", "other", "edited", "other")]

            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg, server_events(client) as events:
                    for held in (busy, other_busy):
                        tg.start_soon(held.say, f"wait {gate}")
                    turn_id = await busy.started()
                    await other_busy.started()
                    write_atomic(defs / "edited.yaml", edited_yaml("v2"))
                    report = (await events.wait(swap_reported())).data
                    open_gate(gate)
                after = await busy.say("hello")
                fresh = await idle.say("hello")
                untouched = await other_idle.say("hello")
            stored = await busy.turns()
    held_busy, held_other = busy.replies[0].json(), other_busy.replies[0].json()

    assert report["status"] == "applied" and report["trigger"] == "watch", report
    assert {(c["kind"], c["name"], c["change"]) for c in report["changes"]} == {
        ("Agent", "edited", "changed"), ("Model", "m_edited", "changed")}
    assert next(c for c in report["changes"] if c["kind"] == "Agent")["from"] == v1
    [entry] = report["busy"]  # not the other agent's busy turn, not the idle conversations
    assert entry.pop("since")
    assert entry == {"conversation_id": busy.id, "agent": "edited", "digest": v1, "turn_id": turn_id}

    assert (held_busy["turn_id"], held_busy["digest"]) == (turn_id, v1)
    assert held_busy["status"] == "completed" and held_busy["output"] == "v1 passed the gate"
    assert held_other["output"] == "other passed the gate"
    assert (after["digest"], after["output"]) == (v2, "v2: hello")
    assert (fresh["digest"], fresh["output"]) == (v2, "v2: hello")
    assert untouched["output"] == "other: hello"
    assert [(t["id"], t["digest"]) for t in stored] == [(turn_id, v1), (after["turn_id"], v2)]


async def test_a_broken_edit_is_rejected_and_the_old_set_keeps_serving(tmp_path: Path) -> None:
    defs = versioned_definitions(tmp_path / "defs", "v1")
    v1 = agent_digest(defs)
    with corral_server(defs, tmp_path / "state", watch=True) as url:
        async with client_for(url) as client:
            assert (await watcher_live(client, defs))["status"] == "applied"
            before = await set_digest(client)
            conversation = await Conversation.create(client, "edited")
            with anyio.fail_after(20):
                async with server_events(client) as events:
                    write_atomic(defs / "edited.yaml", broken_edited_yaml())
                    rejected = (await events.wait(named("definitions.rejected"))).data
                latest = (await swaps(client))[0]
                kept = await conversation.say("hello")
                still = await set_digest(client)
                async with server_events(client) as events:
                    write_atomic(defs / "edited.yaml", edited_yaml("v2"))
                    swapped = (await events.wait(named("definitions.swapped"))).data
                fixed = await conversation.say("hello")
                now = await set_digest(client)

    assert rejected["status"] == "rejected" and rejected["trigger"] == "watch"
    assert rejected["previous"] == rejected["current"] == before and rejected["changes"] == []
    [error] = rejected["errors"]
    assert (error["code"], error["file"], error["line"]) == (
        "definitions_invalid", "edited.yaml", line_of(defs / "edited.yaml", "model:"))
    assert (error["kind"], error["name"], error["field"]) == ("Agent", "edited", "model")
    assert "m_missing" in error["message"]
    assert latest == rejected  # the history keeps the same report
    assert still == before and (kept["digest"], kept["output"]) == (v1, "v1: hello")
    assert swapped["status"] == "applied" and swapped["previous"] == before and swapped["current"] == now
    assert fixed["output"] == "v2: hello" and fixed["digest"] != v1


async def test_a_burst_of_writes_ends_in_the_final_state_and_applies_nothing_between(tmp_path: Path) -> None:
    defs = versioned_definitions(tmp_path / "defs", "b0")
    with corral_server(defs, tmp_path / "state", watch=True) as url:
        async with client_for(url) as client:
            probe = await watcher_live(client, defs)
            assert probe["status"] == "applied"
            initial = probe["current"]
            seen = len(await swaps(client))
            # Every write a whole state (odd ones do not compile, the last one does), staged as hidden
            # files beforehand, so that the burst itself is nothing but 20 renames.
            staged = []
            for i in range(1, 21):
                staged.append(defs / f".edited.yaml.{i}")
                write_atomic(staged[-1], edited_yaml(f"b{i}") if i % 2 == 0 else broken_edited_yaml(f"b{i}"))
            async with server_events(client) as events:
                started = time.monotonic()
                for path in staged:
                    os.replace(path, defs / "edited.yaml")
                elapsed = time.monotonic() - started
                final = Compiler(defs).compile().digest
                with anyio.fail_after(15):  # the set served once a report says so
                    await events.wait(swap_reported(lambda report: report["current"] == final))
            history = await swaps(client)
            answer = await (await Conversation.create(client, "edited")).say("hello")

    assert elapsed < 0.1
    reports = history[: len(history) - seen]
    applied = [r for r in reports if r["status"] == "applied"]
    assert applied and applied[0]["current"] == final
    assert all({r["previous"], r["current"]} <= {initial, final} for r in applied), applied
    assert answer["output"] == "b20: hello"


# --- swaps under load ----------------------------------------------------------


class Hold:
    """A loopback HTTP endpoint that answers only once released: a turn in its tool stays in flight."""

    def __init__(self, expected: int):
        self.expected = expected
        self.arrived = 0
        self.all_arrived = anyio.Event()
        self.released = anyio.Event()

    async def handle(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            request = b""
            try:
                while b"\r\n\r\n" not in request:
                    request += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return
            self.arrived += 1
            if self.arrived >= self.expected:
                self.all_arrived.set()
            await self.released.wait()
            await stream.send(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")


def load_yaml(version: str, port: int) -> str:
    return f"""
        kind: Model
        name: m_load
        provider: scripted
        script:
          - when: "^hold"
            tool_call: {{ name: hold }}
            reply: "{version} held"
        default: "{version}: {{input}}"
        ---
        kind: Tool
        name: hold
        description: Return once the test lets it.
        http: {{ method: GET, url: "http://127.0.0.1:{port}/hold", timeout_s: 60 }}
        ---
        kind: Agent
        name: worker
        model: m_load
        tools: [hold]
    """


CONVERSATIONS, SWAPS = 100, 10


async def test_turns_in_flight_through_ten_swaps_complete_on_the_digest_they_started(tmp_path: Path) -> None:
    hold = Hold(CONVERSATIONS)
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    defs = tmp_path / "defs"
    write_atomic(defs / "load.yaml", load_yaml("s0", port))
    conversations: dict[str, Conversation] = {}
    results: dict[str, list[dict[str, Any]]] = {}
    reports: list[dict[str, Any]] = []
    async with listener, anyio.create_task_group() as endpoint:
        endpoint.start_soon(listener.serve, hold.handle)
        with corral_server(defs, tmp_path / "state") as url:
            async with client_for(url) as client:
                initial = (await client.get("/v1/agents/worker")).json()["digest"]
                stop = anyio.Event()

                async def converse() -> None:
                    conversation = await Conversation.create(client, "worker")
                    conversations[conversation.id] = conversation
                    results[conversation.id] = [await conversation.say("hold")]
                    if not stop.is_set():  # a new turn, starting while the last swaps happen
                        results[conversation.id].append(await conversation.say("hello"))

                with anyio.fail_after(60):
                    async with anyio.create_task_group() as tg:
                        for _ in range(CONVERSATIONS):
                            tg.start_soon(converse)
                        await hold.all_arrived.wait()
                        for i in range(1, SWAPS + 1):
                            write_atomic(defs / "load.yaml", load_yaml(f"s{i}", port))
                            reports.append(await reload(client))
                            if i == SWAPS // 2:
                                hold.released.set()  # the held turns end while the next swaps happen
                        stop.set()
                    last_turns = {cid: r[-1]["turn_id"] for cid, r in results.items()}
                    announced, stored = await gather_turns(conversations, last_turns)
        endpoint.cancel_scope.cancel()

    assert [r["status"] for r in reports] == ["applied"] * SWAPS
    ids = sorted(results)
    assert len(ids) == CONVERSATIONS
    version = {initial: "s0"} | {c["to"]: f"s{i}" for i, r in enumerate(reports, 1)
                                 for c in r["changes"] if c["kind"] == "Agent"}
    assert len(version) == SWAPS + 1
    for report in reports[: SWAPS // 2]:  # every held turn was busy on the first digest
        assert sorted((b["conversation_id"], b["turn_id"], b["digest"]) for b in report["busy"]) == sorted(
            (cid, results[cid][0]["turn_id"], initial) for cid in ids)
    for cid in ids:
        first, *rest = results[cid]
        assert (first["status"], first["digest"], first["output"]) == ("completed", initial, "s0 held")
        for r in rest:
            assert r["status"] == "completed", r
            assert r["output"] == f"{version[r['digest']]}: hello"
        assert [(t["id"], t["digest"], t["status"]) for t in stored[cid]] == [
            (r["turn_id"], r["digest"], "completed") for r in results[cid]]
        assert announced[cid] == {r["turn_id"]: r["digest"] for r in results[cid]}
        order = [int(version[r["digest"]][1:]) for r in results[cid]]
        assert order == sorted(order)  # a by-name conversation never goes back to an older digest


async def gather_turns(conversations: dict[str, Conversation], last_turns: dict[str, str]
                       ) -> tuple[dict[str, dict[str, str]], dict[str, list[dict[str, Any]]]]:
    """For each conversation: turn_id -> the digest its `turn.started` announced; its stored turns."""
    announced: dict[str, dict[str, str]] = {}
    stored: dict[str, list[dict[str, Any]]] = {}

    async def read(conversation_id: str, last_turn: str) -> None:
        conversation = conversations[conversation_id]
        events = await conversation.events(ended(last_turn))
        announced[conversation_id] = {e.data["turn_id"]: e.data["digest"]
                                      for e in events if e.name == "turn.started"}
        stored[conversation_id] = await conversation.turns()

    async with anyio.create_task_group() as tg:
        for conversation_id, last_turn in last_turns.items():
            tg.start_soon(read, conversation_id, last_turn)
    return announced, stored
