"""The console as a debugger (§11), in a real headless Chromium against a real Corral on loopback:
a turn's timeline (model requests, the tool call, the permission wait), the permission answered
beside the tool call that waits on it, the link to the turn's trace in the user's tracing UI
(CORRAL_TRACE_URL), the context meter, and rename, fork and archive.

The screenshot of the turn (a tool call held by a permission wait, then answered) lands in the
test's tmp dir, and in docs/console-timeline.png when that is missing or CORRAL_UPDATE_SCREENSHOT=1.
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
from tests.support.trees import write_tree

pytestmark = pytest.mark.anyio
TRACE_UI = "http://127.0.0.1:16686/trace/{trace_id}"  # CORRAL_TRACE_URL: never requested by the test
SCRIPT = [{"when": "^run (?P<target>\\w+)",
           "tool_call": {"name": "deploy", "arguments": {"target": "{target}"}},
           "reply": "deploy says: {tool_result}"}]


def definitions(root: Path) -> Path:
    schema = {"type": "object", "properties": {"target": {"type": "string"}}, "required": ["target"]}
    documents = [
        {"kind": "Model", "name": "scripted", "provider": "scripted", "script": SCRIPT,
         "default": "echo: {input}", "context_window": 8000},
        {"kind": "Tool", "name": "deploy", "description": "Deploys (it only echoes).", "permission": "ask",
         "input_schema": schema, "command": {"argv": ["echo", "deployed {target}"], "timeout_s": 10}},
        {"kind": "Agent", "name": "careful", "description": "Deploys, but asks first.", "model": "scripted",
         "tools": ["deploy"]},
    ]
    return write_tree(root, {"defs.yaml": "\n---\n".join(json.dumps(d) for d in documents)})


async def test_a_turns_timeline_its_permission_and_the_conversation_controls(tmp_path: Path) -> None:
    need_chromium()
    from playwright.async_api import expect

    defs = definitions(tmp_path / "defs")
    with corral_server(defs, tmp_path / "state", trace_url=TRACE_UI) as url:
        async with chromium(tmp_path) as browser:
            page = await browser.new_page()
            seen = Watch(page)
            with anyio.fail_after(60):
                await page.goto(url + "/console")
                await page.get_by_role("link", name="New chat").click()
                picker = page.get_by_role("group", name="Pick an agent")
                await picker.get_by_role("button", name="careful").click()  # picked, not typed
                await expect(page.get_by_label("Agent reference")).to_have_value("careful")
                await page.get_by_label("Message").fill("run prod")
                await page.get_by_role("button", name="Send").click()
                transcript = page.get_by_role("list", name="Transcript")
                call = transcript.locator("details.tool")
                await expect(call).to_contain_text("waiting for permission")
                timeline = transcript.get_by_role("region", name="Timeline")
                await expect(timeline).to_contain_text("waited")  # the wait shows while it waits
                await expect(timeline).to_contain_text("pending")
                await call.get_by_role("button", name="Allow").click()  # beside the call, not in the aside
                await expect(transcript).to_contain_text("deploy says: deployed prod")
                rows = timeline.get_by_role("listitem")
                await expect(rows).to_have_count(4)
                kinds = [await rows.nth(i).locator(".step-kind").text_content() for i in range(4)]
                assert kinds == ["model", "tool", "waited", "model"], kinds
                await expect(rows.nth(1)).to_contain_text("deploy")
                await expect(rows.nth(2)).not_to_contain_text("pending")
                async with httpx.AsyncClient(base_url=url, timeout=10, trust_env=False) as client:
                    conversation = page.url.rsplit("/", 1)[1]
                    [turn] = (await client.get(f"/v1/conversations/{conversation}/turns")).json()["items"]
                    trace_id = (await client.get(f"/v1/conversations/{conversation}/turns/{turn['id']}")
                                ).json()["trace_id"]
                link = timeline.get_by_role("link", name="Open trace")  # in the user's tracing UI
                await expect(link).to_have_attribute("href", TRACE_UI.replace("{trace_id}", trace_id))
                meter = page.get_by_label("Context used")
                await expect(meter).to_be_visible()
                used = re.compile(r"^[1-9]\d* of 8,000 tokens")
                await expect(page.locator(".context-text")).to_have_text(used)
                assert await meter.evaluate("m => [m.max, m.value > 0]") == [8000, True]
                await page.get_by_role("button", name="Rename").click()
                await page.get_by_label("Title").fill("Prod deploys")
                await page.get_by_role("button", name="Save").click()
                await expect(page.get_by_role("heading", name="Prod deploys", level=1)).to_be_visible()
                sidebar = page.get_by_role("navigation", name="Agents and conversations")
                await expect(sidebar.get_by_role("link", name="Prod deploys")).to_be_visible()
                shot = tmp_path / "console-timeline.png"
                await page.screenshot(path=str(shot))
                original = page.url
                await page.get_by_role("button", name="Fork").click()
                await expect(page).not_to_have_url(original)
                forked = page.url.rsplit("/", 1)[1]
                async with httpx.AsyncClient(base_url=url, timeout=10, trust_env=False) as client:
                    copy = (await client.get(f"/v1/conversations/{forked}")).json()
                    assert copy["forked_from"]["conversation_id"] == original.rsplit("/", 1)[1]
                    messages = (await client.get(f"/v1/conversations/{forked}/messages")).json()["items"]
                    assert len(messages) == 4  # the prompt, the call, its result, the answer
                await page.get_by_role("button", name="Archive").click()
                await expect(page.get_by_role("button", name="Unarchive")).to_be_visible()
                await expect(sidebar.get_by_role("link", name=forked)).to_be_hidden()
    readme_shot = REPO / "docs" / "console-timeline.png"
    if not readme_shot.exists() or os.environ.get("CORRAL_UPDATE_SCREENSHOT") == "1":
        readme_shot.parent.mkdir(exist_ok=True)
        shutil.copy(shot, readme_shot)
    assert seen.errors == []
    assert seen.hosts() == {url.removeprefix("http://")}, seen.hosts()
