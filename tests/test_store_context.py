"""The store's context management, on SQLite and on PostgreSQL: compacted views and steered messages.

Same fixtures as `test_store_contract.py` (`store` for replica r1, `other` for r2, once per backend).
"""

from __future__ import annotations

import pytest

from server.errors import LeaseLost
from server.messages import UserMessage
from server.store.base import ContextView
from tests.support import stores
from tests.support.stores import conversations, turn

pytestmark = pytest.mark.anyio

make_store, store, other = stores.make_store, stores.store, stores.other  # the fixtures: r1 and r2


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def view(number: int, upto: int, **fields) -> ContextView:
    return ContextView(conversation_id="c1", number=number, upto_seq=upto, summary=f"summary {number}",
                       tokens=100 * number, created_at=float(number), **fields)


async def held(store, turn_id: str = "t1") -> int:
    """`turn_id` holds c1 on the store's replica: its fence."""
    admitted = await store.admit("c1", turn_id, "reject", 1.0, 1e12)
    assert admitted.fence is not None
    return admitted.fence


async def test_views_commit_with_their_event_and_the_latest_is_in_force(store, other):
    await conversations(store, "c1")
    assert await store.get_context_view("c1") is None
    await store.append("c1", "t0", [UserMessage(content="hi")], [("turn.started", {"turn_id": "t0"})], 1.0)
    fence = await held(store)
    data = {"turn_id": "t1", "before": 900, "after": 300, "messages": 4}
    seq = await store.save_context_view(view(1, 4), "t1", ("context.compacted", data), 2.0, fence=fence)
    assert seq == 2
    last = (await store.list_events("c1"))[-1]
    assert (last.seq, last.name, last.data) == (2, "context.compacted", data)
    first = await store.get_context_view("c1")
    assert first == view(1, 4) and await other.get_context_view("c1") == first
    await store.save_context_view(view(2, 8, cut_seq=6, strategy="truncate"), "t1",
                                  ("context.compacted", data), 3.0, fence=fence)
    assert await other.get_context_view("c1") == view(2, 8, cut_seq=6, strategy="truncate")
    with pytest.raises(LeaseLost):  # a holder that lost the conversation writes nothing
        await store.save_context_view(view(3, 9), "t1", ("context.compacted", data), 4.0, fence=fence + 1)
    with pytest.raises(LeaseLost):  # nor does another replica under the same token
        await other.save_context_view(view(3, 9), "t1", ("context.compacted", data), 4.0, fence=fence)
    assert (await store.get_context_view("c1")).number == 2 and len(await store.list_events("c1")) == 3
    await store.delete_conversation("c1")
    assert await store.get_context_view("c1") is None


async def test_steered_messages_move_into_the_transcript_once(store, other):
    await conversations(store, "c1", "c2")
    fence = await held(store)
    await store.create_turn(turn("t1"))
    assert await store.take_steers("c1", "t1", 1.0, fence=fence) == []  # nothing pending: nothing written
    assert await store.list_events("c1") == [] and await store.list_messages("c1") == []
    await store.append("c1", "t1", [UserMessage(content="first")], [("turn.started", {"turn_id": "t1"})], 1.0)
    ids = [await other.add_steer("c1", "t1", text, 2.0) for text in ("and this", "and that")]
    assert ids[0] < ids[1]
    await other.add_steer("c1", "t-other", "not for t1", 2.0)
    await other.add_steer("c2", "t1", "another conversation", 2.0)
    with pytest.raises(LeaseLost):
        await store.take_steers("c1", "t1", 3.0, fence=fence + 1)
    taken = await store.take_steers("c1", "t1", 3.0, fence=fence)
    assert [content for content, _ in taken] == ["and this", "and that"]
    events = await store.list_events("c1")
    assert [(e.seq, e.name, e.data) for e in events[1:]] == [
        (taken[0][1], "message.steered", {"turn_id": "t1", "content": "and this"}),
        (taken[1][1], "message.steered", {"turn_id": "t1", "content": "and that"})]
    records = await store.list_messages("c1")
    assert [(r.seq, r.turn_id, r.message) for r in records] == [
        (1, "t1", UserMessage(content="first")), (2, "t1", UserMessage(content="and this")),
        (3, "t1", UserMessage(content="and that"))]
    assert await store.take_steers("c1", "t1", 4.0, fence=fence) == []  # taken once
    assert await other.drop_steers("c1", "t1") == []
    assert await other.drop_steers("c1", "t-other") == ["not for t1"]


async def test_a_steered_message_left_behind_is_dropped_once(store, other):
    await conversations(store, "c1")
    first = await store.add_steer("c1", "t1", "one", 1.0)
    await store.add_steer("c1", "t1", "two", 1.0)
    assert await other.drop_steers("c1", "t1", first) == ["one"]
    assert await store.drop_steers("c1", "t1", first) == []
    assert await store.drop_steers("c1", "t1") == ["two"]
    assert await store.take_steers("c1", "t1", 2.0) == []


async def test_several_messages_left_behind_come_back_in_order(store, other):
    await conversations(store, "c1")
    for text in ("one", "two", "three"):
        await store.add_steer("c1", "t1", text, 1.0)
    assert await other.drop_steers("c1", "t1") == ["one", "two", "three"]


async def test_a_message_steered_under_a_key_is_recorded_once(store, other):
    await conversations(store, "c1", "c2")
    first = await store.add_steer("c1", "t1", "one", 10.0, key="k", request="sha256:a", since=0.0)
    assert first is not None
    assert await other.add_steer("c1", "t1", "one", 11.0, key="k", request="sha256:a", since=0.0) is None
    assert await other.steer_key("c1", "k", 0.0) == ("t1", "sha256:a")
    assert await other.steer_key("c2", "k", 0.0) is None  # keys are per conversation
    assert await other.steer_key("c1", "k", 10.5) is None  # recorded before `since`: forgotten
    assert await other.drop_steers("c1", "t1") == ["one"]  # the duplicate added nothing
    # an expired key names a new message
    again = await store.add_steer("c1", "t2", "two", 20.0, key="k", request="sha256:b", since=15.0)
    assert again is not None and await other.steer_key("c1", "k", 15.0) == ("t2", "sha256:b")
    # a message dropped for a turn of its own takes its key along
    assert await other.drop_steers("c1", "t2", again) == ["two"]
    assert await store.steer_key("c1", "k", 0.0) is None
