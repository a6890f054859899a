"""The store's conversation controls, on SQLite and on PostgreSQL: update, archived lists, fork.

Same fixtures as `test_store_contract.py` (`store`, once per backend).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from server.messages import AssistantMessage, UserMessage
from server.store.base import ConversationRecord
from tests.support import stores
from tests.support.stores import DIGEST_B, conversation, conversations, turn

pytestmark = pytest.mark.anyio

make_store, store, other = stores.make_store, stores.store, stores.other  # the fixtures: r1 and r2


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_update_sets_only_the_fields_given(store):
    await conversations(store, "c1")
    record = await store.get_conversation("c1")
    assert record.archived is False and record.forked_from is None
    assert await store.update_conversation("c1", title="Renamed", now=5.0) is True
    assert await store.get_conversation("c1") == replace(record, title="Renamed", updated_at=5.0)
    metadata = {"team": "core", "tags": ["a"], "nil": None}
    assert await store.update_conversation("c1", metadata=metadata, archived=True, now=6.0)
    assert await store.get_conversation("c1") == replace(record, title="Renamed", metadata=metadata,
                                                         archived=True, updated_at=6.0)
    assert await store.update_conversation("c1", title=None, archived=False, now=7.0)  # null is a title
    assert await store.get_conversation("c1") == replace(record, metadata=metadata, updated_at=7.0)
    assert await store.update_conversation("c1", now=8.0) is True  # nothing given: nothing written
    assert (await store.get_conversation("c1")).updated_at == 7.0
    assert await store.update_conversation("missing", title="x", now=9.0) is False
    assert await store.update_conversation("missing", now=9.0) is False


async def test_lists_leave_archived_conversations_out_unless_asked(store):
    await conversations(store, "c0", "c1", "c2", "c3")
    for cid in ("c1", "c3"):
        await store.update_conversation(cid, archived=True, now=10.0)

    async def ids(**filters):
        return [c.id for c in await store.list_conversations(**filters)]

    assert await ids() == ["c2", "c0"]
    assert await ids(archived=False) == ["c2", "c0"]
    assert await ids(archived=True) == ["c3", "c1"]
    assert await ids(archived=True, limit=1) == ["c3"]
    assert await ids(archived=True, after="c3") == ["c1"]
    assert await ids(archived=True, status="busy") == []


def _new(id: str, source: str, turn_id: str | None, **fields) -> ConversationRecord:
    return replace(conversation(id, created_at=50.0, digest=DIGEST_B), title="fork",
                   metadata={"from": source}, forked_from={"conversation_id": source, "turn_id": turn_id},
                   **fields)


async def _three_turns(store) -> None:
    """c1: t1 and t2 ended (two messages each), t3 still running (one message so far)."""
    await conversations(store, "c1")
    for n, status in ((1, "completed"), (2, "failed"), (3, "running")):
        await store.begin_turn(replace(turn(f"t{n}", started_at=float(n)), status=status),
                               ("turn.started", {"turn_id": f"t{n}"}), float(n))
        messages = [UserMessage(content=f"q{n}")]
        if status != "running":
            messages.append(AssistantMessage(content=f"a{n}"))
        await store.append_messages("c1", f"t{n}", messages, now=float(n))


async def _transcript(store, cid: str) -> list[tuple[int, str, str, float]]:
    return [(r.seq, r.turn_id, r.message.content, r.created_at) for r in await store.list_messages(cid)]


async def test_fork_holds_the_ended_turns_messages_and_nothing_else(store):
    await _three_turns(store)
    new = _new("f1", "c1", None)
    assert await store.fork_conversation("c1", new, None) is True
    assert await store.get_conversation("f1") == new
    # numbered from 1, each keeping its source turn and time; the running turn's message is left out
    assert await _transcript(store, "f1") == [(1, "t1", "q1", 1.0), (2, "t1", "a1", 1.0),
                                              (3, "t2", "q2", 2.0), (4, "t2", "a2", 2.0)]
    assert await store.list_turns("f1") == [] and await store.list_events("f1") == []
    # the fork goes on with numbers of its own, and the source is as it was
    await store.append_messages("f1", "t9", [UserMessage(content="next")], now=60.0)
    assert (await _transcript(store, "f1"))[-1] == (5, "t9", "next", 60.0)
    assert await store.append_event("f1", "e", {}, 60.0) == 1
    assert [r.seq for r in await store.list_messages("c1")] == [1, 2, 3, 4, 5]
    assert len(await store.list_events("c1")) == 3


async def test_fork_before_a_turn_holds_only_the_turns_before_it(store):
    await _three_turns(store)
    assert await store.fork_conversation("c1", _new("f2", "c1", "t2"), "t2") is True
    assert await _transcript(store, "f2") == [(1, "t1", "q1", 1.0), (2, "t1", "a1", 1.0)]
    assert (await store.get_conversation("f2")).forked_from == {"conversation_id": "c1", "turn_id": "t2"}
    assert await store.fork_conversation("c1", _new("f3", "c1", "t1"), "t1") is True
    assert await _transcript(store, "f3") == []
    assert await store.fork_conversation("c1", _new("f4", "c1", "t3"), "t3") is True  # before the running one
    assert [seq for seq, *_ in await _transcript(store, "f4")] == [1, 2, 3, 4]


async def test_a_fork_of_nothing_writes_nothing(store):
    await _three_turns(store)
    await conversations(store, "c2")
    await store.create_turn(turn("tx", "c2"))
    assert await store.fork_conversation("missing", _new("f1", "missing", None), None) is False
    assert await store.fork_conversation("c1", _new("f2", "c1", "nope"), "nope") is False
    assert await store.fork_conversation("c1", _new("f3", "c1", "tx"), "tx") is False  # another's turn
    for cid in ("f1", "f2", "f3"):
        assert await store.get_conversation(cid) is None and await store.list_messages(cid) == []


async def test_a_fork_outlives_its_source_and_a_fork_of_a_fork_keeps_its_own_origin(store, other):
    await _three_turns(store)
    await store.fork_conversation("c1", _new("f1", "c1", None), None)
    await store.append_messages("f1", "t1", [UserMessage(content="more")], now=70.0)
    await store.update_turn("t3", status="completed")
    assert await store.delete_conversation("c1")
    assert (await other.get_conversation("f1")).forked_from == {"conversation_id": "c1", "turn_id": None}
    assert len(await other.list_messages("f1")) == 5
    # a fork of a fork: what f1 holds from c1 (naming c1's turns, gone now) is shared too; cut before
    # a turn of f1's own, that turn and what follows are left out
    await other.begin_turn(turn("t5", "f1", started_at=80.0), ("turn.started", {}), 80.0)
    await other.append_messages("f1", "t5", [UserMessage(content="own")], now=80.0)
    await other.end_turn("t5", "f1", {"status": "completed"}, ("turn.completed", {}), 81.0)
    assert await other.fork_conversation("f1", _new("f2", "f1", None), None) is True
    assert [r.message.content for r in await other.list_messages("f2")] == [
        "q1", "a1", "q2", "a2", "more", "own"]
    assert await other.fork_conversation("f1", _new("f3", "f1", "t5"), "t5") is True
    assert [r.message.content for r in await other.list_messages("f3")] == ["q1", "a1", "q2", "a2", "more"]
    assert (await store.get_conversation("f3")).forked_from == {"conversation_id": "f1", "turn_id": "t5"}
    assert await other.fork_conversation("f1", _new("f4", "f1", "t1"), "t1") is False  # c1's, not f1's
