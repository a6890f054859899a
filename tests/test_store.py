"""The SQLite store on a real file, driven through the `Store` methods only."""

from __future__ import annotations

import re
import sqlite3
import time
from dataclasses import replace

import anyio
import pytest
from anyio.lowlevel import checkpoint
from hypothesis import given
from hypothesis import strategies as st

from server.canonical import freeze
from server.ids import encode, new_id
from server.messages import AssistantMessage, ToolCall, ToolResultMessage, UserMessage
from server.store.base import ConversationRecord, DuplicateIdempotencyKey, StoredDefinition, TurnRecord
from server.store.sqlite import SQLiteStore
from server.store.sqlite.migrations import MIGRATIONS

DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
async def store(tmp_path):
    s = SQLiteStore(tmp_path / "state" / "corral.db")  # the parent does not exist yet
    await s.open()
    yield s
    await s.close()


def conversation(id: str, *, created_at: float = 1.0, agent_name: str = "helper", digest: str = DIGEST_A,
                 status: str = "idle") -> ConversationRecord:
    return ConversationRecord(id=id, agent=agent_name, agent_name=agent_name, digest=digest, pinned=False,
                              status=status, created_at=created_at, updated_at=created_at)


def turn(id: str, conversation_id: str, *, status: str = "running", started_at: float = 1.0,
         key: str | None = None) -> TurnRecord:
    return TurnRecord(id=id, conversation_id=conversation_id, agent="helper", digest=DIGEST_A, status=status,
                      input="hello", idempotency_key=key, started_at=started_at)


# conversations


@pytest.mark.anyio
async def test_conversation_round_trip_status_and_delete(store):
    record = ConversationRecord(
        id="conv_1", agent="helper@sha256:" + "a" * 64, agent_name="helper", digest=DIGEST_A, pinned=True,
        title="Ünïcode title", metadata={"team": "core", "tags": ["a", "b"], "n": 1.5},
        created_at=10.0, updated_at=10.0,
    )
    await store.create_conversation(record)
    assert await store.get_conversation("conv_1") == record
    assert await store.get_conversation("conv_missing") is None

    await store.set_conversation_status("conv_1", "busy", now=11.0)
    assert await store.get_conversation("conv_1") == replace(record, status="busy", updated_at=11.0)

    assert await store.delete_conversation("conv_1") is True
    assert await store.get_conversation("conv_1") is None
    assert await store.delete_conversation("conv_1") is False


@pytest.mark.anyio
async def test_conversations_page_newest_first_without_gaps_or_duplicates(store):
    # two pairs share a created_at, so the id must break the tie
    times = [1.0, 2.0, 2.0, 3.0, 4.0, 4.0, 5.0]
    for n, created_at in enumerate(times):
        await store.create_conversation(conversation(f"conv_{n}", created_at=created_at))
    expected = [f"conv_{n}" for n in (6, 5, 4, 3, 2, 1, 0)]

    seen: list[str] = []
    pages: list[int] = []
    after = None
    while page := await store.list_conversations(limit=3, after=after):
        pages.append(len(page))
        seen.extend(c.id for c in page)
        after = page[-1].id
    assert pages == [3, 3, 1]
    assert seen == expected


@pytest.mark.anyio
async def test_conversation_filters_combine_with_pagination(store):
    specs = [("helper", DIGEST_A, "idle"), ("helper", DIGEST_B, "busy"), ("other", DIGEST_A, "idle"),
             ("helper", DIGEST_A, "idle"), ("helper", DIGEST_A, "waiting")]
    for n, (agent_name, digest, status) in enumerate(specs):
        record = conversation(f"conv_{n}", created_at=n, agent_name=agent_name, digest=digest, status=status)
        await store.create_conversation(record)

    async def ids(**filters):
        return [c.id for c in await store.list_conversations(**filters)]

    assert await ids(agent="helper") == ["conv_4", "conv_3", "conv_1", "conv_0"]
    assert await ids(agent="other") == ["conv_2"]
    assert await ids(digest=DIGEST_B) == ["conv_1"]
    assert await ids(status="idle") == ["conv_3", "conv_2", "conv_0"]
    assert await ids(agent="helper", digest=DIGEST_A, status="idle") == ["conv_3", "conv_0"]
    assert await ids(agent="helper", limit=2, after="conv_3") == ["conv_1", "conv_0"]
    assert await ids(agent="nobody") == []


