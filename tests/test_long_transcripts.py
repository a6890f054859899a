"""A turn's answer read back from the store is exact, however long its conversation's transcript.

A real Corral on loopback with its embedded SQLite store, on the versioned
tree (`edited` answers "v1: <what it was sent>"). A transcript of more than
100,000 messages would take 50,000 turns to make over HTTP: the test writes
them into the database beside the server instead (the server holds no
transaction open between requests), before the turn's own messages, as a
long conversation holds them.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx
import pytest

from tests.support.client import Conversation
from tests.support.servers import corral_server
from tests.support.trees import versioned_definitions

pytestmark = pytest.mark.anyio

EARLIER = 100_001  # more messages than a read of the whole transcript ever took at once


def push_back(state: Path, conversation_id: str) -> None:
    """Put EARLIER messages of an earlier turn before everything the conversation holds."""
    db = sqlite3.connect(state / "corral.db", timeout=30)
    try:
        with db:
            db.execute("UPDATE messages SET seq = seq + ? WHERE conversation_id = ?",
                       (EARLIER, conversation_id))
            db.executemany(
                "INSERT INTO messages (conversation_id, seq, turn_id, body, created_at)"
                " VALUES (?, ?, ?, ?, ?)",
                ((conversation_id, seq, "turn_earlier", '{"role":"user","content":"."}', 1.0)
                 for seq in range(1, EARLIER + 1)))
    finally:
        db.close()


async def test_an_idempotent_retry_answers_the_turns_own_messages_after_a_long_transcript(
        tmp_path: Path) -> None:
    root = versioned_definitions(tmp_path / "defs")
    with corral_server(root, tmp_path / "state") as url:
        async with httpx.AsyncClient(base_url=url, timeout=60, trust_env=False) as client:
            conversation = await Conversation.create(client, "edited")
            first = await conversation.send("hello", key="k1")
            assert first.status_code == 200, first.text
            assert [m["content"] for m in first.json()["messages"]] == ["hello", "v1: hello"]
            push_back(tmp_path / "state", conversation.id)
            retried = await conversation.send("hello", key="k1")  # answered from the store this time
            assert retried.status_code == 200, retried.text
            assert retried.json()["turn_id"] == first.json()["turn_id"]
            assert retried.json()["messages"] == first.json()["messages"]
