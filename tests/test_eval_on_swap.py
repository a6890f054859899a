"""`corral serve --eval-on-swap` (§12): an applied swap runs the affected Evals in the background.

The eval's case waits at a gate (a tool that returns once a file exists), so
the swap report is shown to come back while the run it started is still
running; opening the gate lets the run finish, announced by `eval.finished`.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.events import named, server_events
from tests.support.servers import corral_server
from tests.support.swaps import reload
from tests.support.trees import gated_definitions, open_gate, write_tree

pytestmark = pytest.mark.anyio


def evals_yaml(gate: Path, expected: str = "passed the gate") -> str:
    return f"""
        kind: Eval
        name: through-the-gate
        agent: gated
        cases:
          - name: waits
            input: wait {gate}
            expect: {{output: {{contains: {expected}}}, tools: [{{name: gate}}]}}
        ---
        kind: Eval
        name: queued-echo
        agent: queued
        cases:
          - name: echo
            input: hi
            expect: {{output: {{equals: "echo: hi"}}}}
        """


async def test_an_applied_swap_runs_the_affected_evals_without_delaying_its_report(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    defs = gated_definitions(tmp_path / "defs")
    write_tree(defs, {"evals.yaml": evals_yaml(gate)})
    agents = (defs / "agents.yaml").read_text()
    with anyio.fail_after(90), corral_server(defs, tmp_path / "state", eval_on_swap=True) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30, trust_env=False) as client, \
                server_events(client) as events:
            write_tree(defs, {"agents.yaml": agents.replace("Rejects a message", "Refuses a message")})
            report = await reload(client)
            started = await events.wait(named("eval.started"))
            new_digest = (await client.get("/v1/agents/gated")).json()["digest"]
            while_waiting = (await client.get(f"/v1/evals/runs/{started.data['run']['id']}")).json()
            open_gate(gate)
            finished = await events.wait(named("eval.finished"))
            quiet = (await client.get("/v1/evals/queued-echo/runs")).json()["items"]
            # an edited Eval runs too, on its agent's current digest
            write_tree(defs, {"evals.yaml": evals_yaml(gate, expected="the gate")})
            second = await reload(client)
            after_edit = await events.wait(named("eval.finished"), after=events.seen.index(finished) + 1)
            swapped_at = next(i for i, e in enumerate(events.seen) if e.name == "definitions.swapped")

    assert report["status"] == "applied" and second["status"] == "applied"
    assert started.data["run"]["eval"] == "through-the-gate"
    assert started.data["run"]["agent_digest"] == new_digest
    assert while_waiting["status"] == "running"  # the report came back while its eval still ran
    assert swapped_at < events.seen.index(started)
    first = finished.data["run"]
    assert first["status"] == "passed" and first["id"] == started.data["run"]["id"]
    assert quiet == []  # `queued` did not change: its eval did not run
    edited = after_edit.data["run"]
    assert (edited["eval"], edited["status"]) == ("through-the-gate", "passed")
    assert edited["eval_digest"] != first["eval_digest"]