@pytest.mark.anyio
async def test_paging_survives_deleting_the_cursor(store):
    # the pattern of a clean-up script: list a page, delete it, ask for the next one
    for n in range(5):
        await store.create_conversation(conversation(new_id("conv"), created_at=float(n)))
    first = await store.list_conversations(limit=2)
    for c in first:
        await store.delete_conversation(c.id)
    rest = await store.list_conversations(limit=10, after=first[-1].id)
    assert len(rest) == 3
    assert not {c.id for c in rest} & {c.id for c in first}


# turns


@pytest.mark.anyio
async def test_turn_round_trip_and_partial_update(store):
    await store.create_conversation(conversation("conv_1"))
    record = turn("turn_1", "conv_1", key="key-1")
    await store.create_turn(record)
    assert await store.get_turn("turn_1") == record
    assert await store.get_turn("turn_missing") is None

    await store.update_turn("turn_1", status="completed", output="hi there", stop_reason="end_turn",
                            usage={"input_tokens": 12, "output_tokens": 3}, ended_at=2.5)
    done = replace(record, status="completed", output="hi there", stop_reason="end_turn",
                   usage={"input_tokens": 12, "output_tokens": 3}, ended_at=2.5)
    assert await store.get_turn("turn_1") == done

    await store.update_turn("turn_1", error={"code": "model_error", "message": "upstream said 500"})
    assert (await store.get_turn("turn_1")).error == {"code": "model_error", "message": "upstream said 500"}
    await store.update_turn("turn_1", error=None)
    assert await store.get_turn("turn_1") == done

    with pytest.raises(ValueError, match="digest"):
        await store.update_turn("turn_1", status="failed", digest=DIGEST_B)
    assert await store.get_turn("turn_1") == done


@pytest.mark.anyio
async def test_turns_page_oldest_first(store):
    await store.create_conversation(conversation("conv_1"))
    await store.create_conversation(conversation("conv_2"))
    for n, started_at in enumerate([1.0, 2.0, 2.0, 3.0, 4.0]):
        await store.create_turn(turn(f"turn_{n}", "conv_1", started_at=started_at))
    await store.create_turn(turn("turn_other", "conv_2"))

    seen: list[str] = []
    after = None
    while page := await store.list_turns("conv_1", limit=2, after=after):
        seen.extend(t.id for t in page)
        after = page[-1].id
    assert seen == [f"turn_{n}" for n in range(5)]


@pytest.mark.anyio
async def test_idempotency_keys_are_unique_per_conversation(store):
    await store.create_conversation(conversation("conv_1"))
    await store.create_conversation(conversation("conv_2"))
    await store.create_turn(turn("turn_1", "conv_1", started_at=100.0, key="k"))

    with pytest.raises(DuplicateIdempotencyKey):
        await store.create_turn(turn("turn_2", "conv_1", started_at=200.0, key="k"))
    assert await store.get_turn("turn_2") is None

    await store.create_turn(turn("turn_3", "conv_2", key="k"))  # another conversation: its own key space
    await store.create_turn(turn("turn_4", "conv_1"))  # turns without a key never collide
    await store.create_turn(turn("turn_5", "conv_1"))

    assert (await store.find_turn_by_key("conv_1", "k", since=100.0)).id == "turn_1"
    assert await store.find_turn_by_key("conv_1", "k", since=100.5) is None  # older than the window
    assert await store.find_turn_by_key("conv_1", "other", since=0.0) is None

    # an expired key can be released, then reused
    await store.update_turn("turn_1", idempotency_key=None)
    await store.create_turn(turn("turn_6", "conv_1", started_at=200.0, key="k"))
    assert (await store.find_turn_by_key("conv_1", "k", since=150.0)).id == "turn_6"


