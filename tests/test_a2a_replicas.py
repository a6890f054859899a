"""A2A over two PostgreSQL replicas behind the tested nginx config (CONTRACT §14, §9): a task is a turn
in the shared store, so a task started through one replica is read, rejoined and cancelled through
the other, and the card and endpoint served through nginx name the proxy's own address.

The gated tree of tests.support.trees: "wait PATH" blocks in the `gate` tool until PATH exists (a
gate never opened holds the task running); any other message is echoed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import aclosing
from pathlib import Path

import anyio
import httpx
import pytest
from a2a.client import Client, ClientConfig, create_client
from a2a.helpers import get_artifact_text, new_text_message
from a2a.types.a2a_pb2 import (
    ROLE_USER,
    TASK_STATE_CANCELED,
    TASK_STATE_COMPLETED,
    TASK_STATE_WORKING,
    CancelTaskRequest,
    GetTaskRequest,
    SendMessageConfiguration,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
)

from tests.support.nginx import NginxProxy
from tests.support.postgres import PostgresServer
from tests.support.servers import ServerProcess
from tests.support.trees import gated_definitions, open_gate

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory,
         postgres_server: PostgresServer) -> Iterator[list[ServerProcess]]:
    root = tmp_path_factory.mktemp("a2a-replicas")
    defs = gated_definitions(root / "defs")
    database = postgres_server.create_database()
    servers = [ServerProcess(defs, root / f"state-{name}", env={
        "CORRAL_DATABASE_URL": database, "CORRAL_REPLICA_ID": name}).launch() for name in ("a", "b")]
    try:
        for server in servers:
            server.start(timeout_s=60)
        yield servers
    finally:
        for server in servers:
            server.kill()
        postgres_server.drop_database(database)


async def client_of(http: httpx.AsyncClient, base: str, *, streaming: bool = False) -> Client:
    config = ClientConfig(httpx_client=http, streaming=streaming)
    return await create_client(f"{base}/a2a/gated", client_config=config)


async def send(client: Client, text: str, *, now: bool = False) -> Task:
    request = SendMessageRequest(message=new_text_message(text, role=ROLE_USER))
    if now:
        request.configuration.CopyFrom(SendMessageConfiguration(return_immediately=True))
    (response,) = [r async for r in client.send_message(request)]
    return response.task


async def test_a_task_started_through_one_replica_is_read_and_cancelled_through_the_other(
        pair: list[ServerProcess], tmp_path: Path) -> None:
    a, b = pair
    async with httpx.AsyncClient(timeout=60, trust_env=False) as http:
        on_a, on_b = await client_of(http, a.url), await client_of(http, b.url)
        task = await send(on_a, f"wait {tmp_path / 'never'}", now=True)
        assert task.status.state == TASK_STATE_WORKING
        read = await on_b.get_task(GetTaskRequest(id=task.id))
        assert read.status.state == TASK_STATE_WORKING and read.context_id == task.context_id
        with anyio.fail_after(30):  # b rejoins a's running task: its first event is the task itself
            streaming = await client_of(http, b.url, streaming=True)
            async with aclosing(streaming.subscribe(SubscribeToTaskRequest(id=task.id))) as events:
                first = await anext(events)
            assert first.task.id == task.id and first.task.status.state == TASK_STATE_WORKING
        cancelled = await on_b.cancel_task(CancelTaskRequest(id=task.id))
        assert cancelled.status.state == TASK_STATE_CANCELED
        assert (await on_a.get_task(GetTaskRequest(id=task.id))).status.state == TASK_STATE_CANCELED
        done = await send(on_b, "hello")  # completed on b, read on a
        read = await on_a.get_task(GetTaskRequest(id=done.id))
        assert read.status.state == TASK_STATE_COMPLETED
        assert get_artifact_text(read.artifacts[0]) == "echo: hello"


async def test_a2a_through_nginx_in_front_of_the_two_replicas(pair: list[ServerProcess],
                                                              tmp_path: Path) -> None:
    with NginxProxy([s.url for s in pair]) as proxy:
        async with httpx.AsyncClient(timeout=60, trust_env=False) as http:
            card = (await http.get(f"{proxy.url}/a2a/gated/.well-known/agent-card.json")).json()
            assert {i["url"] for i in card["supportedInterfaces"]} == {f"{proxy.url}/a2a/gated"}
            client = await client_of(http, proxy.url)  # every call goes to whichever replica nginx picks
            task = await send(client, f"wait {tmp_path / 'never'}", now=True)
            states = [(await client.get_task(GetTaskRequest(id=task.id))).status.state for _ in range(4)]
            assert states == [TASK_STATE_WORKING] * 4
            cancelled = await client.cancel_task(CancelTaskRequest(id=task.id))
            assert cancelled.status.state == TASK_STATE_CANCELED
            answered = await send(client, "through the proxy")
            assert get_artifact_text(answered.artifacts[0]) == "echo: through the proxy"
        served = proxy.served_by()
    assert set(served) == {s.url.removeprefix("http://") for s in pair}, proxy.access_log()


async def test_a_subscription_on_one_replica_follows_a_task_running_on_the_other_to_its_end(
        pair: list[ServerProcess], tmp_path: Path) -> None:
    a, b = pair
    gate = tmp_path / "gate"
    async with httpx.AsyncClient(timeout=60, trust_env=False) as http:
        task = await send(await client_of(http, a.url), f"wait {gate}", now=True)
        seen = []
        with anyio.fail_after(30):
            async for event in (await client_of(http, b.url, streaming=True)).subscribe(
                    SubscribeToTaskRequest(id=task.id)):
                seen.append(event)
                if len(seen) == 1:
                    open_gate(gate)  # the turn goes on, on a; b's stream sees it through the store
    assert seen[-1].status_update.status.state == TASK_STATE_COMPLETED
    answers = [get_artifact_text(e.artifact_update.artifact) for e in seen if e.HasField("artifact_update")]
    assert answers[-1] == "passed the gate"
