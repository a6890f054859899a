"""What only the PostgreSQL store does: notices between replicas, its listener, migrations, round trips.

Everything both stores do is in `test_store_contract.py`; this is the rest,
on a real PostgreSQL (`postgres_url`: a fresh database per test).
"""

from __future__ import annotations

import anyio
import asyncpg
import pytest

from server.errors import LeaseLost, StorageError
from server.messages import UserMessage
from server.store.postgres import PostgresStore
from server.store.postgres.migrations import LOCK_KEY, MIGRATIONS
from tests.support.stores import Inbox, conversations, turn

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def pair(postgres_url):
    """Two replicas, ra and rb, on one database."""
    a, b = PostgresStore(postgres_url, replica="ra"), PostgresStore(postgres_url, replica="rb")
    await a.open()
    await b.open()
    yield a, b
    await a.close()
    await b.close()


async def test_notices_reach_the_other_replicas_only(pair):
    a, b = pair
    mine, theirs = Inbox(), Inbox()
    a.subscribe(mine)
    b.subscribe(theirs)
    await conversations(a, "c1")
    seq = await a.append_event("c1", "turn.started", {"big": "x" * 20_000}, 1.0)  # only ids travel
    assert await theirs.wait_for(t="event") == {"t": "event", "r": "ra", "c": "c1", "s": seq,
                                                "n": "turn.started"}
    await a.set_conversation_status("c1", "busy", 2.0)
    assert await theirs.wait_for(t="status") == {"t": "status", "r": "ra", "c": "c1", "st": "busy"}
    await a.record_swap("swap_1", 1.0, "applied", {"id": "swap_1"})
    assert await theirs.wait_for(t="swap") == {"t": "swap", "r": "ra", "id": "swap_1"}
    await a.admit("c1", "t1", "enqueue", 1.0, 100.0)
    await a.admit("c1", "t2", "enqueue", 1.0, 100.0)
    assert not [n for n in theirs.notices if n["t"] == "queue"]  # joining a queue moves nobody
    await a.admit("c1", "t3", "interrupt", 1.0, 100.0)  # t2 is superseded: its waiter must look
    await theirs.wait_for(t="queue", c="c1")
    await a.notify({"t": "cancel", "turn": "t1", "to": "rb"})
    assert await theirs.wait_for(t="cancel") == {"t": "cancel", "turn": "t1", "to": "rb", "r": "ra"}
    await b.notify({"t": "ping"})  # delivered after everything a sent: a heard none of its own
    await mine.wait_for(t="ping")
    assert [n["t"] for n in mine.notices] == ["ping"]
    with pytest.raises(ValueError):
        await a.notify({"t": "too big", "x": "x" * 9000})


async def test_a_turns_writes_send_what_their_single_forms_send(pair):
    a, b = pair
    inbox = Inbox()
    b.subscribe(inbox)
    await conversations(a, "c1")
    await a.admit("c1", "t1", "enqueue", 1.0, 100.0)
    seq = await a.begin_turn(turn("t1"), ("turn.started", {}), 1.0)
    await inbox.wait_for(t="status", c="c1", st="busy")
    await inbox.wait_for(t="event", c="c1", s=seq, n="turn.started")
    inbox.notices.clear()
    seqs = await a.append("c1", "t1", [UserMessage(content="x")], [("a", {}), ("b", {})], 2.0)
    # a batch sends one notice, for its last event: readers replay whatever they have not seen
    await inbox.wait_for(t="event", s=seqs[1], n="b")
    await a.append("c1", "t1", [], [("c", {})], 2.5)  # a later notice: nothing more came for the batch
    await inbox.wait_for(t="event", n="c")
    assert [n for n in inbox.notices if n.get("t") == "event"] == [
        {"t": "event", "r": "ra", "c": "c1", "s": seqs[1], "n": "b"},
        {"t": "event", "r": "ra", "c": "c1", "s": seqs[1] + 1, "n": "c"}]
    inbox.notices.clear()
    seq = await a.end_turn("t1", "c1", {"status": "completed"}, ("turn.completed", {}), 3.0)
    await inbox.wait_for(t="event", c="c1", s=seq, n="turn.completed")
    await inbox.wait_for(t="status", c="c1", st="idle")
    await inbox.wait_for(t="queue", c="c1")


