"""Eval runs over PostgreSQL with two replicas (§12): a run started on one is read, awaited and announced
(`eval.started`, `eval.finished` on `/v1/events`) on the other.

The case waits at a gate (a tool that returns once a file exists), so the run
is still running on replica `a` while the test reads it through `b`, then
holds a `?wait=S` read on `b` open while it opens the gate.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.events import named, server_events
from tests.support.postgres import PostgresServer
from tests.support.servers import ServerProcess
from tests.support.trees import gated_definitions, open_gate, write_tree

pytestmark = pytest.mark.anyio


def client_for(url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, timeout=60, trust_env=False)


async def test_a_run_started_on_one_replica_is_read_and_awaited_on_the_other(
        tmp_path: Path, postgres_server: PostgresServer) -> None:
    gate = tmp_path / "gate"
    defs = gated_definitions(tmp_path / "defs")
    write_tree(defs, {"evals.yaml": f"""
        kind: Eval
        name: gate
        agent: gated
        cases:
          - name: waits
            input: wait {gate}
            expect: {{output: {{equals: passed the gate}}}}
        """})
    database = postgres_server.create_database()
    env = {"CORRAL_DATABASE_URL": database}
    try:
        with ServerProcess(defs, tmp_path / "a", env={**env, "CORRAL_REPLICA_ID": "a"}) as a, \
                ServerProcess(defs, tmp_path / "b", env={**env, "CORRAL_REPLICA_ID": "b"}) as b:
            a.start(timeout_s=60)
            b.start(timeout_s=60)
            with anyio.fail_after(90):
                async with client_for(a.url) as on_a, client_for(b.url) as on_b, \
                        server_events(on_b) as events_on_b:
                    started = (await on_a.post("/v1/evals/gate/runs", json={})).json()
                    announced = await events_on_b.wait(named("eval.started"))
                    read_on_b = (await on_b.get(f"/v1/evals/runs/{started['id']}")).json()
                    listed_on_b = (await on_b.get("/v1/evals/gate/runs")).json()["items"]
                    async with anyio.create_task_group() as tg:
                        awaited: list[dict] = []

                        async def wait_on_b() -> None:
                            while not awaited or awaited[-1]["status"] == "running":
                                r = await on_b.get(f"/v1/evals/runs/{started['id']}", params={"wait": 30})
                                awaited.append(r.json())

                        tg.start_soon(wait_on_b)
                        open_gate(gate)
                    on_a_after = (await on_a.get(f"/v1/evals/runs/{started['id']}")).json()
                    finished_on_b = await events_on_b.wait(named("eval.finished"))
                    agent_on_b = (await on_b.get("/v1/agents/gated/evals")).json()
    finally:
        postgres_server.drop_database(database)

    assert read_on_b["status"] == "running" and read_on_b["id"] == started["id"]
    assert announced.data["run"]["id"] == started["id"] and finished_on_b.data["run"] == on_a_after
    assert [r["id"] for r in listed_on_b] == [started["id"]]
    assert awaited[-1]["status"] == "passed" and awaited[-1] == on_a_after
    assert {e["name"]: e["passed"] for e in agent_on_b["items"]} == {"gate": True}