@pytest.mark.anyio
async def test_recovery_at_start_fails_unfinished_turns_only(store):
    for cid, status in (("conv_1", "busy"), ("conv_2", "waiting"), ("conv_3", "idle")):
        await store.create_conversation(conversation(cid, status=status))
    await store.create_turn(turn("turn_run", "conv_1", status="running", started_at=1.0))
    await store.create_turn(turn("turn_wait", "conv_2", status="waiting", started_at=2.0))
    await store.create_turn(turn("turn_done", "conv_3", status="completed", started_at=0.5))
    await store.update_turn("turn_done", output="fine", ended_at=0.7)
    before = await store.get_turn("turn_done")

    recovered = [r.turn for r in await store.recover_lapsed(now=50.0, starting=True)]

    assert [t.id for t in recovered] == ["turn_run", "turn_wait"]
    interrupted = {"code": "interrupted", "message": "the server stopped while this turn was running"}
    for t in recovered:
        assert t == await store.get_turn(t.id)
        assert (t.status, t.error, t.ended_at) == ("failed", interrupted, 50.0)
    assert await store.get_turn("turn_done") == before
    for cid in ("conv_1", "conv_2", "conv_3"):
        assert (await store.get_conversation(cid)).status == "idle"
    assert await store.recover_lapsed(now=60.0, starting=True) == []
    assert [e.name for e in await store.list_events("conv_1")] == ["turn.failed"]


# transcript and events

TRANSCRIPT = [
    UserMessage(content="What is the weather in Zürich?"),
    AssistantMessage(content="", tool_calls=(
        ToolCall(id="call_1", name="weather__forecast", arguments=freeze({"city": "Zürich", "days": [1, 2]})),
        ToolCall(id="call_2", name="broken", arguments="{not json"),
    )),
    ToolResultMessage(tool_call_id="call_1", name="weather__forecast", content='{"temp": 21}'),
    ToolResultMessage(tool_call_id="call_2", name="broken", content="bad arguments", is_error=True),
    AssistantMessage(content="21 °C and sunny."),
]


@pytest.mark.anyio
async def test_messages_round_trip_with_tool_calls(store):
    await store.create_conversation(conversation("conv_1"))
    await store.create_turn(turn("turn_1", "conv_1"))
    await store.append_messages("conv_1", "turn_1", TRANSCRIPT[:2], now=5.0)
    await store.append_messages("conv_1", "turn_1", [], now=5.5)
    await store.append_messages("conv_1", "turn_1", TRANSCRIPT[2:], now=6.0)

    records = await store.list_messages("conv_1")
    assert [r.seq for r in records] == [1, 2, 3, 4, 5]
    assert [r.message for r in records] == TRANSCRIPT
    assert [r.message.to_json() for r in records] == [m.to_json() for m in TRANSCRIPT]
    assert {(r.conversation_id, r.turn_id) for r in records} == {("conv_1", "turn_1")}
    assert [r.created_at for r in records] == [5.0, 5.0, 6.0, 6.0, 6.0]
    assert (await store.get_conversation("conv_1")).updated_at == 6.0

    assert [r.seq for r in await store.list_messages("conv_1", after=2, limit=2)] == [3, 4]
    assert await store.list_messages("conv_1", after=5) == []


@pytest.mark.anyio
async def test_event_seq_is_per_conversation_and_strictly_increasing(store):
    await store.create_conversation(conversation("conv_1"))
    await store.create_conversation(conversation("conv_2"))
    seqs = [await store.append_event("conv_1", "message.delta", {"text": t}, now=1.0) for t in "abc"]
    assert seqs == [1, 2, 3]
    assert await store.append_event("conv_2", "turn.started", {"turn_id": "turn_1"}, now=1.0) == 1

    events = await store.list_events("conv_1", after=1)
    assert [(e.seq, e.name, e.data) for e in events] == [(2, "message.delta", {"text": "b"}),
                                                        (3, "message.delta", {"text": "c"})]
    assert [e.seq for e in await store.list_events("conv_1", limit=2)] == [1, 2]


