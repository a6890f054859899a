"""Forks share their source's messages, on SQLite and on PostgreSQL; a turn's messages by its id.

Same fixtures as `test_store_contract.py` (`store`, once per backend). What
a fork holds is read through the store (`list_messages`); what it costs is
the count of rows in the messages table, read beside the store.
"""

from __future__ import annotations

import sqlite3
from dataclasses import replace

import anyio
import asyncpg
import pytest

from server.messages import AssistantMessage, UserMessage
from server.store.base import ConversationRecord, Store
from server.store.postgres import PostgresStore
from server.store.postgres.migrations import LOCK_KEY
from server.store.postgres.migrations import MIGRATIONS as PG_MIGRATIONS
from server.store.sqlite import SQLiteStore
from server.store.sqlite.migrations import MIGRATIONS as SQLITE_MIGRATIONS
from tests.support import stores
from tests.support.stores import conversation, conversations, turn

pytestmark = pytest.mark.anyio

make_store, store, other = stores.make_store, stores.store, stores.other  # the fixtures: r1 and r2


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def message_rows(store: Store) -> int:
    """How many rows the messages table holds, every conversation's."""
    if isinstance(store, SQLiteStore):
        return store._db.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
    assert isinstance(store, PostgresStore)
    return (await store._read("SELECT COUNT(*) FROM messages"))[0][0]


def _new(id: str, source: str, turn_id: str | None = None) -> ConversationRecord:
    forked_from = {"conversation_id": source, "turn_id": turn_id}
    return replace(conversation(id, created_at=50.0), forked_from=forked_from)


async def _turns(store: Store, cid: str, *names: str, start: float = 1.0) -> None:
    """Ended turns of `cid`, one a name, each a question and its answer ("q<name>", "a<name>")."""
    for n, name in enumerate(names):
        at = start + n
        await store.begin_turn(turn(name, cid, started_at=at), ("turn.started", {"turn_id": name}), at)
        await store.append_messages(cid, name, [UserMessage(content=f"q{name}"),
                                                AssistantMessage(content=f"a{name}")], now=at)
        await store.end_turn(name, cid, {"status": "completed"}, ("turn.completed", {}), at)


async def _transcript(store: Store, cid: str) -> list[tuple[int, str, str]]:
    return [(r.seq, r.turn_id, r.message.content) for r in await store.list_messages(cid)]


async def test_forks_share_the_transcript_instead_of_copying_it(store):
    await conversations(store, "c1")
    await _turns(store, "c1", "t1", "t2", "t3")
    source = await _transcript(store, "c1")
    assert len(source) == 6 and await message_rows(store) == 6
    for n in range(10):
        assert await store.fork_conversation("c1", _new(f"f{n}", "c1"), None) is True
        assert await _transcript(store, f"f{n}") == source
    assert await store.fork_conversation("c1", _new("cut", "c1", "t3"), "t3") is True
    assert await _transcript(store, "cut") == source[:4]
    assert await message_rows(store) == 6  # eleven forks, not one message more
    # each goes on by itself, numbered after what it shares; the source too
    await _turns(store, "f0", "u1", start=10.0)
    await _turns(store, "cut", "u2", start=11.0)
    await _turns(store, "c1", "t4", start=12.0)
    assert await _transcript(store, "f0") == [*source, (7, "u1", "qu1"), (8, "u1", "au1")]
    assert await _transcript(store, "cut") == [*source[:4], (5, "u2", "qu2"), (6, "u2", "au2")]
    assert await _transcript(store, "c1") == [*source, (7, "t4", "qt4"), (8, "t4", "at4")]
    assert await _transcript(store, "f1") == source
    assert await message_rows(store) == 12


async def test_a_fork_of_a_fork_reads_through_the_chain_and_pages(store, other):
    await conversations(store, "c1")
    await _turns(store, "c1", "t1", "t2")
    await store.fork_conversation("c1", _new("f1", "c1"), None)
    await _turns(store, "f1", "u1", start=10.0)
    await store.fork_conversation("f1", _new("f2", "f1"), None)
    await _turns(store, "f2", "v1", "v2", start=20.0)
    # cut before f2's first own turn: what f2 shares, read from where it lives (f1, then c1)
    assert await other.fork_conversation("f2", _new("f3", "f2", "v1"), "v1") is True
    assert await other.fork_conversation("f3", _new("f4", "f3"), None) is True
    expected = [(1, "t1", "qt1"), (2, "t1", "at1"), (3, "t2", "qt2"), (4, "t2", "at2"),
                (5, "u1", "qu1"), (6, "u1", "au1")]
    assert await _transcript(other, "f3") == expected and await _transcript(other, "f4") == expected
    f2 = [*expected, (7, "v1", "qv1"), (8, "v1", "av1"), (9, "v2", "qv2"), (10, "v2", "av2")]
    assert await _transcript(other, "f2") == f2
    # pages that start, end and cross where one link's rows end and the next's begin
    for after, limit in ((0, 1), (3, 2), (4, 3), (5, 1), (6, 4), (2, 100), (10, 5), (11, 1)):
        page = [r.seq for r in await other.list_messages("f2", after=after, limit=limit)]
        assert page == list(range(after + 1, min(after + limit, 10) + 1)), (after, limit)
    assert await other.list_messages("missing") == []
    assert await message_rows(store) == 10


