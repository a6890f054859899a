"""One contract for every store: the same tests on SQLite and on a real PostgreSQL, through `Store` only.

Each test runs once per backend (`[sqlite]`, `[postgres]`; `-k postgres`
picks one). `store` speaks for replica r1; `other` is a second store object
for replica r2 on the same file or database, as a second replica would be.
What only PostgreSQL does (notices between replicas, its listener, its
migrations, its round trips) is in `test_store_postgres.py`.
"""

from __future__ import annotations

from dataclasses import replace

import anyio
import pytest

from server.errors import DuplicateIdempotencyKey, StorageError
from server.messages import AssistantMessage, ToolCall, ToolResultMessage, UserMessage
from server.store.base import (
    Claim,
    ConversationRecord,
    Holder,
    ReplicaRecord,
    StoredDefinition,
    StoredFile,
)
from tests.support import stores
from tests.support.stores import (
    DIGEST_A,
    DIGEST_B,
    StoreForTests,
    conversation,
    conversations,
    permission,
    turn,
)

pytestmark = pytest.mark.anyio

make_store, store, other = stores.make_store, stores.store, stores.other  # the fixtures: r1 and r2


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# conversations


async def test_conversation_round_trip_status_and_delete(store):
    record = ConversationRecord(
        id="c1", agent="helper@sha256:" + "a" * 64, agent_name="helper", digest=DIGEST_A, pinned=True,
        title="Ünïcode title", metadata={"team": "core", "tags": ["a", "b"], "n": 1.5, "nil": None},
        created_at=10.0, updated_at=10.0)
    await store.create_conversation(record)
    assert await store.get_conversation("c1") == record
    assert await store.get_conversation("missing") is None
    await store.set_conversation_status("c1", "busy", now=11.5)
    assert await store.get_conversation("c1") == replace(record, status="busy", updated_at=11.5)
    assert await store.delete_conversation("c1") is True
    assert await store.get_conversation("c1") is None
    assert await store.delete_conversation("c1") is False


async def test_conversations_page_newest_first_with_filters(store):
    specs = [(1.0, "helper", DIGEST_A, "idle"), (2.0, "helper", DIGEST_B, "busy"),
             (2.0, "other", DIGEST_A, "idle"), (3.0, "helper", DIGEST_A, "idle"),
             (4.0, "helper", DIGEST_A, "waiting")]
    for n, (at, agent_name, digest, status) in enumerate(specs):
        await store.create_conversation(conversation(f"c{n}", created_at=at, agent_name=agent_name,
                                                     digest=digest, status=status))

    async def ids(**filters):
        return [c.id for c in await store.list_conversations(**filters)]

    assert await ids() == ["c4", "c3", "c2", "c1", "c0"]  # c1 and c2 tie on time: the id decides
    assert await ids(limit=2) == ["c4", "c3"]
    assert await ids(limit=2, after="c3") == ["c2", "c1"]
    assert await ids(limit=2, after="c1") == ["c0"]
    assert await ids(agent="helper") == ["c4", "c3", "c1", "c0"]
    assert await ids(digest=DIGEST_B) == ["c1"]
    assert await ids(status="idle") == ["c3", "c2", "c0"]
    assert await ids(agent="helper", digest=DIGEST_A, status="idle", after="c3") == ["c0"]
    await store.delete_conversation("c2")  # a deleted cursor still places the page (ids sort by time)
    assert await ids(after="c2") == ["c1", "c0"]


async def test_deleting_a_conversation_takes_everything_of_it(store):
    await conversations(store, "c1")
    await store.admit("c1", "t1", "enqueue", 2.0, 100.0)
    await store.begin_turn(turn("t1"), ("turn.started", {}), 2.0)
    await store.append_messages("c1", "t1", [UserMessage(content="hi")], 2.0)
    await store.create_permission(permission("p1", "t1"))
    await store.admit("c1", "t2", "enqueue", 2.0, 100.0)
    assert await store.delete_conversation("c1")
    assert await store.get_turn("t1") is None
    assert await store.list_messages("c1") == [] and await store.list_events("c1") == []
    assert await store.list_permissions("c1") == []
    await conversations(store, "c1")  # the same id again: no holder, no queue, no numbers left over
    assert (await store.admit("c1", "t3", "reject", 3.0, 100.0)).fence == 1
    assert await store.append_event("c1", "e", {}, 3.0) == 1


