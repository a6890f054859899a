"""Gates (§12): every gate refusing a digest without passing evals, then allowing it once they passed.

`corral lock --evals` records the passing run of each Eval per agent (a failing one writes no lock);
`--require-evals` makes `lock --check` and `serve --locked` refuse a lock without them; an alias
with `require_evals` answers 409 `evals_required` for a move to a digest that has not passed.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.evals import STUBS, agent_yaml, eval_tree, run_eval
from tests.support.servers import ServerProcess, corral_server
from tests.support.swaps import reload
from tests.support.trees import write_atomic
from tests.test_eval_cli import corral

EVALS = f"""
    kind: Eval
    name: answers
    agent: clerk
    cases:
      - name: tool
        input: alpha
        {STUBS}
        expect: {{output: {{contains: "alpha:one"}}}}
    ---
    kind: Eval
    name: echoes
    agent: clerk
    cases:
      - name: echo
        input: hello
        expect: {{output: {{contains: hello}}}}
    """
FAILING = EVALS.replace("contains: hello", "contains: goodbye")


def test_lock_evals_records_passing_runs_and_require_evals_checks_them(tmp_path: Path) -> None:
    defs = eval_tree(tmp_path / "defs", FAILING)
    state = tmp_path / "state"
    failing = corral("lock", str(defs), "--evals", state=state)
    assert failing.returncode == 1 and "FAILED eval echoes" in failing.stdout
    assert "not written" in failing.stderr and not (defs / "corral.lock").exists()

    write_atomic(defs / "evals.yaml", EVALS)
    plain = corral("lock", str(defs), state=state)
    assert plain.returncode == 0 and "evals" not in json.loads((defs / "corral.lock").read_text())
    refused = corral("lock", str(defs), "--check", "--require-evals", state=state)
    assert refused.returncode == 1 and "no passing run of eval/answers" in refused.stdout
    assert corral("lock", str(defs), "--check", state=state).returncode == 0  # not required: fine
    serve_refused = corral("serve", str(defs), "--locked", "--require-evals", "--port", "0", state=state)
    assert serve_refused.returncode == 1 and "no passing run of eval/echoes" in serve_refused.stderr

    locked = corral("lock", str(defs), "--evals", state=state)
    assert locked.returncode == 0, locked.stdout + locked.stderr
    lock = json.loads((defs / "corral.lock").read_text())
    recorded = lock["evals"]["agent/clerk"]
    assert set(recorded) == {"eval/answers", "eval/echoes"}
    assert recorded["eval/answers"]["digest"] == lock["definitions"]["eval/answers"]
    assert recorded["eval/answers"]["score"] == 1.0 and recorded["eval/answers"]["run"].startswith("evalrun_")
    again = corral("lock", str(defs), "--evals", state=state)  # nothing missing: nothing runs again
    assert again.returncode == 0 and again.stdout.count("(recorded before)") == 2
    assert json.loads((defs / "corral.lock").read_text()) == lock
    checked = corral("lock", str(defs), "--check", "--require-evals", state=state)
    assert checked.returncode == 0, checked.stdout
    with ServerProcess(defs, state, args=("--no-watch", "--locked", "--require-evals")) as server:
        server.start()
        assert httpx.get(server.url + "/v1/agents/clerk", timeout=10).status_code == 200
        # a lock that loses its evals is refused by a swap too, as at start
        without = {k: v for k, v in lock.items() if k != "evals"}
        write_atomic(defs / "corral.lock", json.dumps(without, indent=2, sort_keys=True) + "\n")
        report = httpx.post(server.url + "/v1/definitions/reload", timeout=30).json()
        write_atomic(defs / "corral.lock", json.dumps(lock, indent=2, sort_keys=True) + "\n")
    assert report["status"] == "rejected"
    assert {e["code"] for e in report["errors"]} == {"evals_required"}
    assert {e["eval"] for e in report["errors"]} == {"answers", "echoes"}

    write_atomic(defs / "agent.yaml", agent_yaml(reply_prefix="v2 "))
    relocked = corral("lock", str(defs), state=state)  # the agent changed: its recorded runs no longer hold
    assert relocked.returncode == 0 and "evals" not in json.loads((defs / "corral.lock").read_text())
    stale = corral("lock", str(defs), "--check", state=state, env={"CORRAL_REQUIRE_EVALS": "1"})
    assert stale.returncode == 1 and "no passing run" in stale.stdout


@pytest.mark.anyio
async def test_an_alias_that_requires_evals_refuses_a_digest_without_them(tmp_path: Path) -> None:
    defs = eval_tree(tmp_path / "defs", FAILING)
    gated = {"require_evals": True}
    prod = "/v1/agents/clerk/aliases/prod"
    with anyio.fail_after(120), corral_server(defs, tmp_path / "state") as url:
        async with httpx.AsyncClient(base_url=url, timeout=60, trust_env=False) as client:
            v1 = (await client.get("/v1/agents/clerk")).json()["digest"]
            ungated = await client.put("/v1/agents/clerk/aliases/dev", json={"digest": v1})
            never = await client.put(prod, json={"digest": v1, **gated})
            await run_eval(client, "answers")
            await run_eval(client, "echoes")  # fails
            failed = await client.put(prod, json={"digest": v1, **gated})
            write_atomic(defs / "evals.yaml", EVALS)
            await reload(client)  # `echoes` has a new digest: the failed run was of the old one
            await run_eval(client, "echoes")
            allowed = await client.put(prod, json={"digest": v1, **gated})
            write_atomic(defs / "agent.yaml", agent_yaml(reply_prefix="v2 "))
            await reload(client)
            v2 = (await client.get("/v1/agents/clerk")).json()["digest"]
            moved = await client.put(prod, json={"digest": v2})  # the rule stays
            aliases = (await client.get("/v1/agents/clerk/aliases")).json()["items"]
            for name in ("answers", "echoes"):
                await run_eval(client, name)
            moved_after = await client.put(prod, json={"digest": v2})
            conversation = await client.post("/v1/conversations", json={"agent": "clerk@prod"})

    assert ungated.status_code == 200 and "require_evals" not in ungated.json()
    assert (never.status_code, never.json()["error"]["code"]) == (409, "evals_required")
    assert never.json()["error"]["details"]["missing"] == [
        {"eval": "answers", "eval_digest": never.json()["error"]["details"]["missing"][0]["eval_digest"],
         "status": None},
        {"eval": "echoes", "eval_digest": never.json()["error"]["details"]["missing"][1]["eval_digest"],
         "status": None}]
    assert failed.status_code == 409
    gaps = failed.json()["error"]["details"]["missing"]
    assert [(m["eval"], m["status"]) for m in gaps] == [("echoes", "failed")]
    assert allowed.status_code == 200 and allowed.json() == {"agent": "clerk", "alias": "prod", "digest": v1,
                                                             "require_evals": True, "canary": None}
    assert (moved.status_code, moved.json()["error"]["code"]) == (409, "evals_required")
    assert {a["alias"]: (a["digest"], a["require_evals"]) for a in aliases} == {"dev": (v1, False),
                                                                                "prod": (v1, True)}
    assert moved_after.status_code == 200 and moved_after.json()["digest"] == v2
    assert conversation.json()["digest"] == v2
