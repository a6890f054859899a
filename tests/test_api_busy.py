"""A conversation runs one turn at a time: reject, enqueue, interrupt, and idempotent retries.

The first turn of each case waits at a gate (see `tests.support.trees`) that the test
opens when it is done looking, so "busy" never depends on timing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from functools import partial
from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.client import Conversation
from tests.support.events import ended
from tests.support.servers import corral_server
from tests.support.trees import gated_definitions, open_gate

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("busy")
    with corral_server(gated_definitions(root / "defs"), root / "state") as url:
        yield url


@pytest.fixture
async def client(base_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=base_url, timeout=15, trust_env=False) as http:
        yield http


@pytest.fixture
def conversation_of(client: httpx.AsyncClient):
    async def create(agent: str = "gated") -> Conversation:
        return await Conversation.create(client, agent)

    return create


def busy_turn_id(reply: httpx.Response) -> str:
    assert reply.status_code == 409, reply.text
    error = reply.json()["error"]
    assert error["code"] == "conversation_busy"
    return error["details"]["turn_id"]


async def test_reject_answers_409_naming_the_running_turn(conversation_of, tmp_path: Path) -> None:
    c = await conversation_of()
    gate = tmp_path / "gate"
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.send, f"wait {gate}")
            turn_id = await c.started()
            assert (await c.get())["status"] == "busy"
            listed = await c.client.get("/v1/conversations", params={"status": "busy", "agent": "gated"})
            assert c.id in [item["id"] for item in listed.json()["items"]]
            assert busy_turn_id(await c.client.delete(f"/v1/conversations/{c.id}")) == turn_id
            assert busy_turn_id(await c.send("hello")) == turn_id
            assert busy_turn_id(await c.send("hello", if_busy="reject")) == turn_id
            open_gate(gate)
    assert c.replies[-1].json()["turn_id"] == turn_id and c.replies[-1].json()["status"] == "completed"
    assert [t["id"] for t in await c.turns()] == [turn_id]


@pytest.mark.parametrize("senders", [2, 4])
async def test_concurrent_sends_exactly_one_runs(conversation_of, tmp_path: Path, senders: int) -> None:
    c = await conversation_of()
    gate = tmp_path / "gate"
    rejected = anyio.Event()

    async def send() -> None:
        if (await c.send(f"wait {gate}")).status_code == 409 and len(c.replies) == senders - 1:
            rejected.set()

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            for _ in range(senders):
                tg.start_soon(send)
            await rejected.wait()  # every other sender has its answer: now let the one turn finish
            open_gate(gate)
    ok = [r for r in c.replies if r.status_code == 200]
    assert len(ok) == 1, [r.text for r in c.replies]
    turn_id = ok[0].json()["turn_id"]
    assert [busy_turn_id(r) for r in c.replies if r is not ok[0]] == [turn_id] * (senders - 1)
    assert [t["id"] for t in await c.turns()] == [turn_id]


async def test_a_rejection_always_names_a_turn(conversation_of) -> None:
    """However quick turns and concurrent sends interleave, every 409 names a turn of the conversation."""
    c = await conversation_of()
    with anyio.fail_after(30):
        for _ in range(10):
            async with anyio.create_task_group() as tg:
                for _ in range(4):
                    tg.start_soon(c.send, "hello")
    rejected = {busy_turn_id(r) for r in c.replies if r.status_code != 200}
    assert rejected <= {t["id"] for t in await c.turns()}


@pytest.mark.parametrize(("agent", "fields"), [("queued", {}), ("gated", {"if_busy": "enqueue"})])
async def test_enqueue_runs_both_in_order(conversation_of, tmp_path: Path, agent: str,
                                          fields: dict[str, str]) -> None:
    c = await conversation_of(agent)
    first_gate, second_gate = tmp_path / "first", tmp_path / "second"
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.send, f"wait {first_gate}")
            first = await c.started()
            tg.start_soon(partial(c.send, f"wait {second_gate}", **fields))
            # Had the second turn run beside the first, this would let it finish first.
            open_gate(second_gate)
            open_gate(first_gate)
    assert [r.status_code for r in c.replies] == [200, 200], [r.text for r in c.replies]
    turns = await c.turns()
    assert {r.json()["turn_id"] for r in c.replies} == {t["id"] for t in turns}
    assert [t["status"] for t in turns] == ["completed", "completed"]
    assert turns[0]["id"] == first and turns[0]["ended_at"] <= turns[1]["started_at"]
    events = await c.events(ended(turns[1]["id"]))
    starts_and_ends = [(e.name, e.data["turn_id"]) for e in events if e.name.startswith("turn.")]
    assert starts_and_ends == [("turn.started", first), ("turn.completed", first),
                               ("turn.started", turns[1]["id"]), ("turn.completed", turns[1]["id"])]


async def test_interrupt_policy_cancels_the_running_turn(conversation_of, tmp_path: Path) -> None:
    c = await conversation_of()
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.send, f"wait {tmp_path / 'never'}")
            first = await c.started()
            second = await c.send("hello", if_busy="interrupt")
    assert second.status_code == 200 and second.json()["status"] == "completed"
    assert second.json()["output"] == "echo: hello"
    cancelled = next(r for r in c.replies if r is not second)
    assert cancelled.json()["turn_id"] == first and cancelled.json()["status"] == "cancelled"
    turns = await c.turns()
    assert [(t["id"], t["status"]) for t in turns] == [(first, "cancelled"), (second.json()["turn_id"],
                                                                             "completed")]
    events = await c.events(ended(second.json()["turn_id"]))
    assert [e.data["turn_id"] for e in events if e.name == "turn.cancelled"] == [first]


async def test_interrupt_route_cancels_the_running_turn(conversation_of, tmp_path: Path) -> None:
    c = await conversation_of()
    idle = await c.client.post(f"/v1/conversations/{c.id}/interrupt")
    assert idle.status_code == 200 and idle.json() == {"interrupted": False, "turn_id": None}
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.send, f"wait {tmp_path / 'never'}")
            turn_id = await c.started()
            r = await c.client.post(f"/v1/conversations/{c.id}/interrupt")
            assert r.status_code == 200 and r.json() == {"interrupted": True, "turn_id": turn_id}
        events = await c.events(ended(turn_id))
        assert events[-1].name == "turn.cancelled"
        assert c.replies[0].json()["status"] == "cancelled"
        again = await c.send("hello")  # the conversation is free again
    assert again.status_code == 200 and again.json()["output"] == "echo: hello"
    assert [t["status"] for t in await c.turns()] == ["cancelled", "completed"]
    missing = await c.client.post("/v1/conversations/conv_nope/interrupt")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "conversation_not_found"


async def test_idempotency_key_returns_the_first_result(conversation_of) -> None:
    c = await conversation_of()
    with anyio.fail_after(15):
        first = await c.send("hello", key="k-1")
        retry = await c.send("hello", key="k-1")
        other = await c.send("hello", key="k-2")
        elsewhere = await (await conversation_of()).send("hello", key="k-1")  # keys are per conversation
    assert first.status_code == retry.status_code == 200
    assert retry.json() == first.json()
    assert other.json()["turn_id"] != first.json()["turn_id"]
    assert elsewhere.status_code == 200 and elsewhere.json()["turn_id"] != first.json()["turn_id"]
    assert [t["id"] for t in await c.turns()] == [first.json()["turn_id"], other.json()["turn_id"]]


async def test_idempotent_retry_while_the_turn_runs_waits_for_it(conversation_of, tmp_path: Path) -> None:
    c = await conversation_of()
    gate = tmp_path / "gate"
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(c.send, f"wait {gate}", key="k"))
            turn_id = await c.started()
            tg.start_soon(partial(c.send, f"wait {gate}", key="k"))  # a retry is no second message: no 409
            # A streamed retry shows it joined the running turn: its turn.started arrives before the end.
            async with c.streaming(f"wait {gate}", key="k") as events:
                streamed = []
                async for event in events:
                    streamed.append(event)
                    if event.name == "turn.started":
                        open_gate(gate)
    assert [r.status_code for r in c.replies] == [200, 200], [r.text for r in c.replies]
    assert c.replies[0].json() == c.replies[1].json() and c.replies[0].json()["turn_id"] == turn_id
    assert streamed[0].data["turn_id"] == streamed[-1].data["turn_id"] == turn_id
    assert [e.name for e in streamed][-1] == "turn.completed"
    assert [t["id"] for t in await c.turns()] == [turn_id]


@pytest.mark.parametrize("agent", ["gated", "queued"])
async def test_concurrent_requests_with_one_key_make_one_turn(conversation_of, agent: str) -> None:
    for _ in range(5):  # the requests race differently each time
        c = await conversation_of(agent)
        with anyio.fail_after(15):
            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(partial(c.send, "hello", key="same"))
        assert [r.status_code for r in c.replies] == [200] * 3, [r.text for r in c.replies]
        assert len({r.json()["turn_id"] for r in c.replies}) == 1
        assert len(await c.turns()) == 1


async def test_interrupt_cancels_every_turn_queued_before_it(conversation_of, tmp_path: Path) -> None:
    """Four quick interrupting requests: three end cancelled, only the newest one runs to its end."""
    c = await conversation_of()
    gate = tmp_path / "gate"
    three_answered = anyio.Event()

    async def send() -> None:
        await c.send(f"wait {gate}", if_busy="interrupt")
        if len(c.replies) == 3:
            three_answered.set()

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(send)
            await c.started()
            for _ in range(3):
                tg.start_soon(send)
            await three_answered.wait()  # had any queued turn survived, it would still be waiting
            open_gate(gate)
    statuses = [r.json()["status"] for r in c.replies]
    assert [r.status_code for r in c.replies] == [200] * 4, [r.text for r in c.replies]
    assert statuses == ["cancelled"] * 3 + ["completed"], statuses
    turns = await c.turns()
    assert sorted(t["status"] for t in turns) == ["cancelled"] * 3 + ["completed"]
    assert {t["id"] for t in turns} == {r.json()["turn_id"] for r in c.replies}
    last = c.replies[-1].json()["turn_id"]
    events = await c.events(ended(last))
    for turn in turns:  # every turn, even one that never ran, starts and ends once in the event log
        ends = [e.name for e in events if e.name.startswith("turn.") and e.data["turn_id"] == turn["id"]]
        assert ends == ["turn.started", "turn." + turn["status"]], (turn, ends)


async def test_an_idempotency_key_reused_with_another_body_is_422(conversation_of, tmp_path: Path) -> None:
    c = await conversation_of()
    gate = tmp_path / "gate"
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(c.send, f"wait {gate}", key="k"))
            turn_id = await c.started()
            in_flight = await c.send("something else", key="k")
            open_gate(gate)
        stored = await c.send("something else", key="k")
        policy = await c.send(f"wait {gate}", key="k", if_busy="enqueue")
        same = await c.send(f"wait {gate}", key="k", stream=False)  # how it is answered is no difference
    for reply in (in_flight, stored, policy):
        assert reply.status_code == 422, reply.text
        assert reply.json()["error"]["code"] == "idempotency_key_reused"
    assert stored.json()["error"]["details"] == {"turn_id": turn_id}
    assert same.status_code == 200 and same.json()["turn_id"] == turn_id
    assert [t["id"] for t in await c.turns()] == [turn_id]
