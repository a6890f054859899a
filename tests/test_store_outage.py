"""A short outage of the store fails no turn (§7): a PostgreSQL restart within `CORRAL_STORAGE_GRACE_S`.

The restart is real: the test's own PostgreSQL server is stopped (fast
shutdown: every connection is cut) and started again on the same port. Four
turns are held in their tool at a gate while the server goes down; the gate
opens, so each tool's result is written while the store cannot be reached;
the server comes back once a turn's write has failed (the replica says it
retries it). Every turn
completes, and every tool result is in its transcript.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.client import Conversation
from tests.support.postgres import PostgresServer, PostgresUnavailable, unavailable
from tests.support.processes import wait_until
from tests.support.servers import ServerProcess
from tests.support.trees import gated_definitions, open_gate

pytestmark = pytest.mark.anyio
TURNS = 4


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server of this test's own, which it may stop and start."""
    try:
        server = PostgresServer()
    except PostgresUnavailable as exc:
        unavailable(str(exc))
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def test_a_postgres_restart_within_the_grace_fails_no_turn(tmp_path: Path,
                                                                 own_postgres: PostgresServer) -> None:
    defs, gate = gated_definitions(tmp_path / "defs"), tmp_path / "gate"
    env = {"CORRAL_DATABASE_URL": own_postgres.create_database(), "CORRAL_STORAGE_GRACE_S": "60"}
    with ServerProcess(defs, tmp_path / "state", env=env) as server, anyio.fail_after(120):
        async with httpx.AsyncClient(base_url=server.url, timeout=90, trust_env=False) as client:
            conversations = [await Conversation.create(client, "gated") for _ in range(TURNS)]
            async with anyio.create_task_group() as tg:
                for conversation in conversations:
                    tg.start_soon(conversation.send, f"wait {gate}")
                for conversation in conversations:
                    await conversation.started()  # in its tool
                await anyio.to_thread.run_sync(own_postgres.halt)
                open_gate(gate)  # the tools end; their results cannot be written now
                # a turn's write failed: it says it retries (or, without the grace, a turn failed)
                await wait_until(lambda: "the store is unreachable" in server.stderr
                                 or any(c.replies for c in conversations), bound=60)
                await anyio.to_thread.run_sync(own_postgres.resume)
            for conversation in conversations:
                [reply] = conversation.replies
                assert reply.status_code == 200, reply.text
                body = reply.json()
                assert (body["status"], body["output"]) == ("completed", "passed the gate"), body
                results = [m for m in await conversation.messages() if m["role"] == "tool"]
                assert [m["content"].strip() for m in results] == ["open"], results
        assert server.proc is not None and server.proc.poll() is None
