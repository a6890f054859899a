"""Durable turns, on both stores: a lapsed holder's turn taken over, fencing, hand-over.

The same fixtures as `test_store_contract.py` (`store` speaks for r1, `other`
for r2, on one SQLite file or one PostgreSQL database). A turn whose
replica's lease lapsed runs again on the replica that recovers it, below
`max_attempts`; the replica it left, if it still runs (paused, cut off),
finds every fenced write refused with `LeaseLost`, having written nothing.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from server.errors import LeaseLost
from server.messages import UserMessage
from server.store.base import Claim, Holder, Recovered, Store
from tests.support import stores
from tests.support.stores import conversations, permission, turn

pytestmark = pytest.mark.anyio

make_store, store, other = stores.make_store, stores.store, stores.other  # the fixtures: r1 and r2


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _running_on(s: Store, cid: str, tid: str, lease: float) -> None:
    """`tid` holds `cid` on `s`'s replica (fence 1), started, one step appended (events 1 and 2)."""
    assert (await s.admit(cid, tid, "enqueue", 1.0, lease)).fence == 1
    assert await s.begin_turn(turn(tid, cid), ("turn.started", {"turn_id": tid}), 1.0) == 1
    assert await s.append(cid, tid, [UserMessage(content="hi")], [("step", {})], 2.0, fence=1) == [2]


async def _everything(s: Store, cid: str, tid: str) -> tuple:
    """What a refused write must leave as it was."""
    return (await s.list_events(cid), await s.list_messages(cid), await s.get_turn(tid),
            await s.get_conversation(cid), await s.holder(cid), await s.list_permissions(cid))


async def test_a_lapsed_holders_turn_is_taken_over_below_max_attempts(make_store, store, other):
    await conversations(store, "c1")
    await _running_on(other, "c1", "t1", 50.0)
    await other.create_permission(permission("p1", "t1"))
    await other.admit("c1", "t2", "enqueue", 1.0, 1000.0)  # queued behind it, live

    (recovered,) = await store.recover_lapsed(100.0, lease_until=500.0, max_attempts=3)
    assert recovered == Recovered(turn=replace(turn("t1"), attempts=2), seq=3, resumed=True, fence=2)
    (resumed,) = await store.list_events("c1", after=2)
    assert (resumed.seq, resumed.name, resumed.data) == (3, "turn.resumed", {"turn_id": "t1", "attempt": 2})
    assert await store.get_turn("t1") == replace(turn("t1"), attempts=2)  # still running
    assert (await store.get_conversation("c1")).status == "busy"  # untouched
    assert (await store.get_permission("p1")).status == "pending"  # the run goes on: its question too
    assert await store.holder("c1") == Holder(turn_id="t1", replica="r1", fence=2, lease_until=500.0)
    assert await store.recover_lapsed(100.0, lease_until=500.0, max_attempts=3) == []  # ours now

    # its queue entry stayed, and is r1's now: another replica's recovery leaves it alone
    third = make_store("r3")
    await third.open()
    try:
        assert await third.recover_lapsed(200.0, lease_until=900.0, max_attempts=3) == []
    finally:
        await third.close()
    assert await store.claim("c1", "t1", 200.0, 500.0) == Claim()  # queued (and holding), not gone

    # the new holder writes under its fence, and ends the turn
    assert await store.append("c1", "t1", [UserMessage(content="again")], [("step", {})], 101.0,
                              fence=2) == [4]
    await store.update_turn("t1", fence=2, status="waiting")
    await store.renew_leases(600.0)
    assert (await store.holder("c1")).lease_until == 600.0
    changes = {"status": "completed", "output": "done", "ended_at": 102.0}
    assert await store.end_turn("t1", "c1", changes, ("turn.completed", {}), 102.0, fence=2) == 5
    assert await store.get_turn("t1") == replace(turn("t1"), attempts=2, status="completed", output="done",
                                                 ended_at=102.0)
    assert await store.holder("c1") is None
    assert await other.claim("c1", "t2", 103.0, 1000.0) == Claim(fence=3)


async def test_out_of_attempts_a_turn_fails_as_before(store, other):
    await conversations(store, "c1", "c2")
    await _running_on(other, "c1", "t1", 50.0)
    await other.create_permission(permission("p1", "t1"))
    await other.create_turn(turn("t3", "c2", status="waiting", started_at=2.0))  # holds nothing
    # below max_attempts (2), once: taken over by r1 (the orphan fails whatever max_attempts says)
    recovered = await store.recover_lapsed(100.0, lease_until=150.0, max_attempts=2)
    assert [(r.turn.id, r.resumed, r.fence, r.turn.attempts, r.turn.status, r.seq) for r in recovered] == [
        ("t1", True, 2, 2, "running", 3), ("t3", False, 0, 1, "failed", 1)]
    assert (await store.get_conversation("c2")).status == "idle"
    # r1 lapses in turn: the second attempt was the last
    (failed,) = await other.recover_lapsed(200.0, lease_until=300.0, max_attempts=2)
    assert (failed.resumed, failed.fence, failed.seq) == (False, 0, 4)
    assert failed.turn == replace(turn("t1"), attempts=2, status="failed", error=failed.turn.error,
                                  ended_at=200.0)
    assert failed.turn.error["code"] == "interrupted"
    (event,) = await other.list_events("c1", after=3)
    assert (event.name, event.data["turn_id"], event.data["error"]["code"]) == (
        "turn.failed", "t1", "interrupted")
    assert await other.get_turn("t1") == failed.turn
    assert (await other.get_permission("p1")).status == "cancelled"
    assert await other.holder("c1") is None
    assert (await other.get_conversation("c1")).status == "idle"
    # max_attempts 0 (the default): nothing is ever taken over
    await conversations(store, "c3")
    await _running_on(other, "c3", "t4", 50.0)
    (failed,) = await store.recover_lapsed(100.0)
    assert (failed.turn.id, failed.resumed, failed.turn.status) == ("t4", False, "failed")


