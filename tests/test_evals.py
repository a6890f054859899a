"""Evals (§12): every expectation kind passing and failing, on a real server with designed outcomes.

The agent and the judge run on the offline `scripted` model (see
`tests.support.evals`), so each case's outcome is known in advance: each
order rule is shown by a case only it tells apart; tools given results in a
case never run (a marker file they would create never appears).
"""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.evals import MARKER, STUBS, agent_yaml, by_case, eval_tree, run_eval
from tests.support.events import named, server_events
from tests.support.servers import ServerProcess, corral_server
from tests.support.swaps import reload
from tests.support.trees import gated_definitions, open_gate, write_atomic, write_tree

pytestmark = pytest.mark.anyio

EXPECTATIONS = f"""
    kind: Eval
    name: expectations
    agent: clerk
    judge: judge
    threshold: 0
    cases:
      - name: any-order-passes
        input: [alpha, beta]
        {STUBS}
        expect: {{tools: [{{name: beta}}, {{name: alpha}}]}}
      - name: in-order-fails
        input: [alpha, beta]
        {STUBS}
        expect: {{tools: [{{name: beta}}, {{name: alpha}}], tools_order: in_order}}
      - name: in-order-with-gaps-passes
        input: [alpha, gamma, beta]
        {STUBS}
        expect: {{tools: [{{name: alpha}}, {{name: beta}}], tools_order: in_order}}
      - name: exact-with-gaps-fails
        input: [alpha, gamma, beta]
        {STUBS}
        expect: {{tools: [{{name: alpha}}, {{name: beta}}], tools_order: exact}}
      - name: exact-passes
        input: [alpha, gamma, beta]
        {STUBS}
        expect: {{tools: [{{name: alpha}}, {{name: gamma}}, {{name: beta}}], tools_order: exact}}
      - name: input-matches
        input: alpha
        {STUBS}
        expect: {{tools: [{{name: alpha, input: {{x: 1}}}}]}}
      - name: input-differs
        input: alpha
        {STUBS}
        expect: {{tools: [{{name: alpha, input: {{x: 2}}}}]}}
      - name: no-tools-fails
        input: alpha
        {STUBS}
        expect: {{no_tools: [alpha]}}
      - name: no-tools-passes
        input: hello
        expect: {{no_tools: [alpha, beta]}}
      - name: output-passes
        input: alpha
        {STUBS}
        expect:
          output: {{contains: [alpha, one], not_contains: two, matches: "^alpha:o", equals: "alpha:one"}}
      - name: output-fails
        input: alpha
        {STUBS}
        expect:
          output: {{contains: two, not_contains: [one], matches: "^beta", equals: "x"}}
      - name: schema-passes
        input: '{{"n": 1}}'
        expect: {{output: {{schema: {{type: object, required: [n]}}}}}}
      - name: schema-fails
        input: '{{"m": 1}}'
        expect: {{output: {{schema: {{type: object, required: [n]}}}}}}
      - name: not-json-fails
        input: plain words
        expect: {{output: {{schema: {{type: object}}}}}}
      - name: rubric-passes
        input: a good answer
        expect: {{rubric: the answer is good}}
      - name: rubric-fails
        input: a bad answer
        expect: {{rubric: the answer is good}}
      - name: judge-garbled
        input: garbled
        expect: {{rubric: the answer is good}}
      - name: steps-within
        input: alpha
        {STUBS}
        expect: {{max_steps: 2, max_tokens: 10000}}
      - name: steps-over
        input: alpha
        {STUBS}
        expect: {{max_steps: 1}}
      - name: tokens-over
        input: alpha
        {STUBS}
        expect: {{max_tokens: 1}}
    """

PASSING = {"any-order-passes", "in-order-with-gaps-passes", "exact-passes", "input-matches",
           "no-tools-passes", "output-passes", "schema-passes", "rubric-passes", "steps-within"}


def client_for(url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, timeout=60, trust_env=False)