# turns


async def test_turn_round_trip_update_and_listing(store):
    await conversations(store, "c1", "c2")
    for n, at in enumerate([1.0, 2.0, 2.0, 3.0]):
        await store.create_turn(turn(f"t{n}", started_at=at))
    await store.create_turn(turn("tx", "c2"))
    usage = {"input_tokens": 3, "output_tokens": 4}
    await store.update_turn("t1", status="completed", output="done", stop_reason="end", ended_at=5.0,
                            usage=usage)
    await store.update_turn("t2", status="failed", error={"code": "model_error", "message": "no"})
    await store.update_turn("t3")  # nothing to change
    assert await store.get_turn("t1") == replace(turn("t1", started_at=2.0), status="completed",
                                                 output="done", stop_reason="end", ended_at=5.0, usage=usage)
    assert (await store.get_turn("t2")).error == {"code": "model_error", "message": "no"}
    assert await store.get_turn("missing") is None
    with pytest.raises(ValueError, match="digest"):
        await store.update_turn("t1", digest=DIGEST_B)
    assert [t.id for t in await store.list_turns("c1")] == ["t0", "t1", "t2", "t3"]
    assert [t.id for t in await store.list_turns("c1", limit=2, after="t1")] == ["t2", "t3"]
    assert [t.id for t in await store.running_turns()] == ["t0", "tx", "t3"]  # by start, every conversation


async def test_idempotency_keys(store):
    await conversations(store, "c1", "c2")
    await store.create_turn(turn("t1", key="k", request_digest="rd", started_at=10.0))
    await store.create_turn(turn("t2", "c2", key="k"))  # a key is per conversation
    with pytest.raises(DuplicateIdempotencyKey):
        await store.create_turn(turn("t3", key="k"))
    with pytest.raises(DuplicateIdempotencyKey):
        await store.begin_turn(turn("t3", key="k"), ("turn.started", {}), 11.0)
    assert await store.list_events("c1") == []  # nothing of the refused turn was written
    assert (await store.get_conversation("c1")).status == "idle"
    with pytest.raises(Exception) as caught:  # the same turn id twice: the caller's bug, not the store's
        await store.create_turn(turn("t1"))
    assert not isinstance(caught.value, StorageError | DuplicateIdempotencyKey)
    assert (await store.find_turn_by_key("c1", "k", since=5.0)).request_digest == "rd"
    assert await store.find_turn_by_key("c1", "k", since=11.0) is None
    assert await store.find_turn_by_key("c1", "other", since=0.0) is None
    await store.update_turn("t1", idempotency_key=None)  # a key can be given up
    await store.create_turn(turn("t3", key="k"))


# transcript and events


async def test_messages_and_events_have_their_own_gapless_sequences(store):
    await conversations(store, "c1", "c2")
    history = [
        UserMessage(content="list files"),
        AssistantMessage(content="", tool_calls=(ToolCall(id="call_1", name="ls", arguments={"path": "/"}),)),
        ToolResultMessage(tool_call_id="call_1", name="ls", content="bin\nétc\x00", is_error=False),
    ]
    data = {"ü": [None, 1.5, {"deep": True}]}
    await store.append_messages("c1", "t1", history[:1], 2.0)
    await store.append_messages("c1", "t1", history[1:], 3.0)
    await store.append_messages("c1", "t1", [], 9.0)  # nothing: not even updated_at moves
    assert [await store.append_event("c1", "e", {"n": n, **data}, 4.0) for n in range(3)] == [1, 2, 3]
    assert await store.append_event("c2", "e", {}, 4.0) == 1
    messages = await store.list_messages("c1")
    assert [(m.seq, m.turn_id, m.message, m.created_at) for m in messages] == [
        (1, "t1", history[0], 2.0), (2, "t1", history[1], 3.0), (3, "t1", history[2], 3.0)]
    assert [m.seq for m in await store.list_messages("c1", after=1, limit=1)] == [2]
    assert (await store.get_conversation("c1")).updated_at == 3.0
    events = await store.list_events("c1", after=1)
    assert [(e.seq, e.name, e.data) for e in events] == [(2, "e", {"n": 1, **data}),
                                                         (3, "e", {"n": 2, **data})]
    assert [e.seq for e in await store.list_events("c1", limit=1)] == [1]


