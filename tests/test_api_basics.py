"""The HTTP API's plain routes: reads, health, metrics, conversations, errors, restarts, API keys.

Everything goes through a real Corral on loopback. Error answers are checked
for their stable code and for leaking nothing of the server's insides.
"""

from __future__ import annotations

import base64
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.client import Conversation
from tests.support.servers import corral_server
from tests.support.trees import write_tree

pytestmark = pytest.mark.anyio

DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
UNKNOWN_DIGEST = "sha256:" + "0" * 64


def definitions(root: Path) -> Path:
    return write_tree(root, {
        "models.yaml": r"""
            kind: Model
            name: offline
            provider: scripted
            script:
              - when: "^upper (?P<text>.+)"
                tool_call: { name: upper, arguments: { text: "{text}" } }
                reply: "upper: {tool_result}"
            default: "echo: {input}"
        """,
        "tools.yaml": """
            kind: Tool
            name: upper
            description: The text in capitals.
            input_schema: { type: object, properties: { text: { type: string } }, required: [text] }
            command: { argv: [python3, -c, "import sys; print(sys.argv[1].upper())", "{text}"] }
        """,
        "agents/team.yaml": """
            kind: Agent
            name: alpha
            description: The first agent.
            model: offline
            tools: [upper]
            ---
            kind: Agent
            name: beta
            model: offline
            ---
            kind: Agent
            name: gamma
            model: offline
        """,
    })


@pytest.fixture(scope="module")
def defs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return definitions(tmp_path_factory.mktemp("basics") / "defs")



