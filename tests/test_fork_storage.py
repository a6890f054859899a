"""What a fork costs, over HTTP: it shares its source's transcript instead of copying it (CONTRACT §10).

A real Corral on loopback with its embedded SQLite store, on the versioned
tree (`edited` answers "v1: <what it was sent>"). The cost is read beside
the server, in its state directory: the count of rows in the messages table
(a read-only connection) and the size of the database's files.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.support.client import Conversation
from tests.support.servers import corral_server
from tests.support.trees import versioned_definitions

pytestmark = pytest.mark.anyio

BIG = "x" * 200_000  # each turn stores it twice: the question, and the answer that echoes it
FORKS = 10


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    root = versioned_definitions(tmp_path / "defs")
    with corral_server(root, tmp_path / "state") as url:
        async with httpx.AsyncClient(base_url=url, timeout=30, trust_env=False) as client:
            yield client


def message_rows(state: Path) -> int:
    db = sqlite3.connect(f"file:{state / 'corral.db'}?mode=ro", uri=True)
    try:
        return db.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
    finally:
        db.close()


def stored_bytes(state: Path) -> int:
    """The database and its write-ahead log (where new pages go before a checkpoint)."""
    return sum(p.stat().st_size for p in state.glob("corral.db*"))


async def fork(source: Conversation, **body: str) -> Conversation:
    r = await source.client.post(f"{source.path}/fork", json=body)
    assert r.status_code == 201, r.text
    return Conversation(source.client, r.json())


async def test_forks_of_a_large_transcript_cost_no_copy_and_go_on_apart(client, tmp_path: Path) -> None:
    state = tmp_path / "state"
    source = await Conversation.create(client, "edited")
    for n in range(3):
        await source.say(f"{n} {BIG}")
    transcript = await source.messages()
    assert len(transcript) == 6
    rows, size = message_rows(state), stored_bytes(state)

    forks = [await fork(source) for _ in range(FORKS)]
    cut = await fork(source, before_turn_id=transcript[4]["turn_id"])
    # copies would add 11 transcripts (6.6 MB); shared, a fork is a row of the conversations table
    assert message_rows(state) == rows
    assert stored_bytes(state) - size < len(BIG), stored_bytes(state) - size
    for each in forks:
        assert await each.messages() == transcript  # seq, turn, time and body: the source's own
    assert await cut.messages() == transcript[:4]
    # what the next model request of each would carry (estimated, about four characters a token)
    used = [(await client.get(f"{c.path}/context")).json()["used"] for c in (forks[0], cut)]
    assert used[0] >= 6 * len(BIG) // 4 and 4 * len(BIG) // 4 <= used[1] < used[0], used

    # each goes on by itself: its own turns are numbered after what it shares, and no one else sees them
    assert (await forks[0].say("fork says"))["output"] == "v1: fork says"
    assert (await cut.say("cut says"))["output"] == "v1: cut says"
    assert (await source.say("source says"))["output"] == "v1: source says"
    assert [(m["seq"], m["content"]) for m in (await forks[0].messages())[6:]] == [
        (7, "fork says"), (8, "v1: fork says")]
    assert [(m["seq"], m["content"]) for m in (await cut.messages())[4:]] == [
        (5, "cut says"), (6, "v1: cut says")]
    assert [m["content"] for m in (await source.messages())[6:]] == ["source says", "v1: source says"]
    assert await forks[1].messages() == transcript

    # a fork of a fork reads through both; deleting the source breaks neither, nor costs a copy
    deeper = await fork(forks[0])
    assert await deeper.messages() == await forks[0].messages()
    before = {each.id: await each.messages() for each in (forks[0], forks[1], cut, deeper)}
    r = await client.delete(source.path)
    assert r.status_code == 204, r.text
    for each in (forks[0], forks[1], cut, deeper):
        assert await each.messages() == before[each.id]
    # the source's first six rows stay (a fork holds them now), its last turn's two go
    assert message_rows(state) == rows + 2 + 2
    assert (await deeper.say("deeper says"))["output"] == "v1: deeper says"
    assert [m["seq"] for m in await deeper.messages()] == list(range(1, 11))
