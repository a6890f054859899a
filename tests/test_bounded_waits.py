"""A bounded wait that runs out reaches the client as an answer of the error table, not a 500.

`POST …/interrupt` tells the running turn to stop and waits (10 s) for it to
end. Here the turn runs on replica `a`, which is paused (SIGSTOP) and so
cannot end it; replica `b` answers the interrupt 503 `overloaded` naming the
turn, which `/openapi.json` lists for the route. (The lease is long, so `b`
does not take the turn over meanwhile.)
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.support.events import named, read_events
from tests.support.postgres import PostgresServer
from tests.support.servers import ServerProcess
from tests.support.trees import gated_definitions, open_gate

pytestmark = pytest.mark.anyio


@pytest.fixture
def replicas(tmp_path: Path,
             postgres_server: PostgresServer) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    database = postgres_server.create_database()
    defs = gated_definitions(tmp_path / "defs")
    servers = [ServerProcess(defs, tmp_path / f"state-{name}", env={
        "CORRAL_DATABASE_URL": database, "CORRAL_LEASE_S": "300", "CORRAL_REPLICA_ID": name}).launch()
        for name in ("a", "b")]
    try:
        for server in servers:
            server.start(timeout_s=60)
        yield servers[0], servers[1]
    finally:
        for server in servers:
            with contextlib.suppress(ProcessLookupError, AssertionError):
                server.signal(signal.SIGCONT)
            server.kill()
        with contextlib.suppress(RuntimeError):
            postgres_server.drop_database(database)


def codes(operation: dict[str, Any]) -> set[str]:
    found: set[str] = set()
    for status, response in operation["responses"].items():
        if status != "default" and int(status) >= 400:
            found |= set(response["content"]["application/json"]["schema"]["allOf"][1]["properties"]
                         ["error"]["properties"]["code"]["enum"])
    return found


async def test_an_interrupt_the_turn_does_not_obey_in_time_is_a_503(
        tmp_path: Path, replicas: tuple[ServerProcess, ServerProcess]) -> None:
    a, b = replicas
    gate = tmp_path / "gate"
    async with httpx.AsyncClient(base_url=a.url, timeout=60, trust_env=False) as on_a, \
            httpx.AsyncClient(base_url=b.url, timeout=60, trust_env=False) as on_b, \
            anyio.create_task_group() as tasks:
        created = await on_a.post("/v1/conversations", json={"agent": "gated"})
        conversation = created.json()["id"]

        async def send() -> None:
            with contextlib.suppress(httpx.HTTPError):  # `a` is paused, then killed
                await on_a.post(f"/v1/conversations/{conversation}/messages",
                                json={"content": f"wait {gate}"})
        tasks.start_soon(send)
        with anyio.fail_after(30):
            events = await read_events(on_b, conversation, named("tool.started"))
        turn_id = events[0].data["turn_id"]
        a.signal(signal.SIGSTOP)  # the turn's replica can no longer end it
        with anyio.fail_after(60):
            interrupted = await on_b.post(f"/v1/conversations/{conversation}/interrupt")
        assert interrupted.status_code == 503, interrupted.text
        error = interrupted.json()["error"]
        assert error["code"] == "overloaded" and error["details"]["turn_id"] == turn_id, error
        assert "has not ended" in error["message"]

        paths = (await on_b.get("/openapi.json")).json()["paths"]
        assert "overloaded" in codes(paths["/v1/conversations/{id}/interrupt"]["post"])
        a.signal(signal.SIGCONT)
        open_gate(gate)
        tasks.cancel_scope.cancel()