async def test_each_expectation_passes_and_fails_as_designed(tmp_path: Path) -> None:
    defs = eval_tree(tmp_path / "defs", EXPECTATIONS)
    with anyio.fail_after(120), corral_server(defs, tmp_path / "state") as url:
        async with client_for(url) as client, server_events(client) as events:
            run = await run_eval(client, "expectations")
            started = await events.wait(named("eval.started"))
            finished = await events.wait(named("eval.finished"))
            agent = (await client.get("/v1/agents/clerk")).json()
            conversation_ids = [i for c in run["cases"] for i in c["conversation_ids"]]
            conversations = [(await client.get(f"/v1/conversations/{i}")).json() for i in conversation_ids]
            listed = (await client.get("/v1/conversations")).json()["items"]

    cases = by_case(run)
    assert {name for name, c in cases.items() if c["passed"]} == PASSING
    assert len(cases) == 20 and run["score"] == pytest.approx(len(PASSING) / 20)
    assert run["status"] == "passed"  # threshold 0
    assert (run["eval"], run["agent"], run["agent_digest"]) == ("expectations", "clerk", agent["digest"])
    assert run["eval_digest"].startswith("sha256:") and run["ended_at"] and run["started_at"]
    assert run["usage"]["input_tokens"] > 0 and run["usage"]["output_tokens"] > 0
    failures = {name: " | ".join(c["failures"]) for name, c in cases.items()}
    assert "in order" in failures["in-order-fails"] and "made: alpha" in failures["in-order-fails"]
    assert "exact" in failures["exact-with-gaps-fails"]
    assert '"x": 2' in failures["input-differs"]
    assert failures["no-tools-fails"] == "called alpha, which must never be called"
    assert len(cases["output-fails"]["failures"]) == 4
    assert "does not satisfy the schema" in failures["schema-fails"]
    assert "not JSON" in failures["not-json-fails"]
    assert failures["rubric-fails"] == "rubric not met: the answer is bad"
    assert "the judge did not answer" in failures["judge-garbled"]
    assert "I think it passes" in failures["judge-garbled"]
    assert "max_steps 1" in failures["steps-over"] and "max_tokens 1" in failures["tokens-over"]
    # each case in a fresh conversation, on the exact digest, archived, marked
    assert len(set(conversation_ids)) == sum(len(c["conversation_ids"]) for c in run["cases"]) == 20
    shown = {(c["digest"], c["pinned"], c["archived"]) for c in conversations}
    assert shown == {(agent["digest"], True, True)}
    marks = {c["metadata"]["corral_eval"]["case"] for c in conversations}
    assert marks == set(cases)
    assert {c["metadata"]["corral_eval"]["run_id"] for c in conversations} == {run["id"]}
    assert not {c["id"] for c in listed} & set(conversation_ids)  # archived: out of the everyday list
    # no tool ran: their results were given
    assert not (tmp_path / MARKER).exists()
    assert started.data["run"]["id"] == finished.data["run"]["id"] == run["id"]
    assert started.data["run"]["status"] == "running" and finished.data["run"] == run


THRESHOLD_AND_REPEAT = f"""
    kind: Eval
    name: half
    agent: clerk
    threshold: 0.5
    repeat: 3
    max_concurrency: 2
    cases:
      - name: passes
        input: alpha
        {STUBS}
        expect: {{output: {{equals: "alpha:one"}}}}
      - name: fails
        input: beta
        {STUBS}
        expect: {{output: {{equals: "nope"}}}}
    ---
    kind: Eval
    name: strict
    agent: clerk
    threshold: 0.6
    cases:
      - name: passes
        input: alpha
        {STUBS}
        expect: {{output: {{equals: "alpha:one"}}}}
      - name: fails
        input: beta
        {STUBS}
        expect: {{output: {{equals: "nope"}}}}
    """