async def test_release_and_recovery_send_their_notices(pair):
    a, b = pair
    inbox = Inbox()
    b.subscribe(inbox)
    await conversations(a, "c1", "c2")
    await a.admit("c1", "t1", "enqueue", 1.0, 100.0)
    await a.release("c1", "t1")
    await inbox.wait_for(t="queue", c="c1")
    inbox.notices.clear()
    await b.admit("c2", "t2", "enqueue", 1.0, 10.0)
    await b.create_turn(turn("t2", "c2"))
    (recovered,) = await a.recover_lapsed(50.0)
    assert await inbox.wait_for(t="event") == {"t": "event", "r": "ra", "c": "c2", "s": recovered.seq,
                                               "n": "turn.failed"}
    await inbox.wait_for(t="status", c="c2", st="idle")
    await inbox.wait_for(t="queue", c="c2")


async def test_hand_over_and_take_over_send_their_notices(pair):
    a, b = pair
    inbox = Inbox()
    b.subscribe(inbox)
    await conversations(a, "c1")
    await a.admit("c1", "t1", "enqueue", 1.0, 1e9)
    await a.begin_turn(turn("t1"), ("turn.started", {}), 1.0)
    await a.hand_over("c1", "t1", 2)  # a wrong fence: no lapse, no notice
    await a.hand_over("c1", "t1", 1)
    assert await inbox.wait_for(t="handoff") == {"t": "handoff", "r": "ra", "c": "c1"}
    assert [n["t"] for n in inbox.notices].count("handoff") == 1
    mine = Inbox()
    a.subscribe(mine)
    (recovered,) = await b.recover_lapsed(2.0, lease_until=100.0, max_attempts=2)
    assert recovered.resumed
    assert await mine.wait_for(t="event") == {"t": "event", "r": "rb", "c": "c1", "s": recovered.seq,
                                              "n": "turn.resumed"}
    await b.notify({"t": "after"})  # delivered after everything b sent before it
    await mine.wait_for(t="after")
    assert [n["t"] for n in mine.notices] == ["event", "after"]  # the conversation stays busy, held


async def test_a_stale_holders_writes_racing_a_take_over_all_land_before_it(pair):
    """The old holder appends as fast as it can while the other replica takes the turn over: every
    append committed before the take-over (numbered below its `turn.resumed`) or raised `LeaseLost`."""
    a, b = pair
    await conversations(a, "c1")
    await a.admit("c1", "t1", "enqueue", 1.0, 10.0)
    await a.begin_turn(turn("t1"), ("turn.started", {}), 1.0)
    landed: list[int] = []
    lost = anyio.Event()

    async def stale() -> None:
        while True:
            try:
                landed.extend(await a.append("c1", "t1", [UserMessage(content="x")], [("step", {})], 2.0,
                                             fence=1))
            except LeaseLost:
                lost.set()
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(stale)
        while len(landed) < 5:
            await anyio.sleep(0.001)
        (recovered,) = await b.recover_lapsed(50.0, lease_until=100.0, max_attempts=2)
    assert lost.is_set() and landed and max(landed) < recovered.seq
    events = await b.list_events("c1")
    assert [e.seq for e in events] == list(range(1, recovered.seq + 1))  # nothing of a's after it
    assert len(await b.list_messages("c1")) == len(landed)


async def test_the_listener_comes_back_and_says_resync(pair, postgres_url):
    a, b = pair
    inbox = Inbox()
    b.subscribe(inbox)
    connection = await asyncpg.connect(postgres_url)
    try:
        assert await connection.fetchval("SELECT pg_terminate_backend($1)", b.listener_pid)
    finally:
        await connection.close()
    await inbox.wait_for(t="resync")
    await a.notify({"t": "after"})
    await inbox.wait_for(t="after")
    assert [n["t"] for n in inbox.notices].count("resync") == 1


async def _cut_the_pool(admin: asyncpg.Connection, database: str, store: PostgresStore) -> None:
    """The server ends the store's pooled connections (not its listener: another test's subject)."""
    await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE datname = $1 AND pid <> pg_backend_pid() AND pid <> $2",
                        database, store.listener_pid)