async def test_a_turns_batched_writes(store):
    await conversations(store, "c1")
    assert (await store.admit("c1", "t1", "enqueue", 1.0, 100.0)).fence == 1
    await store.admit("c1", "t2", "enqueue", 1.0, 100.0)
    assert await store.begin_turn(turn("t1"), ("turn.started", {"turn_id": "t1"}), 2.0) == 1
    assert (await store.get_turn("t1")).status == "running"
    assert (await store.get_conversation("c1")).status == "busy"
    step = [UserMessage(content="hi"), AssistantMessage(content="hello")]
    events = [("message.delta", {"d": "hel"}), ("message", {})]
    assert await store.append("c1", "t1", step, events, 3.0) == [2, 3]
    assert await store.append("c1", "t1", [], [("tool.started", {})], 4.0) == [4]
    assert await store.append("c1", "t1", step[:1], [], 5.0) == []
    assert await store.append("c1", "t1", [], [], 6.0) == []
    assert [m.seq for m in await store.list_messages("c1")] == [1, 2, 3]
    assert (await store.get_conversation("c1")).updated_at == 5.0
    with pytest.raises(ValueError):
        await store.end_turn("t1", "c1", {"digest": DIGEST_B}, ("turn.completed", {}), 7.0)
    changes = {"status": "completed", "output": "hello", "usage": {"input_tokens": 1}, "ended_at": 7.0}
    assert await store.end_turn("t1", "c1", changes, ("turn.completed", {"turn_id": "t1"}), 7.0) == 5
    assert await store.get_turn("t1") == replace(turn("t1"), status="completed", output="hello",
                                                 usage={"input_tokens": 1}, ended_at=7.0)
    assert [(e.seq, e.name) for e in await store.list_events("c1", after=3)] == [(4, "tool.started"),
                                                                                  (5, "turn.completed")]
    conv = await store.get_conversation("c1")
    assert (conv.status, conv.updated_at) == ("idle", 7.0)
    assert await store.holder("c1") is None  # released: the next one may claim
    assert await store.claim("c1", "t2", 8.0, 100.0) == Claim(fence=2)


async def test_concurrent_appends_from_several_stores_number_without_gaps(make_store, store):
    await conversations(store, "c1")
    stores = [make_store(f"w{n}") for n in range(3)]
    for s in stores:
        await s.open()
    seqs: list[int] = []

    async def writer(s: StoreForTests, n: int) -> None:
        for i in range(20):
            seqs.append(await s.append_event("c1", "e", {"w": n, "i": i}, 1.0))
            await s.append_messages("c1", "t", [UserMessage(content=f"{n}.{i}")] * 2, 1.0)
            seqs.extend(await s.append("c1", "t", [UserMessage(content=f"{n}.{i}")] * 2,
                                       [("a", {}), ("b", {})], 1.0))

    try:
        async with anyio.create_task_group() as tg:
            for n, s in enumerate([store, *stores]):
                tg.start_soon(writer, s, n)
    finally:
        for s in stores:
            await s.close()
    assert sorted(seqs) == list(range(1, 241))
    assert [e.seq for e in await store.list_events("c1")] == list(range(1, 241))
    messages = await store.list_messages("c1")
    assert [m.seq for m in messages] == list(range(1, 321))
    for first, second in zip(messages[::2], messages[1::2], strict=True):  # a batch stays together
        assert first.message == second.message


# definitions, swaps, aliases, permissions, replicas, files


async def test_definitions_are_stored_once_by_digest(store):
    a1 = StoredDefinition(kind="agent", name="helper", digest=DIGEST_A, spec={"model": "m", "x": [1]},
                          first_seen=1.0)
    a2 = StoredDefinition(kind="agent", name="helper", digest=DIGEST_B, spec={"model": "n"}, first_seen=2.0)
    await store.save_definitions([a1])
    await store.save_definitions([replace(a1, first_seen=9.0), a2, a2])
    await store.save_definitions([])
    assert await store.get_definition(DIGEST_A) == a1
    assert await store.get_definition("sha256:none") is None
    assert await store.find_definitions("agent", "helper") == [a1, a2]
    assert await store.find_definitions("tool", "helper") == []