async def test_threshold_and_repeat(tmp_path: Path) -> None:
    defs = eval_tree(tmp_path / "defs", THRESHOLD_AND_REPEAT)
    with anyio.fail_after(120), corral_server(defs, tmp_path / "state") as url:
        async with client_for(url) as client:
            half = await run_eval(client, "half")
            strict = await run_eval(client, "strict")
            stored = (await client.get(f"/v1/evals/runs/{half['id']}")).json()

    assert (half["status"], half["score"], half["threshold"]) == ("passed", 0.5, 0.5)
    assert (strict["status"], strict["score"], strict["threshold"]) == ("failed", 0.5, 0.6)
    repeated = by_case(half)
    assert [len(c["conversation_ids"]) for c in repeated.values()] == [3, 3]
    assert repeated["fails"]["failures"][0].startswith("run 1: ") and len(repeated["fails"]["failures"]) == 3
    single = by_case(strict)["passes"]["usage"]
    assert repeated["passes"]["usage"]["output_tokens"] == 3 * single["output_tokens"]
    assert stored == half  # stored as it ended


UNREACHABLE = """
    kind: Model
    name: gone
    provider: openai
    model: gpt-x
    base_url: http://127.0.0.1:9/v1
    api_key: ${NO_SUCH_KEY}
    retries: 0
    timeout_s: 5
    ---
    kind: Agent
    name: remote
    model: gone
    ---
    kind: Eval
    name: unjudged
    agent: remote
    cases:
      - name: hello
        input: hello
        expect: {output: {contains: hello}}
    """


async def test_a_model_that_cannot_be_reached_is_an_error_not_a_failure(tmp_path: Path) -> None:
    defs = eval_tree(tmp_path / "defs", UNREACHABLE)
    with anyio.fail_after(120), corral_server(defs, tmp_path / "state") as url:
        async with client_for(url) as client:
            run = await run_eval(client, "unjudged")
            listed = (await client.get("/v1/evals")).json()["items"]

    assert run["status"] == "error" and run["score"] == 0
    [case] = run["cases"]
    assert not case["passed"] and case["failures"][0].startswith("could not be judged: model_error")
    assert {e["name"]: e["passed"] for e in listed} == {"unjudged": False}


async def test_bad_requests_are_clear(tmp_path: Path) -> None:
    defs = eval_tree(tmp_path / "defs", THRESHOLD_AND_REPEAT)
    with anyio.fail_after(60), corral_server(defs, tmp_path / "state") as url:
        async with client_for(url) as client:
            missing = await client.post("/v1/evals/nope/runs", json={})
            other_agent = await client.post("/v1/evals/half/runs", json={"agent": "someone"})
            never = await client.post("/v1/evals/half/runs", json={"agent": "clerk@sha256:" + "0" * 64})
            unknown_field = await client.post("/v1/evals/half/runs", json={"agnt": "clerk"})
            no_run = await client.get("/v1/evals/runs/evalrun_nope")
            bad_wait = await client.get("/v1/evals/runs/evalrun_nope", params={"wait": "forever"})

    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "not_found")
    assert (other_agent.status_code, other_agent.json()["error"]["code"]) == (400, "invalid_request")
    assert (never.status_code, never.json()["error"]["code"]) == (404, "digest_not_found")
    assert (unknown_field.status_code, unknown_field.json()["error"]["code"]) == (400, "invalid_request")
    assert (no_run.status_code, no_run.json()["error"]["code"]) == (404, "not_found")
    assert (bad_wait.status_code, bad_wait.json()["error"]["code"]) == (400, "invalid_request")


