"""Canaries (§12): an alias sends a share of its new conversations to another digest, each pinned to its side.

Weight 1 sends every new conversation to the canary, weight 0 none; each
stays on what it drew when the alias or its canary moves. The listing counts
each side's conversations and turns; promote moves the alias (gated by
`require_evals` like any move); ending the canary leaves the alias as it was.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.client import Conversation
from tests.support.evals import agent_yaml, eval_tree, run_eval
from tests.support.servers import corral_server
from tests.support.swaps import reload
from tests.support.trees import write_atomic

pytestmark = pytest.mark.anyio

EVALS = """
    kind: Eval
    name: echoes
    agent: clerk
    cases:
      - name: echo
        input: hello
        expect: {output: {contains: hello}}
    """
NEVER_SERVED = "sha256:" + "0" * 64


async def test_a_canary_at_weight_one_and_zero_then_promoted_and_ended(tmp_path: Path) -> None:
    defs = eval_tree(tmp_path / "defs", EVALS)
    prod = "/v1/agents/clerk/aliases/prod"
    with anyio.fail_after(120), corral_server(defs, tmp_path / "state") as url:
        async with httpx.AsyncClient(base_url=url, timeout=60, trust_env=False) as client:
            v1 = (await client.get("/v1/agents/clerk")).json()["digest"]
            write_atomic(defs / "agent.yaml", agent_yaml(reply_prefix="v2 "))
            await reload(client)
            v2 = (await client.get("/v1/agents/clerk")).json()["digest"]

            put = await client.put(prod, json={"digest": v1, "canary": {"digest": v2, "weight": 1}})
            on_canary = [await Conversation.create(client, "clerk@prod") for _ in range(3)]
            canary_answers = [(await c.say("hello"))["output"] for c in on_canary]
            await client.put(prod, json={"digest": v1, "canary": {"digest": v2, "weight": 0}})
            on_stable = [await Conversation.create(client, "clerk@prod") for _ in range(2)]
            stable_answers = [(await c.say("hello"))["output"] for c in on_stable]
            listed = (await client.get("/v1/agents/clerk/aliases")).json()["items"]
            # the canary side keeps its digest whatever the alias does next
            await client.put(prod, json={"digest": v1, "canary": {"digest": v1, "weight": 1}})
            still = (await on_canary[0].say("again"))["output"]

            await run_eval(client, "echoes", agent=f"clerk@{v1}")  # the gate holds for the alias's digest
            gating = await client.put(prod, json={"digest": v1, "canary": {"digest": v2, "weight": 0.5},
                                                  "require_evals": True})
            gated = await client.post(f"{prod}/promote")  # the canary has no passing run yet
            await run_eval(client, "echoes", agent=f"clerk@{v2}")
            promoted = await client.post(f"{prod}/promote")
            after = await Conversation.create(client, "clerk@prod")
            twice = await client.post(f"{prod}/promote")

            await client.put(prod, json={"digest": v2, "canary": {"digest": v1, "weight": 1}})
            ended = await client.delete(f"{prod}/canary")
            ended_again = await client.delete(f"{prod}/canary")
            plain = await Conversation.create(client, "clerk@prod")
            await client.put(prod, json={"digest": v2, "canary": {"digest": v1, "weight": 1}})
            await client.delete(prod)
            recreated = await client.put(prod, json={"digest": v2})
            fresh = await Conversation.create(client, "clerk@prod")
            too_heavy = await client.put(prod, json={"digest": v2, "canary": {"digest": v1, "weight": 1.5}})
            unknown = await client.put(prod, json={"digest": v2,
                                                   "canary": {"digest": NEVER_SERVED, "weight": 1}})

    assert put.status_code == 200 and put.json()["canary"] == {"digest": v2, "weight": 1}
    assert {(c.created["digest"], c.created["pinned"]) for c in on_canary} == {(v2, True)}
    assert canary_answers == ["v2 hello"] * 3
    assert {c.created["digest"] for c in on_stable} == {v1} and stable_answers == ["hello"] * 2
    [alias] = listed
    assert alias["canary"] == {"digest": v2, "weight": 0}
    assert alias["sides"] == {
        "stable": {"digest": v1, "conversations": 2, "turns_completed": 2, "turns_failed": 0},
        "canary": {"digest": v2, "conversations": 3, "turns_completed": 3, "turns_failed": 0}}
    assert still == "v2 again"
    assert gating.status_code == 200, gating.text
    assert (gated.status_code, gated.json()["error"]["code"]) == (409, "evals_required")
    assert promoted.status_code == 200, promoted.text
    assert (promoted.json()["digest"], promoted.json()["canary"]) == (v2, None)
    assert after.created["digest"] == v2
    assert (twice.status_code, twice.json()["error"]["code"]) == (409, "conflict")
    assert ended.status_code == 204 and ended_again.status_code == 404
    assert plain.created["digest"] == v2
    assert recreated.json()["canary"] is None and recreated.json()["require_evals"] is True
    assert fresh.created["digest"] == v2  # the deleted alias's canary ended with it
    assert (too_heavy.status_code, too_heavy.json()["error"]["code"]) == (400, "invalid_request")
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "digest_not_found")
