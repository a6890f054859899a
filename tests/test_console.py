"""The web console (§11), in a real headless Chromium against a real Corral on loopback.

One watching server, one page, never reloaded: agents and digests shown, a
chat answered with its tool call, an edit landing as a new digest, a broken
file shown by file and line and cleared by the fix, a swap that finds a turn
waiting on `ask` listing it as busy, and the Allow button letting that turn
finish. With API keys, the page asks for one, keeps it in session storage
only and sends it as `Authorization: Bearer`. Every request the page makes
goes to the server it came from. The screenshot lands in the test's tmp dir,
and in docs/console.png (the README's) when that is missing or
CORRAL_UPDATE_SCREENSHOT=1 asks.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.browser import Watch, chromium, need_chromium
from tests.support.servers import REPO, corral_server
from tests.support.swaps import reload, swaps, watcher_live
from tests.support.trees import agent_digest, line_of, write_atomic, write_tree

pytestmark = pytest.mark.anyio
KEY = "k-console-7d2e91"
SCRIPT = [
    {"when": "^time in (?P<zone>\\w+)", "tool_call": {"name": "clock", "arguments": {"zone": "{zone}"}},
     "reply": "It is {tool_result}"},
    {"when": "^run (?P<target>\\w+)", "tool_call": {"name": "deploy", "arguments": {"target": "{target}"}},
     "reply": "deploy says: {tool_result}"},
]


def tool(name: str, argv: list[str], argument: str, permission: str = "allow") -> dict:
    schema = {"type": "object", "properties": {argument: {"type": "string"}}, "required": [argument]}
    return {"kind": "Tool", "name": name, "description": f"{name} (it only echoes)", "permission": permission,
            "input_schema": schema, "command": {"argv": argv, "timeout_s": 10}}


def agents_yaml(version: str) -> str:
    return f"""
        kind: Agent
        name: helper
        description: Tells the time ({version}).
        model: scripted
        tools: [clock]
        ---
        kind: Agent
        name: careful
        description: Deploys, but asks first.
        model: scripted
        tools: [deploy]
    """


def definitions(root: Path) -> Path:
    documents = [{"kind": "Model", "name": "scripted", "provider": "scripted", "script": SCRIPT,
                  "default": "echo: {input}"},
                 tool("clock", ["echo", "noon in {zone}"], "zone"),
                 tool("deploy", ["echo", "deployed {target}"], "target", permission="ask")]
    write_tree(root, {"tools.yaml": "\n---\n".join(json.dumps(d) for d in documents)})
    write_atomic(root / "agents.yaml", agents_yaml("v1"))
    return root


def short(digest: str) -> str:
    return digest[:15] + "…"


async def test_the_console_shows_and_steers_a_live_server(tmp_path: Path) -> None:
    need_chromium()
    from playwright.async_api import expect

    defs = definitions(tmp_path / "defs")
    with corral_server(defs, tmp_path / "state", watch=True) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30, trust_env=False) as client:
            await watcher_live(client, defs)
        v1 = agent_digest(defs, "helper")
        async with chromium(tmp_path) as browser:
            page = await browser.new_page()
            seen = Watch(page)
            with anyio.fail_after(45):
                await page.goto(url + "/console")
                sidebar = page.get_by_role("navigation", name="Agents and conversations")
                live = page.get_by_role("complementary", name="Live")
                await expect(sidebar.get_by_title(v1)).to_have_text(short(v1))
                await expect(sidebar.get_by_role("link", name="careful")).to_be_visible()
                await page.evaluate("window.stillTheSamePage = true")

                # a chat, answered, with its tool call's input and result
                await page.get_by_role("link", name="New chat").click()
                await page.get_by_label("Agent reference").fill("helper")
                await page.get_by_label("Message").fill("time in Lisbon")
                await page.get_by_role("button", name="Send").click()
                transcript = page.get_by_role("list", name="Transcript")
                await expect(transcript).to_contain_text("It is noon in Lisbon")
                call = transcript.locator("details.tool")
                await expect(call).to_contain_text("clock")
                await expect(call).to_contain_text('"zone": "Lisbon"')
                await expect(call).to_contain_text("noon in Lisbon")
                await expect(transcript.get_by_title(v1)).to_be_visible()  # the digest the turn ran on

                # an edit: the new digest shows without a reload, and the feed says what changed
                write_atomic(defs / "agents.yaml", agents_yaml("v2"))
                v2 = agent_digest(defs, "helper")
                await expect(sidebar.get_by_title(v2)).to_have_text(short(v2), timeout=10_000)
                swap = live.get_by_role("listitem").filter(has_text="applied").first
                await expect(swap.get_by_title(v1)).to_be_visible()
                await expect(swap.get_by_title(v2).first).to_be_visible()

                # a broken file: its file and line are shown; the fix clears them
                broken = defs / "broken.yaml"
                write_atomic(broken, "kind: Agent\nname: extra\nmodel: missing_model\n")
                line = line_of(broken, "missing_model")
                banner = page.locator("#rejected")
                await expect(banner).to_contain_text(re.compile(rf"broken\.yaml:{line}:\d+"), timeout=10_000)
                errors = live.get_by_role("list", name="Errors").first  # the feed keeps them
                await expect(errors).to_contain_text(f"broken.yaml:{line}:")
                write_atomic(broken, "kind: Agent\nname: extra\nmodel: scripted\n")
                await expect(banner).to_be_hidden(timeout=10_000)
                await expect(sidebar.get_by_role("link", name="extra")).to_be_visible()

                # `ask`: the request waits under Permissions; a swap meanwhile lists the turn as busy
                careful = agent_digest(defs, "careful")
                await page.get_by_role("link", name="New chat").click()
                await page.get_by_label("Agent reference").fill("careful")
                await page.get_by_label("Message").fill("run prod")
                await page.get_by_role("button", name="Send").click()
                permissions = page.get_by_role("region", name="Permissions")
                await expect(permissions).to_contain_text("deploy")
                await expect(permissions).to_contain_text('"target": "prod"')
                conversation_id = page.url.rsplit("/", 1)[1]
                write_atomic(defs / "agents.yaml", agents_yaml("v2").replace("asks first", "asks, always"))
                await expect(live.get_by_role("link", name=conversation_id)).to_be_visible(timeout=10_000)
                await permissions.get_by_role("button", name="Allow").click()
                await expect(transcript).to_contain_text("deploy says: deployed prod")
                await expect(transcript.get_by_title(careful)).to_be_visible()  # it ran on the old digest
                await expect(permissions).to_contain_text("Nothing is waiting")

                assert await page.evaluate("window.stillTheSamePage === true")  # never reloaded
                await page.get_by_role("link", name="careful").first.click()
                await expect(page.get_by_role("heading", name="careful", level=1)).to_be_visible()
                await expect(page.get_by_text("1 of 3 definitions differ")).to_be_visible()  # old vs new spec
                card_url = f"{url}/a2a/careful/.well-known/agent-card.json"  # beside its MCP tool name
                facts = page.locator("dl.facts")
                await expect(facts.get_by_text("careful", exact=True)).to_be_visible()
                await expect(facts.locator("code.a2a-card")).to_have_text(card_url)
                async with httpx.AsyncClient(timeout=30, trust_env=False) as plain:
                    assert (await plain.get(card_url)).json()["version"] == agent_digest(defs, "careful")
                aliases = page.get_by_role("region", name="Aliases")
                await aliases.get_by_role("textbox", name="Alias").fill("prod")
                await aliases.get_by_role("button", name="Point alias").click()  # at the current digest
                pointed = aliases.get_by_role("table")
                await expect(pointed.get_by_title(agent_digest(defs, "careful"))).to_be_visible()
                await aliases.get_by_role("button", name="Roll back prod").click()
                await expect(pointed.get_by_title(careful)).to_be_visible()  # the digest served before
                await page.get_by_role("link", name=conversation_id).first.click()
                await page.get_by_label("Message").fill("thanks")
                await page.get_by_role("button", name="Send").click()
                await expect(transcript).to_contain_text("echo: thanks")  # the next turn: the new digest
                await expect(transcript.get_by_title(agent_digest(defs, "careful"))).to_be_visible()
                shot = tmp_path / "console.png"
                await page.screenshot(path=str(shot))
    readme_shot = REPO / "docs" / "console.png"  # the README's; rewritten on request, not on every run
    if not readme_shot.exists() or os.environ.get("CORRAL_UPDATE_SCREENSHOT") == "1":
        readme_shot.parent.mkdir(exist_ok=True)
        shutil.copy(shot, readme_shot)
    assert seen.errors == []
    assert seen.hosts() == {url.removeprefix("http://")}, seen.hosts()


async def test_with_api_keys_the_page_asks_for_one_and_keeps_it_out_of_urls(tmp_path: Path) -> None:
    need_chromium()
    from playwright.async_api import expect

    defs = definitions(tmp_path / "defs")
    with corral_server(defs, tmp_path / "state", api_keys=KEY) as url:
        async with chromium(tmp_path) as browser:
            page = await browser.new_page()
            seen = Watch(page)
            with anyio.fail_after(30):
                await page.goto(url + "/console")
                key = page.get_by_label("API key")
                await expect(key).to_be_visible()
                assert seen.api_requests() == []  # it asked before trying anything
                await key.fill("not-the-key")
                await page.get_by_role("button", name="Connect").click()
                await expect(page.get_by_text("The server refused this key.")).to_be_visible()
                await key.fill(KEY)
                await page.get_by_role("button", name="Connect").click()
                sidebar = page.get_by_role("navigation", name="Agents and conversations")
                await expect(sidebar.get_by_role("link", name="helper")).to_be_visible()
                await page.get_by_role("link", name="New chat").click()
                await page.get_by_label("Agent reference").fill("helper")
                await page.get_by_label("Message").fill("time in Oslo")
                await page.get_by_role("button", name="Send").click()
                transcript = page.get_by_role("list", name="Transcript")
                await expect(transcript).to_contain_text("It is noon in Oslo")
                stored = await page.evaluate("[JSON.stringify({...sessionStorage}), localStorage.length]")
    assert KEY in stored[0] and stored[1] == 0
    assert all(KEY not in u for u, _ in seen.requests)
    sent = [h.get("authorization") for _, h in seen.api_requests()]
    assert sent and set(sent) <= {f"Bearer {KEY}", "Bearer not-the-key"} and f"Bearer {KEY}" in sent
    # only the refused key's requests failed
    assert all("401" in e for e in seen.errors), seen.errors


async def test_the_page_needs_no_key_and_the_closure_route_reads_old_digests(tmp_path: Path) -> None:
    defs = definitions(tmp_path / "defs")
    v1 = agent_digest(defs, "helper")
    with corral_server(defs, tmp_path / "state", api_keys=KEY) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30, trust_env=False) as anonymous, \
                httpx.AsyncClient(base_url=url, timeout=30, trust_env=False,
                                  headers={"Authorization": f"Bearer {KEY}"}) as client:
            page = await anonymous.get("/console")
            script = await anonymous.get("/console/app.js")
            template = await anonymous.get("/console/index.html")
            refused = await anonymous.get("/v1/agents/helper/closure")
            write_atomic(defs / "agents.yaml", agents_yaml("v2"))
            assert (await client.post("/v1/definitions/reload")).json()["status"] == "applied"
            old = (await client.get(f"/v1/agents/helper@{v1}/closure")).json()
            now = (await client.get("/v1/agents/helper/closure")).json()
            missing = await client.get("/v1/agents/helper@sha256:" + "0" * 64 + "/closure")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<meta name="corral-keys" content="required">' in page.text
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    assert template.status_code == 404  # only the page's scripts, styles and icons are files here
    assert refused.status_code == 401
    assert old["digest"] == v1 and old["definitions"][0]["spec"]["description"] == "Tells the time (v1)."
    assert now["digest"] != v1 and now["definitions"][0]["spec"]["description"] == "Tells the time (v2)."
    agent, *members = now["definitions"]
    assert [(d["kind"], d["name"]) for d in now["definitions"]] == [
        ("Agent", "helper"), ("Model", "scripted"), ("Tool", "clock")]
    assert {d["digest"] for d in members} == set(agent["spec"]["closure"].values())
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "digest_not_found"


async def test_a_fresh_load_shows_a_mended_rejection_as_history_not_a_banner(tmp_path: Path) -> None:
    """A set that failed to compile, then mended back to the set being served (an `unchanged` swap):
    a page loaded afterwards lists both in the feed and shows no rejected banner (§11)."""
    need_chromium()
    from playwright.async_api import expect

    defs = definitions(tmp_path / "defs")
    good = (defs / "agents.yaml").read_text()
    with corral_server(defs, tmp_path / "state") as url:
        async with httpx.AsyncClient(base_url=url, timeout=30, trust_env=False) as client:
            write_atomic(defs / "agents.yaml", good.replace("model: scripted", "model: missing_model", 1))
            rejected = await reload(client)
            write_atomic(defs / "agents.yaml", good)
            mended = await reload(client)
            history = await swaps(client)
        assert (rejected["status"], mended["status"]) == ("rejected", "unchanged"), (rejected, mended)
        assert [s["id"] for s in history[:2]] == [mended["id"], rejected["id"]]  # the mend is history too
        async with chromium(tmp_path) as browser:
            page = await browser.new_page()
            seen = Watch(page)
            with anyio.fail_after(45):
                await page.goto(url + "/console")
                live = page.get_by_role("complementary", name="Live")
                # the feed is drawn with the banner: once it lists the rejection, the banner is decided
                await expect(live.locator("li.swap.s-rejected")).to_contain_text("missing_model")
                await expect(page.locator("#rejected")).to_be_hidden()
                await expect(live.locator("li.swap.s-unchanged")).to_be_visible()  # the mend, before it
    assert seen.errors == [], seen.errors