@pytest.mark.anyio
async def test_concurrent_event_appends_never_collide(store):
    await store.create_conversation(conversation("conv_1"))
    seqs: dict[int, list[int]] = {}

    async def writer(task: int) -> None:
        mine = seqs.setdefault(task, [])
        for n in range(20):
            mine.append(await store.append_event("conv_1", "tick", {"task": task, "n": n}, now=float(n)))
            await checkpoint()  # let the other writers interleave

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for task in range(50):
                tg.start_soon(writer, task)

    everything = sorted(s for mine in seqs.values() for s in mine)
    assert everything == list(range(1, 1001))
    for mine in seqs.values():
        assert mine == sorted(mine)
    events = await store.list_events("conv_1", limit=2000)
    assert [e.seq for e in events] == list(range(1, 1001))
    by_task = {(e.data["task"], e.data["n"]): e.seq for e in events}
    assert by_task == {(t, n): seqs[t][n] for t in range(50) for n in range(20)}


@pytest.mark.anyio
async def test_writes_to_an_unknown_conversation_are_refused(store):
    with pytest.raises(sqlite3.IntegrityError):
        await store.append_event("conv_missing", "tick", {}, now=1.0)
    with pytest.raises(sqlite3.IntegrityError):
        await store.create_turn(turn("turn_1", "conv_missing"))


@pytest.mark.anyio
async def test_delete_cascades_to_turns_messages_and_events(store):
    for cid in ("conv_1", "conv_2"):
        await store.create_conversation(conversation(cid))
        await store.create_turn(turn(f"turn_{cid}", cid, key="k"))
        await store.append_messages(cid, f"turn_{cid}", TRANSCRIPT, now=1.0)
        await store.append_event(cid, "turn.started", {}, now=1.0)

    assert await store.delete_conversation("conv_1")

    assert await store.get_turn("turn_conv_1") is None
    assert await store.list_turns("conv_1") == []
    assert await store.list_messages("conv_1") == []
    assert await store.list_events("conv_1") == []
    assert await store.find_turn_by_key("conv_1", "k", since=0.0) is None
    assert len(await store.list_messages("conv_2")) == len(TRANSCRIPT)
    assert len(await store.list_events("conv_2")) == 1
    assert await store.get_turn("turn_conv_2") is not None


# definitions


@pytest.mark.anyio
async def test_definitions_saved_twice_are_stored_once(store):
    v1 = StoredDefinition(kind="Agent", name="helper", digest=DIGEST_A,
                          spec=freeze({"model": "m", "tools": ["a"]}), first_seen=1.0)
    v2 = StoredDefinition(kind="Agent", name="helper", digest=DIGEST_B, spec={"model": "n"}, first_seen=2.0)
    tool = StoredDefinition(kind="Tool", name="helper", digest="sha256:" + "c" * 64, spec={}, first_seen=1.0)
    await store.save_definitions([v1, tool])
    await store.save_definitions([replace(v1, first_seen=9.0), v2])
    await store.save_definitions([])

    assert await store.get_definition(DIGEST_A) == replace(v1, spec={"model": "m", "tools": ["a"]})
    assert await store.get_definition("sha256:" + "0" * 64) is None
    assert [d.digest for d in await store.find_definitions("Agent", "helper")] == [DIGEST_A, DIGEST_B]
    assert await store.find_definitions("Agent", "nobody") == []


# the file itself