async def test_the_replica_that_lost_its_lease_writes_nothing_more(store, other):
    await conversations(store, "c1")
    await _running_on(other, "c1", "t1", 50.0)
    (recovered,) = await store.recover_lapsed(100.0, lease_until=500.0, max_attempts=3)
    assert recovered.fence == 2
    before = await _everything(store, "c1", "t1")
    stale = [  # r2 still runs t1 under fence 1; r1 under the right fence, from r2; the wrong fence on r1
        (other, 1), (other, 2), (store, 1), (store, 3)]
    for s, fence in stale:
        with pytest.raises(LeaseLost):
            await s.append("c1", "t1", [UserMessage(content="late")], [("step", {})], 101.0, fence=fence)
        with pytest.raises(LeaseLost):
            await s.append("c1", "t1", [], [("step", {})], 101.0, fence=fence)
        with pytest.raises(LeaseLost):
            await s.append("c1", "t1", [UserMessage(content="late")], [], 101.0, fence=fence)
        with pytest.raises(LeaseLost):
            await s.update_turn("t1", fence=fence, status="waiting", output="late")
        with pytest.raises(LeaseLost):
            await s.end_turn("t1", "c1", {"status": "completed", "ended_at": 101.0}, ("turn.completed", {}),
                             101.0, fence=fence)
        with pytest.raises(LeaseLost):
            await s.release("c1", "t1", fence=fence)
        assert await _everything(store, "c1", "t1") == before, (s.replica, fence)
    assert await store.claim("c1", "t1", 101.0, 500.0) == Claim()  # its queue entry is still there
    with pytest.raises(LeaseLost):  # a conversation that does not exist holds nothing either
        await other.append("missing", "t1", [], [("step", {})], 101.0, fence=1)
    # the holder's own, with its fence: the writes go through
    assert await store.append("c1", "t1", [UserMessage(content="mine")], [("step", {})], 102.0,
                              fence=2) == [4]
    await store.update_turn("t1", fence=2, output="partial")
    await store.release("c1", "t1", fence=2)
    assert await store.holder("c1") is None
    assert await store.claim("c1", "t1", 103.0, 500.0) == Claim(superseded=True)  # released: entry gone
    with pytest.raises(LeaseLost):  # released: no fence holds any more
        await store.update_turn("t1", fence=2, output="after")
    assert (await store.get_turn("t1")).output == "partial"


async def test_hand_over_lets_another_replica_take_the_turn_at_once(store, other):
    await conversations(store, "c1")
    await _running_on(store, "c1", "t1", 1e9)
    for s, fence in ((store, 2), (other, 1)):  # a wrong fence, another replica's call: nothing happens
        await s.hand_over("c1", "t1", fence)
    assert (await store.holder("c1")).lease_until == 1e9
    assert await other.recover_lapsed(100.0, lease_until=500.0, max_attempts=3) == []
    await store.hand_over("c1", "t1", 1)
    assert await store.holder("c1") == Holder(turn_id="t1", replica="r1", fence=1, lease_until=0.0)
    assert await store.recover_lapsed(100.0, lease_until=500.0, max_attempts=3) == []  # not its own
    (recovered,) = await other.recover_lapsed(100.0, lease_until=500.0, max_attempts=3)
    assert (recovered.turn.id, recovered.resumed, recovered.fence, recovered.seq) == ("t1", True, 2, 3)
    assert await other.holder("c1") == Holder(turn_id="t1", replica="r2", fence=2, lease_until=500.0)
    with pytest.raises(LeaseLost):  # the replica that handed it over is done with it
        await store.append("c1", "t1", [], [("step", {})], 101.0, fence=1)
    await store.hand_over("c1", "t1", 1)  # too late: the lease is r2's
    assert (await other.holder("c1")).lease_until == 500.0


async def test_at_start_a_replica_takes_over_its_own_holders(store, other):
    await conversations(store, "c1", "c2")
    await _running_on(store, "c1", "t1", 1e9)
    await _running_on(other, "c2", "t2", 1e9)
    recovered = await store.recover_lapsed(100.0, starting=True, lease_until=500.0, max_attempts=3)
    # an embedded store is the only process: at start every holder has lapsed, whatever its lease
    taken = ["t1", "t2"] if store.embedded else ["t1"]
    assert [(r.turn.id, r.resumed, r.fence, r.seq, r.turn.attempts) for r in recovered] == [
        (tid, True, 2, 3, 2) for tid in taken]
    for cid, tid in (("c1", "t1"), ("c2", "t2")):
        mine = tid in taken
        assert await store.holder(cid) == Holder(turn_id=tid, replica="r1" if mine else "r2",
                                                 fence=2 if mine else 1, lease_until=500.0 if mine else 1e9)
        assert (await store.get_conversation(cid)).status == "busy"
        assert await store.claim(cid, tid, 100.0, 500.0) == Claim()  # its queue entry is kept
        assert [e.name for e in await store.list_events(cid, after=2)] == (["turn.resumed"] if mine else [])
