"""Turn events over SSE: the order of a streamed turn, replay, `Last-Event-ID`, disconnects.

Turns that must still be running while the test looks are held open by the
gate tool (see `tests.support.trees`), so every case is deterministic.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.client import Conversation
from tests.support.events import Event, conversation_events, ended, named
from tests.support.servers import corral_server
from tests.support.trees import gated_definitions, open_gate

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



async def test_streamed_turn_events_in_order(client: httpx.AsyncClient, tmp_path: Path) -> None:
    conversation = await Conversation.create(client, "gated")
    gate = tmp_path / "open"
    open_gate(gate)
    with anyio.fail_after(15):
        events = await conversation.stream(f"wait {gate}")

    ids = [e.id for e in events]
    assert all(i is not None for i in ids) and ids == sorted(set(ids)), ids
    names = [e.name for e in events]
    assert names[0] == "turn.started" and names[-1] == "turn.completed", names
    assert names.index("tool.started") < names.index("tool.finished") < names.index("message.delta")
    started, completed = events[0].data, events[-1].data
    assert started["turn_id"].startswith("turn_") and started["digest"] == conversation.created["digest"]
    assert completed["turn_id"] == started["turn_id"]
    deltas = [e.data for e in events if e.name == "message.delta"]
    assert all(set(d) == {"text"} for d in deltas)
    assert "".join(d["text"] for d in deltas) == completed["output"] == "passed the gate"
    finished = next(e.data for e in events if e.name == "tool.finished")
    assert finished["name"] == "gate" and finished["is_error"] is False


async def test_events_replay_from_the_first_without_last_event_id(client: httpx.AsyncClient) -> None:
    conversation = await Conversation.create(client, "gated")
    with anyio.fail_after(15):
        first = await conversation.stream("hello")
        second = await conversation.stream("again")
        replayed = await conversation.events(ended(second[0].data["turn_id"]))
    assert replayed[0].id == 1 and replayed[0].name == "turn.started"
    assert replayed == first + second
    assert [e.id for e in replayed] == list(range(1, len(replayed) + 1))


async def test_last_event_id_yields_exactly_the_events_after_it(client: httpx.AsyncClient) -> None:
    conversation = await Conversation.create(client, "gated")
    with anyio.fail_after(15):
        events = await conversation.stream("hello")
        done = ended(events[0].data["turn_id"])
        for position, event in enumerate(events[:-1]):
            resumed = await conversation.events(done, last_event_id=event.id)
            assert resumed == events[position + 1 :]


async def test_resume_while_a_turn_is_running(client: httpx.AsyncClient, tmp_path: Path) -> None:
    conversation = await Conversation.create(client, "gated")
    gate = tmp_path / "gate"

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(conversation.send, f"wait {gate}")
            # the first client sees the turn reach the tool, then goes away
            before = await conversation.events(named("tool.started"))
            assert [e.name for e in before] == ["turn.started", "tool.started"]
            # the next one resumes after turn.started, while the turn still waits at the gate
            after: list[Event] = []
            async with conversation_events(client, conversation.id, before[0].id) as events:
                async for event in events:
                    after.append(event)
                    if event.name == "tool.started":
                        open_gate(gate)  # only now can the turn go on: the rest arrives live
                    if ended()(event):
                        break
        replies = conversation.replies
        assert replies[0].status_code == 200 and replies[0].json()["status"] == "completed"
        full = await conversation.events(ended())

    assert after[0] == before[1]
    assert [e.id for e in after] == list(range(before[0].id + 1, after[-1].id + 1))
    assert full == before[:1] + after
    assert after[-1].name == "turn.completed"


async def test_resume_with_nothing_missed_gets_only_live_events(client: httpx.AsyncClient,
                                                               tmp_path: Path) -> None:
    conversation = await Conversation.create(client, "gated")
    gate = tmp_path / "gate"
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(conversation.send, f"wait {gate}")
            before = await conversation.events(named("tool.started"))
            async with conversation_events(client, conversation.id, before[-1].id) as events:
                open_gate(gate)
                after = []
                async for event in events:
                    after.append(event)
                    if ended()(event):
                        break
    assert after[0].id == before[-1].id + 1 and after[0].name == "tool.finished"
    assert [e.id for e in after] == list(range(after[0].id, after[-1].id + 1))


async def test_client_disconnect_leaves_the_turn_running(client: httpx.AsyncClient, tmp_path: Path) -> None:
    conversation = await Conversation.create(client, "gated")
    gate = tmp_path / "gate"
    with anyio.fail_after(20):
        async with conversation.streaming(f"wait {gate}") as events:
            async for event in events:
                assert event.name == "turn.started"
                turn_id = event.data["turn_id"]
                break  # leaving the block closes the connection mid-turn
        await conversation.events(named("tool.started"))  # still running without its client
        open_gate(gate)
        events = await conversation.events(ended(turn_id))
    assert events[-1].name == "turn.completed"

    turns = await conversation.turns()
    assert [(t["id"], t["status"]) for t in turns] == [(turn_id, "completed")]
    messages = await conversation.messages()
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[-1]["content"] == "passed the gate"
    assert (await conversation.get())["status"] == "idle"


async def test_streamed_idempotent_retry_replays_only_its_own_turn(client: httpx.AsyncClient) -> None:
    conversation = await Conversation.create(client, "gated")
    with anyio.fail_after(15):
        await conversation.stream("first")
        streams = [await conversation.stream("second", key="retry-me") for _ in range(2)]
    original, retried = streams
    assert retried == original
    assert original[0].name == "turn.started" and original[-1].name == "turn.completed"
    assert original[-1].data["output"] == "echo: second"