async def test_an_edit_leaves_the_new_digest_unevaluated_and_the_old_result_readable_by_its_pin(
        tmp_path: Path) -> None:
    defs = eval_tree(tmp_path / "defs", THRESHOLD_AND_REPEAT)
    with anyio.fail_after(120), corral_server(defs, tmp_path / "state") as url:
        async with client_for(url) as client:
            run = await run_eval(client, "strict")
            old = run["agent_digest"]
            before = (await client.get("/v1/agents/clerk/evals")).json()
            write_atomic(defs / "agent.yaml", agent_yaml(reply_prefix="v2 "))
            report = await reload(client)
            after = (await client.get("/v1/agents/clerk/evals")).json()
            pinned = (await client.get(f"/v1/agents/clerk@{old}/evals")).json()
            runs_of_old = (await client.get("/v1/evals/strict/runs", params={"agent": f"clerk@{old}"})).json()
            runs_of_new = (await client.get("/v1/evals/strict/runs", params={"agent": "clerk"})).json()
            listed = {e["name"]: e for e in (await client.get("/v1/evals")).json()["items"]}

    assert report["status"] == "applied"
    changed = {(c["kind"], c["name"]) for c in report["changes"]}
    assert {("Agent", "clerk"), ("Model", "clerk-model")} <= changed
    assert not any(c["kind"] == "Eval" for c in report["changes"])  # its digest does not cover the agent
    assert {e["name"]: e["passed"] for e in before["items"]} == {"half": None, "strict": False}
    assert after["digest"] != old and {e["name"]: e["passed"] for e in after["items"]} == {"half": None,
                                                                                           "strict": None}
    assert pinned["digest"] == old and {e["name"]: e["passed"] for e in pinned["items"]}["strict"] is False
    assert [r["id"] for r in runs_of_old["items"]] == [run["id"]] and runs_of_new["items"] == []
    assert listed["strict"]["latest_run"] is None and listed["strict"]["agent"] == "clerk"


async def test_a_run_cut_off_by_a_stop_ends_as_an_error_at_the_next_start(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    defs = gated_definitions(tmp_path / "defs")
    write_tree(defs, {"evals.yaml": f"""
        kind: Eval
        name: gate
        agent: gated
        cases:
          - name: waits
            input: wait {gate}
        """})
    try:
        with anyio.fail_after(90):
            with ServerProcess(defs, tmp_path / "state") as server:
                server.start()
                async with client_for(server.url) as client:
                    started = (await client.post("/v1/evals/gate/runs", json={})).json()
                server.kill()
            with ServerProcess(defs, tmp_path / "state") as server:
                server.start()
                async with client_for(server.url) as client:
                    after = (await client.get(f"/v1/evals/runs/{started['id']}")).json()
    finally:
        open_gate(gate)  # the killed server's gate tool, left waiting, ends
    assert started["status"] == "running"
    assert after["status"] == "error" and after["ended_at"] is not None


ASKING = """
    kind: Model
    name: deployer-model
    provider: scripted
    script:
      - when: "^deploy (?P<target>\\\\w+)"
        tool_call: {name: deploy, arguments: {target: "{target}"}}
        reply: "deploy says: {tool_result}"
    ---
    kind: Tool
    name: deploy
    permission: ask
    input_schema: {type: object, properties: {target: {type: string}}, required: [target]}
    command: {argv: [sh, -c, "touch MARKER; echo deployed {target}"]}
    ---
    kind: Agent
    name: deployer
    model: deployer-model
    tools: [deploy]
    ---
    kind: Eval
    name: deploys
    agent: deployer
    cases:
      - name: prod
        input: deploy prod
        tool_results: {deploy: "queued prod"}
        expect:
          tools: [{name: deploy, input: {target: prod}}]
          output: {equals: "deploy says: queued prod"}
    """


async def test_a_tool_that_asks_a_person_asks_no_one_when_its_result_is_given(tmp_path: Path) -> None:
    marker = tmp_path / "deploy.marker"
    defs = write_tree(tmp_path / "defs", {"deployer.yaml": ASKING.replace("MARKER", str(marker))})
    with anyio.fail_after(60), corral_server(defs, tmp_path / "state") as url:
        async with client_for(url) as client:
            run = await run_eval(client, "deploys")
            [conversation_id] = run["cases"][0]["conversation_ids"]
            asked = (await client.get(f"/v1/conversations/{conversation_id}/permissions")).json()["items"]
    assert run["status"] == "passed", run
    assert asked == [] and not marker.exists()
