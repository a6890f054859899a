"""Pinned digests and aliases: a conversation runs the definitions it names, edits and restarts aside.

`agent@sha256:…` is the exact digest for every turn, even after the files
changed and the server restarted (the closure is rebuilt from the store);
`agent@alias` follows an alias the operator moves; a bare name follows the
files. Each version of `edited` answers with its version, so an answer
proves which definitions ran it.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.client import Conversation
from tests.support.servers import corral_server
from tests.support.swaps import reload
from tests.support.trees import agent_digest, edited_yaml, versioned_definitions, write_atomic

pytestmark = pytest.mark.anyio

NEVER_SERVED = "sha256:" + "0" * 64


def client_for(base_url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=base_url, timeout=20, trust_env=False)


async def edit_and_reload(client: httpx.AsyncClient, defs: Path, version: str) -> str:
    """Move `edited` to `version`; returns its new digest."""
    write_atomic(defs / "edited.yaml", edited_yaml(version))
    report = await reload(client)
    assert report["status"] == "applied", report
    return next(c["to"] for c in report["changes"] if (c["kind"], c["name"]) == ("Agent", "edited"))


async def test_a_pinned_conversation_keeps_its_digest_across_edits_and_restarts(tmp_path: Path) -> None:
    defs, state = versioned_definitions(tmp_path / "defs", "v1"), tmp_path / "state"
    v1 = agent_digest(defs)
    with anyio.fail_after(60):
        with corral_server(defs, state) as url:
            async with client_for(url) as client:
                pinned = await Conversation.create(client, f"edited@{v1}")
                created = pinned.created
                assert (created["digest"], created["pinned"], created["agent_name"]) == (v1, True, "edited")
                by_name = await Conversation.create(client, "edited")
                first = [await c.say("hello") for c in (pinned, by_name)]
                v2 = await edit_and_reload(client, defs, "v2")
                second = [await c.say("hello") for c in (pinned, by_name)]
        write_atomic(defs / "edited.yaml", edited_yaml("v3"))  # while the server is down
        v3 = agent_digest(defs)
        with corral_server(defs, state) as url:
            async with client_for(url) as client:
                third = [await c.through(client).say("hello") for c in (pinned, by_name)]
                # v2 was served by the previous process only; it still resolves
                late = await Conversation.create(client, f"edited@{v2}")
                late_answer = await late.say("hello")
                stored = await pinned.through(client).turns()
                listed = (await client.get("/v1/conversations", params={"digest": v1})).json()["items"]

    assert len({v1, v2, v3}) == 3
    assert [(a["digest"], a["output"]) for a in first] == [(v1, "v1: hello")] * 2
    assert [(a["digest"], a["output"]) for a in second] == [(v1, "v1: hello"), (v2, "v2: hello")]
    assert [(a["digest"], a["output"]) for a in third] == [(v1, "v1: hello"), (v3, "v3: hello")]
    assert (late_answer["digest"], late_answer["output"]) == (v2, "v2: hello")
    assert [t["digest"] for t in stored] == [v1, v1, v1]
    assert pinned.id in {c["id"] for c in listed}


async def test_aliases_move_new_conversations_between_digests(tmp_path: Path) -> None:
    defs = versioned_definitions(tmp_path / "defs", "v1")
    v1 = agent_digest(defs)
    with corral_server(defs, tmp_path / "state") as url:
        async with client_for(url) as client:
            v2 = await edit_and_reload(client, defs, "v2")

            async def point(alias: str, digest: str) -> httpx.Response:
                return await client.put(f"/v1/agents/edited/aliases/{alias}", json={"digest": digest})

            async def via(ref: str) -> tuple[str, str]:
                conversation = await Conversation.create(client, ref)
                answer = await conversation.say("hello")
                assert answer["digest"] == conversation.created["digest"]
                return answer["digest"], answer["output"]

            with anyio.fail_after(30):
                put = await point("prod", v1)
                assert put.status_code == 200, put.text
                assert put.json() == {"agent": "edited", "alias": "prod", "digest": v1}
                assert await via("edited@prod") == (v1, "v1: hello")
                assert await via("edited") == (v2, "v2: hello")
                assert (await point("prod", v2)).status_code == 200
                assert await via("edited@prod") == (v2, "v2: hello")
                assert (await point("prod", v1)).status_code == 200  # roll back
                assert await via("edited@prod") == (v1, "v1: hello")
                listed = (await client.get("/v1/agents/edited/aliases")).json()["items"]
                unknown = await client.post("/v1/conversations", json={"agent": "edited@staging"})
                never = await point("prod", NEVER_SERVED)
                foreign = await point("prod", agent_digest(defs, "other"))
                deleted = await client.delete("/v1/agents/edited/aliases/prod")
                gone = await client.post("/v1/conversations", json={"agent": "edited@prod"})
                missing_pin = await client.post("/v1/conversations", json={"agent": f"edited@{NEVER_SERVED}"})

    assert [(a["alias"], a["digest"]) for a in listed] == [("prod", v1)]
    assert unknown.status_code == 404, unknown.text
    assert never.status_code == 404 and never.json()["error"]["code"] == "digest_not_found"
    assert foreign.status_code == 404 and foreign.json()["error"]["code"] == "digest_not_found"
    assert deleted.status_code == 204 and gone.status_code == 404
    assert missing_pin.status_code == 404 and missing_pin.json()["error"]["code"] == "digest_not_found"


async def test_the_openai_route_accepts_a_pinned_model(tmp_path: Path) -> None:
    defs = versioned_definitions(tmp_path / "defs", "v1")
    v1 = agent_digest(defs)
    with corral_server(defs, tmp_path / "state") as url:
        async with client_for(url) as client:
            with anyio.fail_after(30):
                v2 = await edit_and_reload(client, defs, "v2")

                async def complete(model: str) -> httpx.Response:
                    return await client.post("/v1/chat/completions", json={
                        "model": model, "messages": [{"role": "user", "content": "hello"}]})

                pinned, current, unknown = (await complete(f"edited@{v1}"), await complete("edited"),
                                            await complete(f"edited@{NEVER_SERVED}"))

    assert pinned.status_code == 200, pinned.text
    assert pinned.json()["model"] == f"edited@{v1}"
    assert pinned.json()["choices"][0]["message"]["content"] == "v1: hello"
    assert pinned.json()["system_fingerprint"] == v1
    assert current.json()["choices"][0]["message"]["content"] == "v2: hello"
    assert current.json()["system_fingerprint"] == v2
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "digest_not_found"