async def test_swaps_and_aliases(store):
    for n in range(3):
        report = {"id": f"swap_{n}", "status": "applied", "n": n}
        await store.record_swap(f"swap_{n}", float(n), "applied", report)
    assert [s["n"] for s in await store.list_swaps()] == [2, 1, 0]
    assert [s["id"] for s in await store.list_swaps(limit=1, after="swap_2")] == ["swap_1"]
    assert await store.get_swap("swap_1") == {"id": "swap_1", "status": "applied", "n": 1}
    assert await store.get_swap("missing") is None
    await store.set_alias("helper", "stable", DIGEST_A, 1.0)
    await store.set_alias("helper", "canary", DIGEST_B, 2.0)
    await store.set_alias("helper", "stable", DIGEST_B, 3.0)
    assert await store.get_alias("helper", "stable") == DIGEST_B
    assert await store.get_alias("other", "stable") is None
    assert await store.list_aliases("helper") == [{"alias": "canary", "digest": DIGEST_B, "updated_at": 2.0},
                                                  {"alias": "stable", "digest": DIGEST_B, "updated_at": 3.0}]
    assert await store.delete_alias("helper", "canary") is True
    assert await store.delete_alias("helper", "canary") is False


async def test_permissions_are_decided_once(store):
    await conversations(store, "c1")
    await store.create_permission(permission("p1", "t1"))
    await store.create_permission(replace(permission("p2", "t1"), requested_at=2.0))
    assert await store.get_permission("p1") == permission("p1", "t1")
    assert await store.decide_permission("p1", "allowed", "alice", 5.0) is True
    assert await store.decide_permission("p1", "denied", "bob", 6.0) is False
    assert await store.decide_permission("missing", "denied", "bob", 6.0) is False
    assert await store.get_permission("p1") == replace(permission("p1", "t1"), status="allowed",
                                                       decided_by="alice", decided_at=5.0)
    assert [p.id for p in await store.list_permissions("c1")] == ["p1", "p2"]
    assert await store.get_permission("missing") is None


async def test_replicas_and_files(store):
    def beat(id: str, at: float, digest: str, running: int) -> ReplicaRecord:
        return ReplicaRecord(id=id, started_at=1.0, heartbeat_at=at, set_digest=digest, running_turns=running)

    await store.heartbeat(beat("r2", 5.0, DIGEST_A, 0))
    await store.heartbeat(beat("r1", 2.0, DIGEST_A, 1))
    await store.heartbeat(beat("r1", 6.0, DIGEST_B, 3))
    # running_turns: the turns a replica holds now, whatever its last heartbeat said (a compaction's
    # hold is no turn)
    await conversations(store, "c1", "c2", "c3")
    await store.admit("c1", "turn_1", "reject", 1.0, 100.0)
    await store.admit("c2", "turn_2", "reject", 1.0, 100.0)
    await store.admit("c3", "compact_3", "reject", 1.0, 100.0)
    assert await store.list_replicas(since=5.0) == [beat("r1", 6.0, DIGEST_B, 2),
                                                    beat("r2", 5.0, DIGEST_A, 0)]
    await store.release("c2", "turn_2")
    assert [r.running_turns for r in await store.list_replicas(since=5.0)] == [1, 0]
    await store.remove_replica("r2")
    assert [r.id for r in await store.list_replicas(since=0.0)] == ["r1"]
    script = StoredFile(digest="sha256:f1", data=b"#!/bin/sh\n\x00\xff", mode=0o755)
    await store.save_files([script, StoredFile(digest="sha256:f2", data=b"", mode=0o644)])
    await store.save_files([replace(script, data=b"changed", mode=0o600)])  # known digests are skipped
    await store.save_files([])
    assert await store.get_file("sha256:f1") == script
    assert (await store.get_file("sha256:f2")).data == b""
    assert await store.get_file("missing") is None
    await store.probe()


# who runs a conversation's turn