async def test_a_failure_is_a_storage_error_naming_no_url(postgres_url):
    s = PostgresStore(postgres_url, replica="r1")
    failures: list[BaseException] = []
    await s.open()
    s.on_failure = failures.append
    database = postgres_url.rsplit("/", 1)[-1]
    admin = await asyncpg.connect(postgres_url.rsplit("/", 1)[0] + "/postgres")
    try:
        await admin.execute(f"ALTER DATABASE {database} SET default_transaction_read_only = on")
        await _cut_the_pool(admin, database, s)  # the pool's next connections are read-only
        with pytest.raises(StorageError) as caught:
            await s.probe()
        assert failures
        assert "127.0.0.1" not in caught.value.message and database not in caught.value.message
        await admin.execute(f"ALTER DATABASE {database} RESET default_transaction_read_only")
        await _cut_the_pool(admin, database, s)
        with anyio.fail_after(10):  # the pool replaces what it lost: the store writes again
            while True:
                try:
                    await s.probe()
                    break
                except StorageError:
                    await anyio.sleep(0.05)
    finally:
        await admin.close()
        await s.close()


async def test_migrations_race_and_refuse_a_newer_schema(postgres_url):
    stores = [PostgresStore(postgres_url, replica=f"r{n}") for n in range(4)]
    async with anyio.create_task_group() as tg:  # replicas starting at once on a new database
        for s in stores:
            tg.start_soon(s.open)
    for s in stores:
        await s.close()
    connection = await asyncpg.connect(postgres_url)
    try:
        versions = await connection.fetch("SELECT version FROM schema_version ORDER BY version")
        assert [v[0] for v in versions] == list(range(1, len(MIGRATIONS) + 1))
        await connection.execute("INSERT INTO schema_version (version) VALUES ($1)", len(MIGRATIONS) + 1)
    finally:
        await connection.close()
    newer = PostgresStore(postgres_url, replica="r9")
    expected = f"version {len(MIGRATIONS) + 1}, newer than this server's {len(MIGRATIONS)}"
    with pytest.raises(RuntimeError, match=expected):
        await newer.open()


async def test_turns_of_the_first_schema_have_run_once(postgres_url):
    connection = await asyncpg.connect(postgres_url)
    try:  # a database the first release created, with a turn in it
        async with connection.transaction():
            await connection.execute("SELECT pg_advisory_xact_lock($1)", LOCK_KEY)
            await connection.execute("CREATE TABLE schema_version (version integer PRIMARY KEY,"
                                     " applied_at timestamptz NOT NULL DEFAULT now())")
            for statement in MIGRATIONS[0]:
                await connection.execute(statement)
            await connection.execute("INSERT INTO schema_version (version) VALUES (1)")
            await connection.execute(
                "INSERT INTO conversations (id, agent, agent_name, digest, pinned, metadata, status,"
                " created_at, updated_at) VALUES ('c1', 'helper', 'helper', 'd', false, '{}', 'busy', 1, 1)")
            await connection.execute(
                "INSERT INTO turns (id, conversation_id, agent, digest, status, input, usage, started_at)"
                " VALUES ('t1', 'c1', 'helper', 'd', 'running', 'hello', '{}', 1)")
    finally:
        await connection.close()
    s = PostgresStore(postgres_url, replica="r1")
    await s.open()
    try:
        assert (await s.get_turn("t1")).attempts == 1
    finally:
        await s.close()


async def test_fenced_writes_take_one_round_trip(postgres_url):
    """A fenced write checks its fence in the statement that writes: (statements, transactions) per call."""
    s = PostgresStore(postgres_url, replica="r1")
    await s.open()
    counts: dict[str, tuple[int, int]] = {}

    async def count(name: str, call) -> None:
        before = (s.stats.statements, s.stats.transactions)
        try:
            await call
        except LeaseLost:
            name += " (lost)"
        counts[name] = (s.stats.statements - before[0], s.stats.transactions - before[1])

    try:
        await conversations(s, "c1")
        await s.admit("c1", "t1", "enqueue", 1.0, 100.0)
        await s.begin_turn(turn("t1"), ("turn.started", {}), 1.0)
        await count("append", s.append("c1", "t1", [UserMessage(content="x")], [("a", {})] * 2, 1.0, fence=1))
        await count("update_turn", s.update_turn("t1", fence=1, status="waiting"))
        await count("hand_over", s.hand_over("c1", "t1", 1))
        await count("release", s.release("c1", "t1", fence=1))
        await count("append", s.append("c1", "t1", [], [("a", {})], 1.0, fence=1))  # released: lost
        await count("update_turn", s.update_turn("t1", fence=1, status="running"))
        await count("end_turn", s.end_turn("t1", "c1", {"status": "completed"}, ("done", {}), 2.0, fence=1))
        await count("release", s.release("c1", "t1", fence=1))
        assert (await s.admit("c1", "t2", "enqueue", 2.0, 100.0)).fence == 2
        await s.create_turn(turn("t2"))
        await count("end_turn", s.end_turn("t2", "c1", {"status": "completed"}, ("done", {}), 2.0, fence=2))
    finally:
        await s.close()
    one = (1, 1)
    assert counts == {"append": one, "update_turn": one, "hand_over": one, "append (lost)": one,
                      "update_turn (lost)": one, "end_turn (lost)": one, "release (lost)": one,
                      "end_turn": one, "release": one}