async def test_deleting_a_source_hands_its_rows_to_its_forks(store, other):
    await conversations(store, "c1")
    await _turns(store, "c1", "t1", "t2", "t3")
    await store.fork_conversation("c1", _new("short", "c1", "t2"), "t2")  # shares 2
    await store.fork_conversation("c1", _new("long", "c1"), None)  # shares 6
    await _turns(store, "long", "u1", start=10.0)
    await store.fork_conversation("long", _new("deep", "long"), None)  # shares 8
    await _turns(store, "short", "w1", start=11.0)
    before = {cid: await _transcript(store, cid) for cid in ("short", "long", "deep")}
    assert await message_rows(store) == 10
    assert await other.delete_conversation("c1") is True
    assert await other.get_conversation("c1") is None
    for cid, transcript in before.items():
        assert await _transcript(other, cid) == transcript, cid
    assert await message_rows(store) == 10  # c1's six went to "long", none copied
    assert await other.delete_conversation("long") is True  # itself a source now, of "deep" and "short"
    for cid in ("short", "deep"):
        assert await _transcript(store, cid) == before[cid], cid
    assert await message_rows(store) == 10
    await _turns(store, "deep", "x1", start=30.0)  # goes on, numbered after what it shares
    assert (await _transcript(store, "deep"))[-1] == (10, "x1", "ax1")
    assert await store.delete_conversation("deep") is True
    assert await _transcript(store, "short") == before["short"]
    assert await message_rows(store) == 4  # "short"'s two shared and its own two
    assert await store.delete_conversation("short") is True and await message_rows(store) == 0
    assert await store.delete_conversation("short") is False


async def test_a_turns_messages_are_read_by_its_id(store):
    await conversations(store, "c1", "c2")
    await _turns(store, "c1", "t1", "t2", "t3")
    await store.begin_turn(turn("t4", "c1", started_at=9.0), ("turn.started", {}), 9.0)
    await store.add_steer("c1", "t4", "and this", 9.0)
    await store.append_messages("c1", "t4", [UserMessage(content="q4")], now=9.0)
    await store.take_steers("c1", "t4", 9.5)
    await store.fork_conversation("c1", _new("f1", "c1"), None)
    await _turns(store, "f1", "u1", start=10.0)

    async def of(cid: str, turn_id: str) -> list[tuple[int, str]]:
        records = await store.turn_messages(cid, turn_id)
        assert all(r.turn_id == turn_id and r.conversation_id == cid for r in records)
        return [(r.seq, r.message.content) for r in records]

    assert await of("c1", "t2") == [(3, "qt2"), (4, "at2")]
    assert await of("c1", "t4") == [(7, "q4"), (8, "and this")]
    assert await of("f1", "u1") == [(7, "qu1"), (8, "au1")]
    assert await of("c2", "t2") == [] and await of("c1", "nope") == []


# --- forks made before they shared: their copies become shared when the store opens ----------------

_ROWS = [  # (conversation, seq, turn, body, created_at): what a copying fork wrote
    *[("c1", n, f"t{(n + 1) // 2}", f'{{"role":"user","content":"m{n}"}}', float(n)) for n in range(1, 5)],
    *[("f1", n, f"t{(n + 1) // 2}", f'{{"role":"user","content":"m{n}"}}', float(n)) for n in range(1, 5)],
    ("f1", 5, "u1", '{"role":"user","content":"own"}', 9.0),
    *[("f2", n, f"t{(n + 1) // 2}", f'{{"role":"user","content":"m{n}"}}', float(n)) for n in range(1, 3)],
    *[("orphan", n, f"t{n}", f'{{"role":"user","content":"o{n}"}}', float(n)) for n in range(1, 3)],
]
_CONVERSATIONS = [("c1", None), ("f1", "c1"), ("f2", "f1"), ("orphan", "gone")]
_EXPECTED = {"c1": ["m1", "m2", "m3", "m4"], "f1": ["m1", "m2", "m3", "m4", "own"], "f2": ["m1", "m2"],
             "orphan": ["o1", "o2"]}