async def test_reject_names_the_holder_or_the_first_queued_turn(store):
    await conversations(store, "c1")
    assert await store.holder("c1") is None
    assert (await store.admit("c1", "t0", "reject", 1.0, 100.0)).fence == 1  # first, and free: held at once
    assert await store.holder("c1") == Holder(turn_id="t0", replica="r1", fence=1, lease_until=100.0)
    assert (await store.admit("c1", "t1", "reject", 1.0, 100.0)).busy == "t0"
    assert (await store.admit("c1", "t1", "enqueue", 1.0, 100.0)).fence is None
    await store.release("c1", "t0")
    assert await store.holder("c1") is None
    assert (await store.admit("c1", "t2", "reject", 1.0, 100.0)).busy == "t1"  # queued, not yet holding
    assert await store.claim("c1", "t1", 1.0, 50.0) == Claim(fence=2)  # the fence only grows
    assert (await store.admit("c1", "t2", "reject", 1.0, 100.0)).busy == "t1"
    await store.release("c1", "t1")
    assert (await store.admit("c1", "t3", "reject", 2.0, 100.0)).fence == 3


async def test_enqueue_claims_in_arrival_order_across_replicas(store, other):
    await conversations(store, "c1")
    assert (await store.admit("c1", "t1", "enqueue", 1.0, 100.0)).fence == 1
    assert (await other.admit("c1", "t2", "enqueue", 1.0, 100.0)).fence is None
    assert (await store.admit("c1", "t3", "enqueue", 1.0, 100.0)).fence is None
    assert await other.claim("c1", "t2", 1.0, 100.0) == Claim()  # t1 holds it
    await store.release("c1", "t1")
    assert await store.claim("c1", "t3", 1.0, 100.0) == Claim()  # t2 came first
    assert await other.claim("c1", "t2", 1.0, 100.0) == Claim(fence=2)
    assert (await store.holder("c1")).replica == "r2"
    assert await store.claim("c1", "t3", 1.0, 100.0) == Claim()
    await other.release("c1", "t2")
    assert await store.claim("c1", "t3", 1.0, 100.0) == Claim(fence=3)


async def test_interrupt_cancels_the_holder_and_supersedes_the_queue(store, other):
    await conversations(store, "c1")
    await store.admit("c1", "t1", "enqueue", 1.0, 100.0)
    await other.admit("c1", "t2", "enqueue", 1.0, 100.0)
    admitted = await other.admit("c1", "t3", "interrupt", 1.0, 100.0)
    assert admitted.cancel == Holder(turn_id="t1", replica="r1", fence=1, lease_until=100.0)
    assert (admitted.busy, admitted.joined, admitted.fence) == (None, None, None)
    assert await other.claim("c1", "t2", 1.0, 100.0) == Claim(superseded=True)
    assert await other.claim("c1", "t2", 1.0, 100.0) == Claim(superseded=True)  # its entry is gone
    assert await other.claim("c1", "t3", 1.0, 100.0) == Claim()  # t1 holds it until it releases
    await store.release("c1", "t1")
    assert await other.claim("c1", "t3", 1.0, 100.0) == Claim(fence=2)
    assert (await store.admit("c1", "t4", "interrupt", 1.0, 100.0)).cancel.turn_id == "t3"


async def test_an_idempotency_key_joins_its_turn_queued_or_stored(store):
    await conversations(store, "c1")
    await store.admit("c1", "t1", "enqueue", 1.0, 100.0, key="k1", request_digest="rd1")
    await store.admit("c1", "t2", "enqueue", 1.0, 100.0, key="k2", request_digest="rd2")
    # the key wins over `busy`, and nothing is queued
    joined = await store.admit("c1", "t3", "reject", 1.0, 100.0, key="k2", request_digest="other")
    assert (joined.joined, joined.joined_request, joined.busy, joined.fence) == ("t2", "rd2", None, None)
    assert await store.claim("c1", "t3", 1.0, 100.0) == Claim(superseded=True)  # it was never queued
    await store.begin_turn(turn("t1", key="k1", request_digest="rd1"), ("turn.started", {}), 2.0)
    await store.end_turn("t1", "c1", {"status": "completed"}, ("turn.completed", {}), 3.0)
    joined = await store.admit("c1", "t4", "interrupt", 4.0, 100.0, key="k1")  # a stored turn's key
    assert (joined.joined, joined.joined_request, joined.cancel) == ("t1", "rd1", None)
    assert (await store.admit("c1", "t5", "reject", 4.0, 100.0, key="k3")).busy == "t2"