@pytest.mark.anyio
async def test_a_reopened_store_sees_everything(tmp_path):
    path = tmp_path / "corral.db"
    first = SQLiteStore(path)
    await first.open()
    await first.create_conversation(conversation("conv_1", status="busy"))
    await first.create_turn(turn("turn_1", "conv_1", key="k"))
    await first.append_messages("conv_1", "turn_1", TRANSCRIPT, now=2.0)
    for n in range(3):
        await first.append_event("conv_1", "tick", {"n": n}, now=2.0)
    await first.save_definitions([StoredDefinition(kind="Agent", name="helper", digest=DIGEST_A,
                                                   spec={"x": 1}, first_seen=1.0)])
    await first.close()

    second = SQLiteStore(str(path))
    await second.open()
    try:
        assert (await second.get_conversation("conv_1")).status == "busy"
        assert (await second.find_turn_by_key("conv_1", "k", since=0.0)).id == "turn_1"
        assert [r.message for r in await second.list_messages("conv_1")] == TRANSCRIPT
        assert await second.append_event("conv_1", "tick", {"n": 3}, now=3.0) == 4
        assert (await second.get_definition(DIGEST_A)).spec == {"x": 1}
        assert [r.turn.id for r in await second.recover_lapsed(now=4.0, starting=True)] == ["turn_1"]
    finally:
        await second.close()

    raw = sqlite3.connect(path)
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert raw.execute("SELECT MAX(version) FROM schema_version").fetchall() == [(len(MIGRATIONS),)]
    finally:
        raw.close()


@pytest.mark.anyio
async def test_a_database_from_a_newer_server_is_refused(tmp_path):
    path = tmp_path / "corral.db"
    s = SQLiteStore(path)
    await s.open()
    await s.close()
    raw = sqlite3.connect(path)
    with raw:
        raw.execute("INSERT INTO schema_version (version) VALUES (?)", (len(MIGRATIONS) + 1,))
    raw.close()
    with pytest.raises(RuntimeError, match="newer"):
        await SQLiteStore(path).open()


@pytest.mark.anyio
async def test_a_closed_store_refuses_calls(tmp_path):
    s = SQLiteStore(tmp_path / "corral.db")
    with pytest.raises(RuntimeError, match="not open"):
        await s.get_conversation("conv_1")


# ids

ULID = re.compile(r"conv_[0-9A-HJKMNP-TV-Z]{26}")


def test_new_ids_are_unique_well_formed_and_sorted():
    before = time.time_ns() // 1_000_000
    ids = [new_id("conv") for _ in range(10_000)]
    after = time.time_ns() // 1_000_000
    assert all(ULID.fullmatch(i) for i in ids)
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    ms = int(ids[0][5:15].translate(str.maketrans("JKMNPQRSTVWXYZ", "IJKLMNOPQRSTUV")), 32)
    assert before <= ms <= after


def test_encoding_of_the_extremes():
    assert encode(0) == "0" * 26
    assert encode(2**128 - 1) == "7" + "Z" * 25
    assert encode(31 << 120) == "0Z" + "0" * 24


@given(st.integers(0, 2**128 - 1), st.integers(0, 2**128 - 1))
def test_encoding_keeps_numeric_order(a, b):
    assert len(encode(a)) == 26
    assert (a < b) == (encode(a) < encode(b))


@pytest.mark.anyio
async def test_pending_permissions_are_cancelled_at_start_up(tmp_path) -> None:
    from server.store.base import PermissionRecord

    store = SQLiteStore(tmp_path / "state" / "corral.db")
    await store.open()
    try:
        await store.create_conversation(ConversationRecord(
            id="conv_p", agent="a", agent_name="a", digest=DIGEST_A, pinned=False,
            created_at=1.0, updated_at=1.0))
        await store.create_turn(TurnRecord(id="turn_x", conversation_id="conv_p", agent="a", digest=DIGEST_A,
                                           status="waiting", started_at=1.0))
        for rid in ("perm_1", "perm_2"):
            await store.create_permission(PermissionRecord(
                id=rid, conversation_id="conv_p", turn_id="turn_x", tool_call_id="c", tool="t", arguments={},
                reason=None, status="pending", requested_at=1.0, expires_at=2.0))
        await store.decide_permission("perm_1", "allowed", "anonymous", 1.5)
        assert [r.turn.id for r in await store.recover_lapsed(3.0, starting=True)] == ["turn_x"]
        records = {r.id: r for r in await store.list_permissions("conv_p")}
        assert (records["perm_1"].status, records["perm_2"].status) == ("allowed", "cancelled")
        assert records["perm_2"].decided_by == "recovery"
    finally:
        await store.close()
