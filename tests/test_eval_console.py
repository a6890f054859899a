"""Eval results in the console (§11, §12), in a real headless Chromium against a real Corral.

An agent's page shows each of its Evals on the shown digest (not run, then
passed once run from the page); a swap with `--eval-on-swap` shows its runs
beside it in the live feed; the diff of two digests shows the evals of both (the edit makes the eval fail);
an alias's canary shows with its sides, and Promote moves the alias to it.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.browser import Watch, chromium, need_chromium
from tests.support.evals import STUBS, agent_yaml, eval_tree
from tests.support.servers import corral_server
from tests.support.swaps import reload
from tests.support.trees import write_atomic

pytestmark = pytest.mark.anyio

EVALS = f"""
    kind: Eval
    name: answers
    agent: clerk
    cases:
      - name: tool
        input: alpha
        {STUBS}
        expect: {{output: {{equals: "alpha:one"}}}}
    """


async def test_the_console_shows_eval_results_beside_each_digest(tmp_path: Path) -> None:
    need_chromium()
    from playwright.async_api import expect

    defs = eval_tree(tmp_path / "defs", EVALS)
    with corral_server(defs, tmp_path / "state", eval_on_swap=True) as url:
        async with chromium(tmp_path) as browser, \
                httpx.AsyncClient(base_url=url, timeout=30, trust_env=False) as client:
            page = await browser.new_page()
            seen = Watch(page)
            with anyio.fail_after(60):
                await page.goto(url + "/console#/agent/clerk")
                evals = page.get_by_role("region", name="Evals")
                await expect(evals.get_by_role("row").filter(has_text="answers")).to_contain_text("not run")
                await evals.get_by_role("button", name="Run answers").click()
                await expect(evals.get_by_role("row").filter(has_text="answers")).to_contain_text("passed")

                write_atomic(defs / "agent.yaml", agent_yaml(reply_prefix="v2 "))
                report = await reload(client)
                assert report["status"] == "applied"
                live = page.get_by_role("complementary", name="Live")
                swap = live.get_by_role("listitem").filter(has_text="applied").first
                runs = swap.get_by_role("list", name="Eval runs")
                await expect(runs).to_contain_text("answers")
                await expect(runs).to_contain_text("failed")  # v2 answers "v2 alpha:one"
                await page.reload()  # a fresh page reads the results of the swaps it lists
                swap = live.get_by_role("listitem").filter(has_text="applied").first
                await expect(swap.get_by_role("list", name="Eval runs")).to_contain_text("failed")

                # the agent page (re-rendered by the run's end) and its diff: before passed, after failed
                await expect(evals.get_by_role("row").filter(has_text="answers")).to_contain_text("failed")
                compared = page.get_by_role("region", name="Compare digests")
                table = compared.locator(".evals-diff table")
                await expect(table.get_by_role("row").filter(has_text="answers")).to_contain_text("passed")
                await expect(table.get_by_role("row").filter(has_text="answers")).to_contain_text("failed")

                # a canary on @prod: shown with its sides; Promote moves the alias to it
                v1 = next(c["from"] for c in report["changes"] if c["kind"] == "Agent")
                v2 = next(c["to"] for c in report["changes"] if c["kind"] == "Agent")
                put = await client.put("/v1/agents/clerk/aliases/prod",
                                       json={"digest": v1, "canary": {"digest": v2, "weight": 0.5}})
                assert put.status_code == 200, put.text
                await page.goto(url + "/console#/agent/clerk@" + v1)
                aliases = page.get_by_role("region", name="Aliases")
                canary = aliases.get_by_label("Canary of prod", exact=True)
                await expect(canary).to_contain_text("canary 50%")
                await expect(canary.get_by_title(v2)).to_be_visible()
                await canary.get_by_role("button", name="Promote the canary of prod").click()
                await expect(aliases.get_by_label("Canary of prod", exact=True)).to_have_count(0)
                prod = aliases.get_by_role("row").filter(has_text="@prod")
                await expect(prod.get_by_title(v2)).to_be_visible()
    assert seen.errors == []
    assert seen.hosts() == {url.removeprefix("http://")}
