"""Records for store tests, the store as tests use it, and an inbox for the notices a store delivers.

    await conversations(store, "c1", "c2")          # created in that order (c1 oldest)
    await store.create_turn(turn("t1", key="k"))    # running, in c1
    inbox = Inbox(); store.subscribe(inbox)
    await inbox.wait_for(t="event", c="c1")         # bounded: fails after 10 s

    make_store, store, other = stores.make_store, stores.store, stores.other  # in a test module
    async def test_x(store, other): ...             # once on SQLite, once on PostgreSQL; r1 and r2
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import anyio
import pytest

from server.store.base import (
    ConversationRecord,
    Notice,
    PermissionRecord,
    Store,
    StoredDefinition,
    TurnRecord,
)
from server.store.postgres import PostgresStore
from server.store.sqlite import SQLiteStore

DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64


class StoreForTests(Store, Protocol):
    """Every port, and what both stores have for tests and benchmarks only (the server never calls
    these, so no port names them)."""

    async def append_event(self, conversation_id: str, name: str, data: dict[str, Any],
                           now: float) -> int: ...
    # ^ one event on its own, with its "event" notice; returns its seq
    async def find_definitions(self, kind: str, name: str) -> list[StoredDefinition]: ...
    # ^ every version of one definition ever served, oldest first


def conversation(id: str, *, created_at: float = 1.0, agent_name: str = "helper", digest: str = DIGEST_A,
                 status: str = "idle") -> ConversationRecord:
    return ConversationRecord(id=id, agent=agent_name, agent_name=agent_name, digest=digest, pinned=False,
                              status=status, created_at=created_at, updated_at=created_at)


def turn(id: str, conversation_id: str = "c1", *, status: str = "running", started_at: float = 1.0,
         key: str | None = None, request_digest: str | None = None) -> TurnRecord:
    return TurnRecord(id=id, conversation_id=conversation_id, agent="helper", digest=DIGEST_A,
                      status=status, input="hello", idempotency_key=key, request_digest=request_digest,
                      started_at=started_at)


def permission(id: str, turn_id: str, conversation_id: str = "c1") -> PermissionRecord:
    return PermissionRecord(id=id, conversation_id=conversation_id, turn_id=turn_id, tool_call_id="call_1",
                            tool="shell", arguments={"cmd": ["ls", "-l"]}, reason="because",
                            status="pending", requested_at=1.0, expires_at=100.0)


@pytest.fixture(params=["sqlite", "postgres"])
def make_store(request, tmp_path) -> Callable[[str], StoreForTests]:
    """A new (unopened) store for a replica, on this test's one file or database."""
    if request.param == "sqlite":
        return lambda replica: SQLiteStore(tmp_path / "corral.db", replica=replica)
    url = request.getfixturevalue("postgres_url")
    return lambda replica: PostgresStore(url, replica=replica)


@pytest.fixture
async def store(make_store):
    """Replica r1's store, open."""
    s = make_store("r1")
    await s.open()
    yield s
    await s.close()


@pytest.fixture
async def other(make_store, store):
    """Replica r2's store on the same file or database, open."""
    s = make_store("r2")
    await s.open()
    yield s
    await s.close()


async def conversations(store: StoreForTests, *ids: str) -> None:
    for n, cid in enumerate(ids):
        await store.create_conversation(conversation(cid, created_at=float(n)))


class Inbox:
    """A `subscribe` handler that keeps every notice, and waits for one."""

    def __init__(self) -> None:
        self.notices: list[Notice] = []
        self._arrived = anyio.Event()

    def __call__(self, notice: Notice) -> None:
        self.notices.append(notice)
        self._arrived.set()

    async def wait_for(self, **fields: object) -> Notice:
        """The first notice (arrived or to come) with these fields."""
        with anyio.fail_after(10):
            while True:
                for notice in self.notices:
                    if all(notice.get(k) == v for k, v in fields.items()):
                        return notice
                self._arrived = anyio.Event()
                await self._arrived.wait()