async def test_a_turns_writes_take_few_round_trips(postgres_url):
    """(statements, transactions) per call; BEGIN and COMMIT count as statements: one round trip each."""
    s = PostgresStore(postgres_url, replica="r1")
    await s.open()
    counts: dict[str, tuple[int, int]] = {}

    async def count(name: str, call) -> None:
        before = (s.stats.statements, s.stats.transactions)
        await call
        counts[name] = (s.stats.statements - before[0], s.stats.transactions - before[1])

    try:
        await conversations(s, "c1")
        await count("admit", s.admit("c1", "t1", "enqueue", 1.0, 100.0))  # claimed at once
        await count("begin_turn", s.begin_turn(turn("t1"), ("turn.started", {}), 1.0))
        await count("append", s.append("c1", "t1", [UserMessage(content="x")] * 3, [("a", {})] * 2, 1.0))
        await count("append_event", s.append_event("c1", "e", {}, 1.0))
        await count("append_messages", s.append_messages("c1", "t1", [UserMessage(content="x")], 1.0))
        await count("update_turn", s.update_turn("t1", status="waiting"))
        await count("set_conversation_status", s.set_conversation_status("c1", "waiting", 1.0))
        await count("end_turn", s.end_turn("t1", "c1", {"status": "completed"}, ("turn.completed", {}), 2.0))
        await count("claim", s.claim("c1", "t2", 2.0, 100.0))
        await count("create_turn", s.create_turn(turn("t2")))
        await count("release", s.release("c1", "t2"))
    finally:
        await s.close()
    assert counts == {
        "admit": (4, 1), "begin_turn": (1, 1), "append": (1, 1), "append_event": (1, 1),
        "append_messages": (1, 1), "update_turn": (1, 1), "set_conversation_status": (1, 1),
        "end_turn": (1, 1), "claim": (4, 1), "create_turn": (1, 1), "release": (1, 1),
    }


async def test_replicas_hammering_one_database_keep_one_turn_per_conversation(postgres_url):
    """Several replicas admit, claim, run and end turns at once: no deadlock, never two at a time."""
    stores = [PostgresStore(postgres_url, replica=f"r{n}") for n in range(3)]
    for s in stores:
        await s.open()
    await conversations(stores[0], "c0", "c1", "c2")
    running: set[str] = set()
    ended: list[str] = []

    async def worker(s: PostgresStore, w: int) -> None:
        for n in range(25):
            cid, tid = f"c{n % 3}", f"t{w}-{n}"
            policy = ("reject", "enqueue", "interrupt")[(n + w) % 3]
            admitted = await s.admit(cid, tid, policy, 1.0, 1e12)
            if admitted.busy or admitted.joined:
                continue
            fence = admitted.fence
            while fence is None:
                claim = await s.claim(cid, tid, 1.0, 1e12)
                if claim.superseded:
                    break
                fence = claim.fence
                await anyio.sleep(0.002)
            if fence is None:
                continue
            assert cid not in running, f"two turns hold {cid}"
            running.add(cid)
            await s.begin_turn(turn(tid, cid), ("turn.started", {}), 1.0)
            await s.append(cid, tid, [UserMessage(content="x")], [("step", {})], 1.0)
            await s.renew_leases(1e12)
            await s.recover_lapsed(2.0)
            running.discard(cid)
            await s.end_turn(tid, cid, {"status": "completed"}, ("turn.completed", {}), 3.0)
            ended.append(tid)

    try:
        async with anyio.create_task_group() as tg:
            for w, s in enumerate(stores * 2):
                tg.start_soon(worker, s, w)
    finally:
        for s in stores:
            await s.close()
    assert len(ended) >= 10