async def _check_shared(s: Store) -> None:
    for cid, contents in _EXPECTED.items():
        assert [r.message.content for r in await s.list_messages(cid)] == contents, cid
    assert await message_rows(s) == 4 + 1 + 2  # c1's, f1's own, the orphan's (its source is gone)
    await s.append_messages("f1", "u2", [UserMessage(content="next")], now=10.0)
    assert (await s.list_messages("f1"))[-1].seq == 6
    # f2 shares less from f1 than f1 shares from c1: deleting f1, then c1, leaves it its two
    assert await s.delete_conversation("f1") is True
    assert [r.message.content for r in await s.list_messages("f2")] == ["m1", "m2"]
    assert await s.delete_conversation("c1") is True
    assert [r.message.content for r in await s.list_messages("f2")] == ["m1", "m2"]
    assert await message_rows(s) == 2 + 2


async def test_sqlite_forks_made_by_copying_share_once_migrated(tmp_path):
    path = tmp_path / "corral.db"
    raw = sqlite3.connect(path)
    with raw:
        raw.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY)")
        for version in range(1, 9):
            for statement in SQLITE_MIGRATIONS[version - 1]:
                raw.execute(statement)
            raw.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))
        for cid, source in _CONVERSATIONS:
            raw.execute("INSERT INTO conversations (id, agent, agent_name, digest, pinned, metadata, status,"
                        " created_at, updated_at, forked_from_conversation)"
                        " VALUES (?, 'a', 'a', 'd', 0, '{}', 'idle', 1, 1, ?)", (cid, source))
        raw.executemany("INSERT INTO messages VALUES (?, ?, ?, ?, ?)", _ROWS)
    raw.close()
    s = SQLiteStore(path)
    await s.open()
    try:
        await _check_shared(s)
    finally:
        await s.close()


async def test_postgres_forks_made_by_copying_share_once_migrated(postgres_url):
    connection = await asyncpg.connect(postgres_url)
    try:
        async with connection.transaction():
            await connection.execute("SELECT pg_advisory_xact_lock($1)", LOCK_KEY)
            await connection.execute("CREATE TABLE schema_version (version integer PRIMARY KEY,"
                                     " applied_at timestamptz NOT NULL DEFAULT now())")
            for version in range(1, 5):
                for statement in PG_MIGRATIONS[version - 1]:
                    await connection.execute(statement)
                await connection.execute("INSERT INTO schema_version (version) VALUES ($1)", version)
            for cid, source in _CONVERSATIONS:
                count = sum(1 for row in _ROWS if row[0] == cid)
                await connection.execute(
                    "INSERT INTO conversations (id, agent, agent_name, digest, pinned, metadata, status,"
                    " created_at, updated_at, forked_from_conversation, message_seq) VALUES ($1, 'a', 'a',"
                    " 'd', false, '{}', 'idle', 1, 1, $2, $3)", cid, source, count)
            await connection.executemany("INSERT INTO messages VALUES ($1, $2, $3, $4, $5)", _ROWS)
    finally:
        await connection.close()
    s = PostgresStore(postgres_url, replica="r1")
    await s.open()
    try:
        await _check_shared(s)
    finally:
        await s.close()


async def test_forks_and_deletes_at_once_leave_every_fork_whole(store, other):
    """A fork racing its source's delete, and a fork's delete racing its source's: whichever wins,
    every fork that exists reads its whole transcript (two replicas, so two connections on PostgreSQL)."""
    for n in range(8):
        await conversations(store, f"s{n}")
        await _turns(store, f"s{n}", f"t{n}a", f"t{n}b")
        await store.fork_conversation(f"s{n}", _new(f"m{n}", f"s{n}"), None)  # shares 4
        await _turns(store, f"m{n}", f"u{n}", start=10.0)
        await store.fork_conversation(f"m{n}", _new(f"k{n}", f"m{n}"), None)  # shares 6, from m
        expected = await _transcript(store, f"k{n}")
        forked: list[bool] = []

        async def fork_it(n=n, forked=forked) -> None:
            forked.append(await other.fork_conversation(f"s{n}", _new(f"x{n}", f"s{n}"), None))

        async with anyio.create_task_group() as tg:
            tg.start_soon(store.delete_conversation, f"s{n}")
            tg.start_soon(other.delete_conversation, f"m{n}")
            tg.start_soon(fork_it)
        assert await _transcript(store, f"k{n}") == expected
        if forked == [True]:
            assert await _transcript(store, f"x{n}") == expected[:4]
        else:
            assert await store.get_conversation(f"x{n}") is None
    for n in range(8):
        for cid in (f"k{n}", f"x{n}"):
            await store.delete_conversation(cid)
    assert await message_rows(store) == 0
