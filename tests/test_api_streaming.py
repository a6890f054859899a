"""Turn events over SSE: the order of a streamed turn, replay, `Last-Event-ID`, disconnects.

Turns that must still be running while the test looks are held open by the
gate tool (see `tests.live`), so every case is deterministic.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from tests.conftest import corral_server
from tests.live import Event, ended, gated_definitions, named, open_gate, read_events, sse

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("streaming")
    with corral_server(gated_definitions(root / "defs"), root / "state") as url:
        yield url


@pytest.fixture
async def client(base_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=base_url, timeout=10, trust_env=False) as http:
        yield http


async def new_conversation(client: httpx.AsyncClient, agent: str = "gated") -> dict:
    r = await client.post("/v1/conversations", json={"agent": agent})
    assert r.status_code == 201, r.text
    return r.json()


async def stream_turn(client: httpx.AsyncClient, conversation_id: str, content: str) -> list[Event]:
    body = {"content": content, "stream": True}
    async with client.stream("POST", f"/v1/conversations/{conversation_id}/messages", json=body) as r:
        assert r.status_code == 200, await r.aread()
        assert r.headers["content-type"].startswith("text/event-stream")
        return [event async for event in sse(r)]  # the server ends the stream with the turn


async def send(client: httpx.AsyncClient, conversation_id: str, content: str) -> httpx.Response:
    return await client.post(f"/v1/conversations/{conversation_id}/messages", json={"content": content})


async def test_streamed_turn_events_in_order(client: httpx.AsyncClient, tmp_path: Path) -> None:
    conversation = await new_conversation(client)
    gate = tmp_path / "open"
    open_gate(gate)
    with anyio.fail_after(15):
        events = await stream_turn(client, conversation["id"], f"wait {gate}")

    ids = [e.id for e in events]
    assert all(i is not None for i in ids) and ids == sorted(set(ids)), ids
    names = [e.name for e in events]
    assert names[0] == "turn.started" and names[-1] == "turn.completed", names
    assert names.index("tool.started") < names.index("tool.finished") < names.index("message.delta")
    started, completed = events[0].data, events[-1].data
    assert started["turn_id"].startswith("turn_") and started["digest"] == conversation["digest"]
    assert completed["turn_id"] == started["turn_id"]
    deltas = [e.data for e in events if e.name == "message.delta"]
    assert all(set(d) == {"text"} for d in deltas)
    assert "".join(d["text"] for d in deltas) == completed["output"] == "passed the gate"
    finished = next(e.data for e in events if e.name == "tool.finished")
    assert finished["name"] == "gate" and finished["is_error"] is False


async def test_events_replay_from_the_first_without_last_event_id(client: httpx.AsyncClient) -> None:
    conversation = await new_conversation(client)
    with anyio.fail_after(15):
        first = await stream_turn(client, conversation["id"], "hello")
        second = await stream_turn(client, conversation["id"], "again")
        replayed = await read_events(client, conversation["id"], ended(second[0].data["turn_id"]))
    assert replayed[0].id == 1 and replayed[0].name == "turn.started"
    assert replayed == first + second
    assert [e.id for e in replayed] == list(range(1, len(replayed) + 1))


async def test_last_event_id_yields_exactly_the_events_after_it(client: httpx.AsyncClient) -> None:
    conversation = await new_conversation(client)
    with anyio.fail_after(15):
        events = await stream_turn(client, conversation["id"], "hello")
        done = ended(events[0].data["turn_id"])
        for position, event in enumerate(events[:-1]):
            resumed = await read_events(client, conversation["id"], done, last_event_id=event.id)
            assert resumed == events[position + 1 :]


async def test_resume_while_a_turn_is_running(client: httpx.AsyncClient, tmp_path: Path) -> None:
    conversation = await new_conversation(client)
    cid, gate = conversation["id"], tmp_path / "gate"
    replies: list[httpx.Response] = []

    async def send_waiting() -> None:
        replies.append(await send(client, cid, f"wait {gate}"))

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(send_waiting)
            # the first client sees the turn reach the tool, then goes away
            before = await read_events(client, cid, named("tool.started"))
            assert [e.name for e in before] == ["turn.started", "tool.started"]
            # the next one resumes after turn.started, while the turn still waits at the gate
            after: list[Event] = []
            headers = {"Last-Event-ID": str(before[0].id)}
            async with client.stream("GET", f"/v1/conversations/{cid}/events", headers=headers) as r:
                async for event in sse(r):
                    after.append(event)
                    if event.name == "tool.started":
                        open_gate(gate)  # only now can the turn go on: the rest arrives live
                    if ended()(event):
                        break
        assert replies[0].status_code == 200 and replies[0].json()["status"] == "completed"
        full = await read_events(client, cid, ended())

    assert after[0] == before[1]
    assert [e.id for e in after] == list(range(before[0].id + 1, after[-1].id + 1))
    assert full == before[:1] + after
    assert after[-1].name == "turn.completed"


async def test_resume_with_nothing_missed_gets_only_live_events(client: httpx.AsyncClient,
                                                               tmp_path: Path) -> None:
    conversation = await new_conversation(client)
    cid, gate = conversation["id"], tmp_path / "gate"
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(send, client, cid, f"wait {gate}")
            before = await read_events(client, cid, named("tool.started"))
            headers = {"Last-Event-ID": str(before[-1].id)}
            async with client.stream("GET", f"/v1/conversations/{cid}/events", headers=headers) as r:
                open_gate(gate)
                after = []
                async for event in sse(r):
                    after.append(event)
                    if ended()(event):
                        break
    assert after[0].id == before[-1].id + 1 and after[0].name == "tool.finished"
    assert [e.id for e in after] == list(range(after[0].id, after[-1].id + 1))


async def test_client_disconnect_leaves_the_turn_running(client: httpx.AsyncClient, tmp_path: Path) -> None:
    conversation = await new_conversation(client)
    cid, gate = conversation["id"], tmp_path / "gate"
    body = {"content": f"wait {gate}", "stream": True}
    with anyio.fail_after(20):
        async with client.stream("POST", f"/v1/conversations/{cid}/messages", json=body) as r:
            async for event in sse(r):
                assert event.name == "turn.started"
                turn_id = event.data["turn_id"]
                break  # leaving the block closes the connection mid-turn
        await read_events(client, cid, named("tool.started"))  # still running without its client
        open_gate(gate)
        events = await read_events(client, cid, ended(turn_id))
    assert events[-1].name == "turn.completed"

    turns = (await client.get(f"/v1/conversations/{cid}/turns")).json()["items"]
    assert [(t["id"], t["status"]) for t in turns] == [(turn_id, "completed")]
    messages = (await client.get(f"/v1/conversations/{cid}/messages")).json()["items"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[-1]["content"] == "passed the gate"
    conversation = (await client.get(f"/v1/conversations/{cid}")).json()
    assert conversation["status"] == "idle"


async def test_streamed_idempotent_retry_replays_only_its_own_turn(client: httpx.AsyncClient) -> None:
    conversation = await new_conversation(client)
    cid = conversation["id"]
    body, headers = {"content": "second", "stream": True}, {"Idempotency-Key": "retry-me"}
    with anyio.fail_after(15):
        await stream_turn(client, cid, "first")
        streams = []
        for _ in range(2):
            async with client.stream("POST", f"/v1/conversations/{cid}/messages", json=body,
                                     headers=headers) as r:
                assert r.status_code == 200
                streams.append([event async for event in sse(r)])
    original, retried = streams
    assert retried == original
    assert original[0].name == "turn.started" and original[-1].name == "turn.completed"
    assert original[-1].data["output"] == "echo: second"