async def test_two_replicas_racing_for_one_conversation_get_one_holder(store, other):
    for round in range(15):
        cid = f"c{round}"
        await store.create_conversation(conversation(cid))
        policy = ("reject", "enqueue", "interrupt")[round % 3]
        fences: dict[str, int | None] = {}

        async def enter(s: StoreForTests, turn_id: str, cid: str = cid, policy: str = policy,
                        fences: dict[str, int | None] = fences) -> None:
            admitted = await s.admit(cid, turn_id, policy, 1.0, 100.0)
            fences[turn_id] = admitted.fence
            if admitted.busy is None and admitted.fence is None:
                fences[turn_id] = (await s.claim(cid, turn_id, 1.0, 100.0)).fence

        async with anyio.create_task_group() as tg:
            for n, s in enumerate((store, other, store, other)):
                tg.start_soon(enter, s, f"{cid}-t{n}")
        winners = [t for t, fence in fences.items() if fence is not None]
        assert len(winners) == 1, fences
        assert await store.holder(cid) == Holder(turn_id=winners[0], replica="r1" if winners[0][-1] in "02"
                                                 else "r2", fence=1, lease_until=100.0)


async def test_renewed_leases_survive_recovery(store, other):
    await conversations(store, "c1")
    await other.admit("c1", "t1", "enqueue", 1.0, 10.0)
    await other.admit("c1", "t2", "enqueue", 1.0, 10.0)
    await other.create_turn(turn("t1"))
    await other.renew_leases(500.0)
    assert (await store.holder("c1")).lease_until == 500.0
    assert await store.recover_lapsed(100.0) == []
    await other.release("c1", "t1")
    assert await other.claim("c1", "t2", 100.0, 500.0) == Claim(fence=2)  # its entry was kept too


async def test_recovery_ends_the_turns_of_a_lapsed_replica(store, other):
    await conversations(store, "c1", "c2", "c3")
    for cid, tid, lease in (("c1", "t1", 50.0), ("c2", "t2", 1000.0)):
        assert (await other.admit(cid, tid, "enqueue", 1.0, lease)).fence == 1
        await other.begin_turn(turn(tid, cid), ("turn.started", {"turn_id": tid}), 1.0)
    await other.create_permission(permission("p1", "t1"))
    await other.admit("c1", "t1b", "enqueue", 1.0, 50.0)  # queued behind t1, its lease lapses too
    await other.create_turn(turn("t3", "c3", status="waiting", started_at=2.0))  # held by nobody

    recovered = await store.recover_lapsed(100.0)
    assert [(r.turn.id, r.turn.status, r.turn.error["code"], r.turn.ended_at, r.seq) for r in recovered] == [
        ("t1", "failed", "interrupted", 100.0, 2), ("t3", "failed", "interrupted", 100.0, 1)]
    (failed,) = await store.list_events("c1", after=1)
    assert (failed.seq, failed.name, failed.data["turn_id"], failed.data["error"]["code"]) == (
        2, "turn.failed", "t1", "interrupted")
    assert (await store.get_turn("t1")).status == "failed"
    assert (await store.get_permission("p1")).status == "cancelled"
    assert await store.holder("c1") is None
    assert (await store.get_conversation("c1")).status == "idle"
    assert await other.claim("c1", "t1b", 100.0, 200.0) == Claim(superseded=True)  # lapsed entry: gone
    # the live lease is untouched
    assert (await store.holder("c2")).turn_id == "t2"
    assert (await store.get_turn("t2")).status == "running"
    assert (await store.get_conversation("c2")).status == "busy"
    assert await store.recover_lapsed(100.0) == []


async def test_recovery_at_start_takes_this_replicas_own_holders(store, other):
    await conversations(store, "c1", "c2")
    for s, cid, tid in ((store, "c1", "t1"), (other, "c2", "t2")):
        await s.admit(cid, tid, "enqueue", 1.0, 1000.0)
        await s.create_turn(turn(tid, cid))
    assert await store.recover_lapsed(100.0) == []  # never its own while it runs, nor a live lease
    recovered = [r.turn.id for r in await store.recover_lapsed(100.0, starting=True)]
    # an embedded store is the only process: at start every holder has lapsed, whatever its lease
    assert recovered == (["t1", "t2"] if store.embedded else ["t1"])
    assert await store.holder("c1") is None
    assert (await store.holder("c2") is None) == store.embedded
