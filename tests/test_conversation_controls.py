"""Conversation controls over HTTP: PATCH (title, metadata, archived), archived lists, and forks.

A real Corral on loopback, on the versioned tree (`edited` answers with its
version, `other` never changes; both on scripted models, "wait PATH" blocks
in the gate) plus `remote`, an agent on a fake OpenAI-compatible model whose
instructions carry a version too: what a turn on a fork sent the model is
read from the fake's record.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.fakes import FakeOpenAI, Reply, serve
from tests.support.client import Conversation
from tests.support.events import ended, named
from tests.support.servers import corral_server
from tests.support.swaps import reload
from tests.support.trees import agent_digest, edited_yaml, open_gate, versioned_definitions, write_atomic

pytestmark = pytest.mark.anyio


def remote_yaml(fake_url: str, version: str) -> str:
    return f"""
        kind: Model
        name: m_remote
        provider: openai
        model: remote-model
        base_url: {fake_url}/v1
        api_key: "${{CORRAL_CONTROLS_KEY:-sk-fake}}"
        retries: 0
        ---
        kind: Agent
        name: remote
        model: m_remote
        instructions: You are {version}.
    """


@dataclass
class Served:
    client: httpx.AsyncClient
    root: Path
    fake: FakeOpenAI
    fake_url: str


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    fake = FakeOpenAI()
    with serve(fake.app) as fake_url:
        root = versioned_definitions(tmp_path / "defs")
        write_atomic(root / "remote.yaml", remote_yaml(fake_url, "v1"))
        with corral_server(root, tmp_path / "state") as url:
            async with httpx.AsyncClient(base_url=url, timeout=20, trust_env=False) as client:
                yield Served(client, root, fake, fake_url)
    assert fake.pending == 0, "a scripted reply was never asked for"


def error_of(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    error = r.json()["error"]
    assert error["code"] == code and error["message"], error
    return error


async def listed(client: httpx.AsyncClient, **params: str) -> list[str]:
    r = await client.get("/v1/conversations", params={"limit": 100, **params})
    assert r.status_code == 200, r.text
    return [c["id"] for c in r.json()["items"]]


def contents(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in messages]


# --- PATCH ---------------------------------------------------------------------------------------


async def test_patch_renames_replaces_metadata_and_archives(served: Served) -> None:
    client = served.client
    conversation = await Conversation.create(client, "edited", title="First", metadata={"a": 1})
    assert conversation.created["archived"] is False and conversation.created["forked_from"] is None
    await conversation.say("hello")
    path = conversation.path

    r = await client.patch(path, json={"title": "Renamed"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["title"] == "Renamed" and body["metadata"] == {"a": 1} and body["archived"] is False
    assert body == await conversation.get()  # answered as GET answers, turns included
    assert [t["status"] for t in body["turns"]] == ["completed"]

    r = await client.patch(path, json={"metadata": {"b": [1, 2]}})
    assert r.json()["metadata"] == {"b": [1, 2]} and r.json()["title"] == "Renamed"  # replaced whole
    r = await client.patch(path, json={"archived": True})
    assert r.json()["archived"] is True and (await conversation.get())["archived"] is True
    r = await client.patch(path, json={"title": None, "archived": False})
    assert r.json()["title"] is None and r.json()["archived"] is False
    assert r.json()["updated_at"] >= conversation.created["updated_at"]
    assert (await conversation.say("still here"))["output"] == "v1: still here"


@pytest.mark.parametrize("body", [
    {}, {"archived": "yes"}, {"archived": 1}, {"archived": None}, {"unknown": 1}, {"title": "x" * 501},
    {"title": "nul\x00"}, {"metadata": None}, {"metadata": [1]}, {"title": 5},
])
async def test_patch_refuses_bad_bodies(served: Served, body: dict[str, Any]) -> None:
    conversation = await Conversation.create(served.client, "edited", title="Kept")
    error_of(await served.client.patch(conversation.path, json=body), 400, "invalid_request")
    assert (await conversation.get())["title"] == "Kept"


async def test_patch_and_fork_of_an_unknown_conversation_are_404(served: Served) -> None:
    client = served.client
    error_of(await client.patch("/v1/conversations/conv_nope", json={"title": "x"}), 404,
             "conversation_not_found")
    error_of(await client.post("/v1/conversations/conv_nope/fork", json={}), 404, "conversation_not_found")


async def test_lists_leave_archived_conversations_out_unless_asked(served: Served) -> None:
    client = served.client
    ids = [(await Conversation.create(client, "edited")).id for _ in range(3)]
    assert await client.patch(f"/v1/conversations/{ids[1]}", json={"archived": True})
    assert await listed(client) == [ids[2], ids[0]]
    assert await listed(client, archived="false") == [ids[2], ids[0]]
    assert await listed(client, archived="true") == [ids[1]]
    assert await listed(client, archived="true", agent="other") == []
    for bad in ("yes", "1", "True", ""):
        error_of(await client.get("/v1/conversations", params={"archived": bad}), 400, "invalid_request")
    # an archived conversation is still read, run and unarchived by id
    assert (await client.get(f"/v1/conversations/{ids[1]}")).json()["archived"] is True
    await client.patch(f"/v1/conversations/{ids[1]}", json={"archived": False})
    assert await listed(client) == ids[::-1] and await listed(client, archived="true") == []


# --- fork ----------------------------------------------------------------------------------------


async def test_fork_the_whole_transcript_on_the_same_agent(served: Served) -> None:
    client = served.client
    source = await Conversation.create(client, "edited", title="Source", metadata={"team": "core"})
    await source.say("one")
    await source.say("two")
    r = await client.post(f"{source.path}/fork", json={})
    assert r.status_code == 201, r.text
    fork = r.json()
    assert fork["id"] != source.id and fork["agent"] == "edited"
    assert fork["digest"] == source.created["digest"]
    assert fork["title"] == "Source" and fork["metadata"] == {"team": "core"} and fork["archived"] is False
    assert fork["forked_from"] == {"conversation_id": source.id, "turn_id": None}
    assert fork["turns"] == [] and fork["status"] == "idle"
    forked = Conversation(client, fork)
    assert await forked.get() == fork
    copied, original = await forked.messages(), await source.messages()
    assert [m["seq"] for m in copied] == [1, 2, 3, 4]
    assert [(m["turn_id"], m["role"], m["content"]) for m in copied] == [
        (m["turn_id"], m["role"], m["content"]) for m in original]
    assert await forked.turns() == []
    # the fork goes on by itself, its event log starting empty; the source is untouched
    third = await forked.say("three")
    assert third["output"] == "v1: three"
    events = await forked.events(ended(third["turn_id"]))
    assert events[0].id == 1 and events[0].name == "turn.started"
    assert {e.data.get("turn_id") for e in events if "turn_id" in e.data} == {third["turn_id"]}
    assert len(await forked.messages()) == 6 and len(await source.messages()) == 4
    titled = await client.post(f"{source.path}/fork", json={"title": "Another"})
    assert titled.json()["title"] == "Another"


async def test_fork_before_a_turn_onto_the_new_digest_of_an_edited_agent(served: Served) -> None:
    client = served.client
    v1 = agent_digest(served.root, "remote")
    source = await Conversation.create(client, "remote")
    served.fake.script(Reply(text="first answer"), Reply(text="second answer"))
    first = await source.say("one")
    second = await source.say("two")
    assert first["digest"] == second["digest"] == v1

    write_atomic(served.root / "remote.yaml", remote_yaml(served.fake_url, "v2"))
    assert (await reload(client))["status"] == "applied"
    v2 = agent_digest(served.root, "remote")
    assert v2 != v1

    r = await client.post(f"{source.path}/fork", json={"before_turn_id": second["turn_id"],
                                                       "agent": f"remote@{v2}"})
    assert r.status_code == 201, r.text
    fork = Conversation(client, r.json())
    assert fork.created["agent"] == f"remote@{v2}" and fork.created["digest"] == v2
    assert fork.created["pinned"] is True
    forked_from = {"conversation_id": source.id, "turn_id": second["turn_id"]}
    assert fork.created["forked_from"] == forked_from and (await fork.get())["forked_from"] == forked_from
    assert contents(await fork.messages()) == [("user", "one"), ("assistant", "first answer")]
    assert {m["turn_id"] for m in await fork.messages()} == {first["turn_id"]}

    served.fake.script(Reply(text="forked answer"))
    answer = await fork.say("three")
    assert answer["output"] == "forked answer" and answer["digest"] == v2
    sent = served.fake.requests[-1].body["messages"]
    assert [(m["role"], m["content"]) for m in sent] == [
        ("system", "You are v2."), ("user", "one"), ("assistant", "first answer"), ("user", "three")]
    assert [t["digest"] for t in await fork.turns()] == [v2]
    assert contents(await source.messages())[-1] == ("assistant", "second answer")  # the source as it was


async def test_fork_onto_any_agent_reference_and_bad_references(served: Served) -> None:
    client = served.client
    source = await Conversation.create(client, "edited")
    await source.say("hello")
    onto = await client.post(f"{source.path}/fork", json={"agent": "other"})
    assert onto.status_code == 201, onto.text
    other = Conversation(client, onto.json())
    assert other.created["agent_name"] == "other" and other.created["pinned"] is False
    assert (await other.say("next"))["output"] == "other: next"
    assert contents(await other.messages())[:2] == [("user", "hello"), ("assistant", "v1: hello")]
    error_of(await client.post(f"{source.path}/fork", json={"agent": "missing"}), 404, "agent_not_found")
    error_of(await client.post(f"{source.path}/fork", json={"agent": "edited@sha256:" + "0" * 64}), 404,
             "digest_not_found")
    error_of(await client.post(f"{source.path}/fork", json={"agent": "a@b@c"}), 400, "invalid_request")
    # a pinned source's fork stays on its digest, after an edit too
    pinned = await Conversation.create(client, f"edited@{source.created['digest']}")
    write_atomic(served.root / "edited.yaml", edited_yaml("v2"))
    assert (await reload(client))["status"] == "applied"
    copy = (await client.post(f"{pinned.path}/fork", json={})).json()
    assert copy["agent"] == pinned.created["agent"] and copy["digest"] == source.created["digest"]
    assert (await Conversation(client, copy).say("x"))["output"] == "v1: x"


async def test_fork_at_an_unknown_turn_is_turn_not_found(served: Served) -> None:
    client = served.client
    source = await Conversation.create(client, "edited")
    elsewhere = await Conversation.create(client, "edited")
    theirs = (await elsewhere.say("hello"))["turn_id"]
    for turn_id in ("turn_nope", theirs):
        error = error_of(await client.post(f"{source.path}/fork", json={"before_turn_id": turn_id}), 404,
                         "turn_not_found")
        assert error["details"] == {"conversation_id": source.id, "turn_id": turn_id}
    for body in ({"before_turn_id": ""}, {"unknown": 1}, {"title": "x" * 501}, {"agent": ""},
                 {"title": "nul\x00"}):
        error_of(await client.post(f"{source.path}/fork", json=body), 400, "invalid_request")
    assert await listed(client) == [elsewhere.id, source.id]  # nothing was created


async def test_a_running_turn_is_not_copied(served: Served, tmp_path: Path) -> None:
    client = served.client
    source = await Conversation.create(client, "edited")
    await source.say("before")
    gate = tmp_path / "gate"
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(source.send, f"wait {gate}")
            events = await source.events(named("tool.started"))  # the turn is in the gate
            running = [e.data["turn_id"] for e in events if e.name == "turn.started"][-1]
            assert ("user", f"wait {gate}") in contents(await source.messages())  # in the transcript
            r = await client.post(f"{source.path}/fork", json={})
            assert r.status_code == 201, r.text
            fork = Conversation(client, r.json())
            assert contents(await fork.messages()) == [("user", "before"), ("assistant", "v1: before")]
            before_running = await client.post(f"{source.path}/fork", json={"before_turn_id": running})
            assert before_running.status_code == 201, before_running.text
            assert len(await Conversation(client, before_running.json()).messages()) == 2
            open_gate(gate)
    finally:
        open_gate(gate)
    assert source.replies[-1].json()["output"] == "v1 passed the gate"
    assert len(await fork.messages()) == 2  # what the turn wrote later stays in the source


# --- the document --------------------------------------------------------------------------------


async def test_the_openapi_document_lists_the_new_routes_with_their_codes(served: Served) -> None:
    paths = (await served.client.get("/openapi.json")).json()["paths"]

    def codes(operation: dict[str, Any]) -> set[str]:
        found: set[str] = set()
        for status, response in operation["responses"].items():
            if status != "default" and int(status) >= 400:
                found |= set(response["content"]["application/json"]["schema"]["allOf"][1]["properties"]
                             ["error"]["properties"]["code"]["enum"])
        return found

    patch = paths["/v1/conversations/{id}"]["patch"]
    assert {"invalid_request", "conversation_not_found"} <= codes(patch) and "200" in patch["responses"]
    assert patch["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/UpdateConversation")
    fork = paths["/v1/conversations/{id}/fork"]["post"]
    assert "201" in fork["responses"]
    assert {"invalid_request", "conversation_not_found", "turn_not_found", "agent_not_found",
            "digest_not_found"} <= codes(fork)
    assert fork["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/ForkConversation")
    listing = paths["/v1/conversations"]["get"]
    assert {"name": "archived", "in": "query", "required": False,
            "schema": {"type": "boolean"}} in listing["parameters"]