@pytest.fixture(scope="module")
async def client(defs: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[httpx.AsyncClient]:
    state = tmp_path_factory.mktemp("basics-state")
    with corral_server(defs, state, max_body_bytes=1000) as url:
        async with httpx.AsyncClient(base_url=url, timeout=15, trust_env=False) as http:
            yield http


def error_of(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The error envelope of `r`, checked: its status, its code, and no server internals."""
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json")
    error = r.json()["error"]
    assert error["code"] == code and isinstance(error["message"], str) and error["message"]
    assert "Traceback" not in r.text and 'File "' not in r.text
    return error


async def pages(client: httpx.AsyncClient, path: str, limit: int,
                **params: str) -> list[list[dict[str, Any]]]:
    """Every page of a list route, following `next_cursor` to the end."""
    out, cursor = [], None
    for _ in range(100):
        query = {"limit": str(limit), **params, **({"cursor": cursor} if cursor else {})}
        r = await client.get(path, params=query)
        assert r.status_code == 200, r.text
        body = r.json()
        assert set(body) == {"items", "next_cursor"}
        out.append(body["items"])
        cursor = body["next_cursor"]
        if cursor is None:
            return out
    raise AssertionError("next_cursor never ran out")


# --- definitions and agents ----------------------------------------------------


async def test_definitions_of_the_repository(default_server: str) -> None:
    async with httpx.AsyncClient(base_url=default_server, trust_env=False) as client:
        listing = (await client.get("/v1/definitions")).json()
        assert set(listing) == {"digest", "definitions"} and DIGEST.match(listing["digest"])
        for d in listing["definitions"]:
            assert set(d) == {"kind", "name", "digest", "source"} and DIGEST.match(d["digest"])
            assert not d["source"]["file"].startswith("/") and d["source"]["line"] >= 1
        by_name = {(d["kind"], d["name"]): d for d in listing["definitions"]}
        assert by_name[("Agent", "assistant")]["source"] == {"file": "assistant.yaml", "line": 1}
        assert ("Model", "offline") in by_name and ("Skill", "haiku") in by_name

        one = (await client.get("/v1/definitions/agent/assistant")).json()
        assert one["kind"] == "Agent" and one["name"] == "assistant"
        assert one["digest"] == by_name[("Agent", "assistant")]["digest"]
        assert one["spec"]["kind"] == "Agent" and one["spec"]["model"] == "offline"
        assert one["spec"]["on_busy"] == "reject" and one["spec"]["max_steps"] == 10  # defaults filled in
        tool = (await client.get("/v1/definitions/tool/word_count")).json()
        assert tool["kind"] == "Tool" and tool["spec"]["permission"] == "allow"


async def test_agents(client: httpx.AsyncClient) -> None:
    listing = (await client.get("/v1/agents")).json()
    assert listing["next_cursor"] is None
    assert [a["name"] for a in listing["items"]] == ["alpha", "beta", "gamma"]
    alpha = listing["items"][0]
    assert alpha["description"] == "The first agent." and alpha["model"] == "offline"
    assert alpha["tools"] == ["upper"] and DIGEST.match(alpha["digest"])
    assert (await client.get("/v1/agents/alpha")).json() == alpha
    assert (await client.get(f"/v1/agents/alpha@{alpha['digest']}")).json() == alpha
    assert [[a["name"] for a in page] for page in await pages(client, "/v1/agents", 2)] == [["alpha", "beta"],
                                                                                           ["gamma"]]
    error_of(await client.get("/v1/agents/nope"), 404, "agent_not_found")
    error_of(await client.get(f"/v1/agents/alpha@{UNKNOWN_DIGEST}"), 404, "digest_not_found")
    error_of(await client.get(f"/v1/agents/beta@{alpha['digest']}"), 404, "digest_not_found")
    error_of(await client.get("/v1/definitions/agent/nope"), 404, "not_found")
    error_of(await client.get("/v1/definitions/widget/alpha"), 400, "invalid_request")


# --- health and metrics ---------------------------------------------------------


async def test_health_and_metrics(default_server: str) -> None:
    async with httpx.AsyncClient(base_url=default_server, timeout=15, trust_env=False) as client:
        assert (await client.get("/healthz")).json() == {"status": "ok"}
        ready = await client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["status"] == "ready"
        conversation = await Conversation.create(client, "assistant")
        assert (await conversation.say("count words in one two three"))["output"] == "Word count: 3"
        metrics = await client.get("/metrics")
    assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
    text = metrics.text
    assert 'corral_turns_total{agent="assistant",outcome="completed"} 1\n' in text
    assert 'corral_turn_duration_seconds_count{agent="assistant"} 1\n' in text
    assert re.search(r'^corral_tool_calls_total\{[^}]*tool="word_count"[^}]*\} 1$', text, re.M)
    assert re.search(r"^corral_model_requests_total\{[^}]*\} 2$", text, re.M), "two model steps"
    assert re.search(r"^corral_busy_conversations 0$", text, re.M)
    for name in ("corral_swaps_total", "corral_model_requests_total"):
        assert f"# TYPE {name} counter" in text


async def test_openapi_document(client: httpx.AsyncClient) -> None:
    document = (await client.get("/openapi.json")).json()
    assert document["openapi"].startswith("3.")
    for path in ("/v1/conversations", "/v1/conversations/{id}/messages", "/v1/agents", "/v1/definitions"):
        assert path in document["paths"], path


# --- conversations ----------------------------------------------------------------


async def test_conversation_crud(client: httpx.AsyncClient) -> None:
    digest = (await client.get("/v1/agents/alpha")).json()["digest"]
    conversation = await Conversation.create(client, "alpha", title="Notes", metadata={"team": "blue"})
    created = conversation.created
    assert created["id"].startswith("conv_") and created["agent"] == "alpha"
    assert created["digest"] == digest and created["status"] == "idle"
    cid = created["id"]
    read = (await client.get(f"/v1/conversations/{cid}")).json()
    assert read["title"] == "Notes" and read["metadata"] == {"team": "blue"} and read["turns"] == []
    answer = await conversation.say("upper quiet words")
    assert answer["output"] == "upper: QUIET WORDS" and answer["digest"] == digest
    assert (await client.get(f"/v1/conversations/{cid}")).json()["turns"] == [
        {"id": answer["turn_id"], "digest": digest, "status": "completed"}]

    assert (await client.delete(f"/v1/conversations/{cid}")).status_code == 204
    error_of(await client.get(f"/v1/conversations/{cid}"), 404, "conversation_not_found")
    for path in ("", "/messages", "/turns", "/events"):
        error_of(await client.get(f"/v1/conversations/{cid}{path}"), 404, "conversation_not_found")
    error_of(await client.post(f"/v1/conversations/{cid}/messages", json={"content": "hi"}), 404,
             "conversation_not_found")
    error_of(await client.delete(f"/v1/conversations/{cid}"), 404, "conversation_not_found")


async def test_conversation_pages_and_filters(client: httpx.AsyncClient) -> None:
    made = [(await Conversation.create(client, "gamma")).id for _ in range(5)]
    walked = await pages(client, "/v1/conversations", 2, agent="gamma")
    assert [len(p) for p in walked] == [2, 2, 1]
    assert [c["id"] for p in walked for c in p] == made[::-1]  # newest first, no gaps, no repeats
    assert all(c["agent"] == "gamma" for p in walked for c in p)

    digest = (await client.get("/v1/agents/gamma")).json()["digest"]
    by_digest = [c["id"] for p in await pages(client, "/v1/conversations", 3, digest=digest) for c in p]
    assert by_digest == made[::-1]
    idle = [c["id"] for p in await pages(client, "/v1/conversations", 50, agent="gamma", status="idle")
            for c in p]
    assert idle == made[::-1]
    busy = await client.get("/v1/conversations", params={"agent": "gamma", "status": "busy"})
    assert busy.json()["items"] == []

    # a page boundary whose conversation is deleted meanwhile still leads on
    first = (await client.get("/v1/conversations", params={"agent": "gamma", "limit": 2})).json()
    assert (await client.delete(f"/v1/conversations/{first['items'][-1]['id']}")).status_code == 204
    rest = (await client.get("/v1/conversations", params={"agent": "gamma", "limit": 50,
                                                          "cursor": first["next_cursor"]})).json()
    assert [c["id"] for c in rest["items"]] == made[:3][::-1]


async def test_message_and_turn_pages(client: httpx.AsyncClient) -> None:
    conversation = await Conversation.create(client, "beta")
    answers = [await conversation.say(f"message {n}") for n in range(3)]
    messages = [m for p in await pages(client, f"{conversation.path}/messages", 4) for m in p]
    assert [m["content"] for m in messages] == [x for n in range(3) for x in (f"message {n}",
                                                                             f"echo: message {n}")]
    turns = [t for p in await pages(client, f"{conversation.path}/turns", 2) for t in p]
    assert [t["id"] for t in turns] == [a["turn_id"] for a in answers]


# --- bad input ----------------------------------------------------------------------


@pytest.mark.parametrize("body", [
    b"{not json", b"", b"[1, 2]", b'"alpha"', b"\xff\xfe",
    b'{"agent": 5}', b'{"agent": "alpha", "title": ["x"]}', b'{"agent": "alpha", "metadata": "x"}',
    b'{"agent": "alpha", "colour": "red"}', b'{"agent": ""}', b"{}",
])
async def test_bad_conversation_bodies(client: httpx.AsyncClient, body: bytes) -> None:
    r = await client.post("/v1/conversations", content=body, headers={"content-type": "application/json"})
    error_of(r, 400, "invalid_request")


@pytest.mark.parametrize("body", [
    {"content": 5}, {"content": ""}, {}, {"content": "hi", "if_busy": "later"},
    {"content": "hi", "stream": [True]}, {"content": "hi", "extra": 1},
])
async def test_bad_message_bodies(client: httpx.AsyncClient, body: dict[str, Any]) -> None:
    conversation = await Conversation.create(client, "alpha")
    error_of(await client.post(f"{conversation.path}/messages", json=body), 400, "invalid_request")
    assert (await client.get(f"{conversation.path}/turns")).json()["items"] == []


async def test_unknown_names(client: httpx.AsyncClient) -> None:
    error_of(await client.get("/v1/nowhere"), 404, "not_found")
    error_of(await client.delete("/v1/agents"), 405, "method_not_allowed")
    error_of(await client.post("/v1/conversations", json={"agent": "nope"}), 404, "agent_not_found")
    error_of(await client.post("/v1/conversations", json={"agent": f"alpha@{UNKNOWN_DIGEST}"}), 404,
             "digest_not_found")
    error_of(await client.get("/v1/conversations/conv_nope"), 404, "conversation_not_found")


async def test_oversized_bodies(client: httpx.AsyncClient) -> None:
    big = {"agent": "alpha", "title": "x" * 2000}
    error_of(await client.post("/v1/conversations", json=big), 413, "payload_too_large")

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: the limit must hold while reading
        yield b'{"agent": "alpha", "title": "'
        yield b"x" * 2000
        yield b'"}'

    error_of(await client.post("/v1/conversations", content=chunks(),
                               headers={"Content-Type": "application/json"}), 413, "payload_too_large")
    conversation = await Conversation.create(client, "alpha")
    error_of(await conversation.send("y" * 2000), 413, "payload_too_large")


@pytest.mark.parametrize("query", [
    {"limit": "0"}, {"limit": "-1"}, {"limit": "ten"}, {"limit": "100000"},
    {"cursor": "%%%"}, {"cursor": "!!!"}, {"cursor": "zzzz"}, {"status": "sleeping"},
])
async def test_bad_list_parameters(client: httpx.AsyncClient, query: dict[str, str]) -> None:
    error_of(await client.get("/v1/conversations", params=query), 400, "invalid_request")


async def test_bad_event_and_message_cursors(client: httpx.AsyncClient) -> None:
    conversation = await Conversation.create(client, "alpha")
    error_of(await client.get(f"{conversation.path}/events", headers={"Last-Event-ID": "abc"}), 400,
             "invalid_request")
    not_a_number = base64.urlsafe_b64encode(b"abc").decode()
    error_of(await client.get(f"{conversation.path}/messages", params={"cursor": not_a_number}), 400,
             "invalid_request")


# --- restart and API keys -------------------------------------------------------------


async def test_restart_keeps_everything(defs: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    with corral_server(defs, state) as url:
        async with httpx.AsyncClient(base_url=url, timeout=15, trust_env=False) as c:
            conversation = await Conversation.create(c, "alpha")
            cid = conversation.id
            first = await conversation.say("upper before the restart")
            tails = ("", "/messages", "/turns")
            before = {tail: (await c.get(f"/v1/conversations/{cid}{tail}")).json() for tail in tails}
            listed = (await c.get("/v1/conversations")).json()
    with corral_server(defs, state) as url:
        async with httpx.AsyncClient(base_url=url, timeout=15, trust_env=False) as c:
            for tail, body in before.items():
                assert (await c.get(f"/v1/conversations/{cid}{tail}")).json() == body
            assert (await c.get("/v1/conversations")).json() == listed
            second = await conversation.through(c).say("upper after it")
            assert second["status"] == "completed" and second["output"] == "upper: AFTER IT"
            turns = (await c.get(f"/v1/conversations/{cid}/turns")).json()["items"]
            assert [t["id"] for t in turns] == [first["turn_id"], second["turn_id"]]
            messages = (await c.get(f"/v1/conversations/{cid}/messages")).json()["items"]
            assert [m["seq"] for m in messages] == list(range(1, 9))


async def test_api_keys(defs: Path, tmp_path: Path) -> None:
    with corral_server(defs, tmp_path / "state", api_keys="k1, k2") as url:
        async with httpx.AsyncClient(base_url=url, timeout=15, trust_env=False) as c:
            assert (await c.get("/healthz")).status_code == 200
            for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic k1"},
                            {"Authorization": "Bearer k1k2"}, {"Authorization": "Bearer"}):
                for path in ("/v1/agents", "/readyz", "/metrics", "/v1/conversations/conv_x"):
                    r = await c.get(path, headers=headers)
                    error_of(r, 401, "unauthorized")
            error_of(await c.post("/v1/conversations", json={"agent": "alpha"}), 401, "unauthorized")
            for key in ("k1", "k2"):
                r = await c.get("/v1/agents", headers={"Authorization": f"Bearer {key}"})
                assert r.status_code == 200 and r.json()["items"]
            r = await c.post("/v1/conversations", json={"agent": "alpha"},
                             headers={"Authorization": "Bearer k2"})
            assert r.status_code == 201
