"""Tool calls that wait on a person: `permission: ask`, hooks that ask, and the audit trail, through a
real Corral on loopback (and its MCP endpoint, with the official `mcp` client).

The `risky` tool asks; `tame` allows, but its agent has the `ask.py` hook of tests/hooks/. Both
append their argument to `ran.log` before answering, so whether a tool ran is read from disk.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp.types as types
import openai
import pytest
from mcp import Client

from tests.support.client import Conversation
from tests.support.events import ended, named, read_events
from tests.support.servers import corral_server
from tests.support.trees import write_tree

pytestmark = pytest.mark.anyio
PY = sys.executable
KEY = "k-perm-5e1f0a9c"
RAN_PY = """import pathlib, sys
with (pathlib.Path(sys.argv[1]) / "ran.log").open("a") as log:
    log.write(sys.argv[2] + "\\n")
print("ran: " + sys.argv[2])
"""
SCRIPT = [
    {"when": "^run (?P<command>.+)$", "tool_call": {"name": "risky", "arguments": {"command": "{command}"}},
     "reply": "tool said: {tool_result}"},
    {"when": "^tame (?P<command>.+)$", "tool_call": {"name": "tame", "arguments": {"command": "{command}"}},
     "reply": "tool said: {tool_result}"},
]


def definitions(root: Path, marker_dir: Path) -> Path:
    def tool(name: str, permission: str) -> dict[str, Any]:
        return {"kind": "Tool", "name": name, "description": f"{name}: it only writes its input down.",
                "permission": permission,
                "input_schema": {"type": "object", "properties": {"command": {"type": "string"}},
                                 "required": ["command"]},
                "command": {"argv": [PY, "scripts/ran.py", str(marker_dir), "{command}"], "timeout_s": 10}}

    documents = [
        {"kind": "Model", "name": "scripted", "provider": "scripted", "script": SCRIPT},
        tool("risky", "ask"), tool("tame", "allow"),
        {"kind": "Hook", "name": "ask-first", "event": "PreToolUse", "matcher": "tame",
         "command": [PY, "hooks/ask.py"]},
        {"kind": "Agent", "name": "careful", "description": "Asks before it runs anything.",
         "model": "scripted", "tools": ["risky"]},
        {"kind": "Agent", "name": "hooked", "model": "scripted", "tools": ["tame"], "hooks": ["ask-first"]},
    ]
    (root / "hooks").mkdir(parents=True)
    shutil.copy(Path(__file__).parent / "hooks" / "ask.py", root / "hooks" / "ask.py")
    return write_tree(root, {"scripts/ran.py": RAN_PY,
                             "defs.yaml": "\n---\n".join(json.dumps(d) for d in documents)})


class Served:
    """A Corral serving the definitions above, and where its tools write down what they ran."""

    def __init__(self, url: str, marker_dir: Path):
        self.url = url
        self.marker_dir = marker_dir

    def ran(self) -> list[str]:
        log = self.marker_dir / "ran.log"
        return log.read_text().splitlines() if log.exists() else []


@contextmanager
def serving(root: Path, **settings: Any) -> Iterator[Served]:
    marker_dir = root / "markers"
    marker_dir.mkdir(parents=True)
    with corral_server(definitions(root / "defs", marker_dir), root / "state", shutdown_grace_s=1,
                       **settings) as url:
        yield Served(url, marker_dir)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serving(tmp_path_factory.mktemp("permissions")) as found:
        yield found


@pytest.fixture
async def client(served: Served) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=served.url, timeout=15, trust_env=False) as http:
        yield http


async def asked(client: httpx.AsyncClient, conversation_id: str) -> dict[str, Any]:
    """The first permission request of the conversation (waiting for it to come)."""
    return (await read_events(client, conversation_id, named("permission.requested")))[-1].data


async def decide(client: httpx.AsyncClient, conversation_id: str, request_id: str,
                 decision: str) -> httpx.Response:
    return await client.post(f"/v1/conversations/{conversation_id}/permissions/{request_id}",
                             json={"decision": decision})


async def audit(client: httpx.AsyncClient, conversation_id: str) -> list[dict[str, Any]]:
    reply = await client.get(f"/v1/conversations/{conversation_id}/permissions")
    assert reply.status_code == 200, reply.text
    return reply.json()["items"]


async def answered(conversation: Conversation, content: str, decision: str,
                   **fields: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Send `content` (not streamed: answered 202 at once), answer the permission request it makes; the
    request and the turn's result, read with `GET …/turns/{turn_id}?wait=S`."""
    client = conversation.client
    with anyio.fail_after(20):
        reply = await conversation.send(content, **fields)
        assert reply.status_code == 202, reply.text
        request = await asked(client, conversation.id)
        decided = await decide(client, conversation.id, request["request_id"], decision)
        assert decided.status_code == 200, decided.text
        return request, await turn_of(client, conversation.id, reply.json()["turn_id"], wait=20)


async def turn_of(client: httpx.AsyncClient, conversation_id: str, turn_id: str,
                  **params: Any) -> dict[str, Any]:
    """`GET …/turns/{turn_id}` (`params`: wait), answered 200."""
    reply = await client.get(f"/v1/conversations/{conversation_id}/turns/{turn_id}", params=params)
    assert reply.status_code == 200, reply.text
    return reply.json()


async def test_ask_waits_for_a_yes_then_the_turn_goes_on(served: Served, client: httpx.AsyncClient) -> None:
    conversation = await Conversation.create(client, "careful")
    conversation_id = conversation.id
    streamed = []
    with anyio.fail_after(20):
        async with conversation.streaming("run echo approved") as events:
            async for event in events:
                streamed.append(event)
                if event.name != "permission.requested":
                    continue
                request = event.data
                turn_id = streamed[0].data["turn_id"]
                assert (await conversation.get())["status"] == "waiting"
                turns = await conversation.turns()
                assert [(t["id"], t["status"]) for t in turns] == [(turn_id, "waiting")]
                [pending] = await audit(client, conversation_id)
                assert pending["status"] == "pending" and pending["decided_by"] is None
                assert "echo approved" not in served.ran()
                decided = await decide(client, conversation_id, request["request_id"], "allow")
                assert decided.status_code == 200, decided.text
    [call] = [e.data for e in streamed if e.name == "tool.started"]
    assert request == {"request_id": request["request_id"], "turn_id": turn_id,
                       "tool_call_id": call["tool_call_id"], "name": "risky",
                       "arguments": {"command": "echo approved"}, "reason": None,
                       "expires_at": request["expires_at"]}
    assert request["request_id"] and request["expires_at"]
    assert [e.name for e in streamed if e.name != "message.delta"] == [
        "turn.started", "tool.started", "permission.requested", "tool.finished", "turn.completed"]
    said = "".join(e.data["text"] for e in streamed if e.name == "message.delta")
    assert said == "tool said: ran: echo approved"
    assert "echo approved" in served.ran()
    assert (await conversation.get())["status"] == "idle"
    turns = await conversation.turns()
    assert [t["status"] for t in turns] == ["completed"]
    [record] = await audit(client, conversation_id)
    assert record["request_id"] == request["request_id"] and record["status"] == "allowed"
    assert record["decided_by"] == "anonymous" and record["decided_at"] >= record["requested_at"]
    assert record["turn_id"] == turn_id and record["name"] == "risky"

    again = await decide(client, conversation_id, request["request_id"], "deny")
    assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"
    assert (await audit(client, conversation_id))[0]["status"] == "allowed"
    unknown = await decide(client, conversation_id, "perm_nope", "allow")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "not_found"
    elsewhere = await decide(client, (await Conversation.create(client, "careful")).id, request["request_id"],
                             "allow")
    assert elsewhere.status_code == 404
    bad = await decide(client, conversation_id, request["request_id"], "maybe")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_request"


async def test_deny_is_a_refusal_the_model_reads(served: Served, client: httpx.AsyncClient) -> None:
    conversation = await Conversation.create(client, "careful")
    request, answer = await answered(conversation, "run echo refused", "deny")
    assert answer["status"] == "completed"
    assert answer["output"] == "tool said: permission denied for risky: denied by a person"
    [result] = [m for m in answer["messages"] if m["role"] == "tool"]
    assert result["is_error"] and "echo refused" not in served.ran()
    [record] = await audit(client, conversation.id)
    assert (record["request_id"], record["status"], record["decided_by"]) == (request["request_id"], "denied",
                                                                              "anonymous")


async def test_a_hook_that_asks_tightens_an_allowed_tool(served: Served, client: httpx.AsyncClient) -> None:
    conversation = await Conversation.create(client, "hooked")
    request, answer = await answered(conversation, "tame echo hooked", "allow")
    assert request["name"] == "tame" and request["reason"] == "tame needs a human"
    assert answer["output"] == "tool said: ran: echo hooked" and "echo hooked" in served.ran()


async def test_a_second_message_while_waiting_follows_the_busy_rules(served: Served,
                                                                   client: httpx.AsyncClient) -> None:
    conversation = await Conversation.create(client, "careful")
    conversation_id = conversation.id
    with anyio.fail_after(20):
        first = await conversation.send("run echo never approved")
        request = await asked(client, conversation_id)
        rejected = await conversation.send("hello")
        assert rejected.status_code == 409
        assert rejected.json()["error"]["code"] == "conversation_busy"
        assert rejected.json()["error"]["details"]["turn_id"] == request["turn_id"]
        second = await conversation.send("hello", if_busy="interrupt")
    assert second.status_code == 200 and second.json()["status"] == "completed"
    assert second.json()["output"] == "hello"
    assert first.status_code == 202 and first.json()["turn_id"] == request["turn_id"]
    assert first.json()["status"] == "waiting"
    assert (await turn_of(client, conversation_id, request["turn_id"]))["status"] == "cancelled"
    turns = await conversation.turns()
    assert [t["status"] for t in turns] == ["cancelled", "completed"]
    assert "echo never approved" not in served.ran()
    [record] = await audit(client, conversation_id)
    assert (record["status"], record["decided_by"]) == ("cancelled", "cancellation") and record["decided_at"]
    late = await decide(client, conversation_id, request["request_id"], "allow")
    assert late.status_code == 409 and late.json()["error"]["code"] == "conflict"
    assert "echo never approved" not in served.ran()


async def test_an_unanswered_request_expires_as_a_deny(tmp_path: Path) -> None:
    with serving(tmp_path, permission_timeout_s=1) as served:
        async with httpx.AsyncClient(base_url=served.url, timeout=15, trust_env=False) as client:
            conversation = await Conversation.create(client, "careful")
            with anyio.fail_after(20):
                waiting = await conversation.send("run echo too late")
                assert waiting.status_code == 202, waiting.text
                answer = await turn_of(client, conversation.id, waiting.json()["turn_id"], wait=20)
            assert answer["status"] == "completed"
            assert answer["output"] == (
                "tool said: permission denied for risky: the permission request expired after 1s")
            [record] = await audit(client, conversation.id)
            late = await decide(client, conversation.id, record["request_id"], "allow")
    assert record["status"] == "expired" and record["decided_by"] == "expiry"
    assert record["decided_at"] >= record["expires_at"] > record["requested_at"]
    assert late.status_code == 409 and "echo too late" not in served.ran()


async def test_a_decision_names_the_key_by_its_fingerprint(tmp_path: Path) -> None:
    fingerprint = "key:" + hashlib.sha256(KEY.encode()).hexdigest()[:12]
    headers = {"Authorization": f"Bearer {KEY}"}
    with serving(tmp_path, api_keys=f"other-key,{KEY}") as served:
        async with httpx.AsyncClient(base_url=served.url, timeout=15, trust_env=False,
                                     headers=headers) as client:
            conversation = await Conversation.create(client, "careful")
            request, answer = await answered(conversation, "run echo keyed", "allow")
            raw = (await client.get(f"{conversation.path}/permissions")).text
            async with httpx.AsyncClient(base_url=served.url, trust_env=False) as anonymous:
                refused = await decide(anonymous, conversation.id, request["request_id"], "deny")
    assert answer["output"] == "tool said: ran: echo keyed"
    [record] = json.loads(raw)["items"]
    assert record["decided_by"] == fingerprint and record["decided_at"]
    assert KEY not in raw
    assert refused.status_code == 401


async def test_over_mcp_a_call_that_needs_approval_says_how(served: Served,
                                                            client: httpx.AsyncClient) -> None:
    with anyio.fail_after(20):
        async with Client(served.url + "/mcp") as mcp_client:
            result = await mcp_client.call_tool("careful", {"message": "run echo via mcp"})
    assert result.is_error
    text = "".join(c.text for c in result.content if isinstance(c, types.TextContent))
    assert text.startswith("[permission_required] careful wants to call risky"), text
    found = re.search(r"/v1/conversations/(\S+)/permissions/(\S+) with", text)
    assert found, text
    conversation_id, request_id = found.groups()
    [pending] = await audit(client, conversation_id)
    assert pending["request_id"] == request_id and pending["status"] == "pending"
    assert "echo via mcp" not in served.ran()
    with anyio.fail_after(20):
        assert (await decide(client, conversation_id, request_id, "allow")).status_code == 200
        events = await read_events(client, conversation_id, ended(pending["turn_id"]))
    assert events[-1].name == "turn.completed"
    messages = (await client.get(f"/v1/conversations/{conversation_id}/messages")).json()["items"]
    assert [(m["role"], m["content"]) for m in messages if m["role"] != "tool"] == [
        ("user", "run echo via mcp"), ("assistant", ""), ("assistant", "tool said: ran: echo via mcp")]
    assert "echo via mcp" in served.ran()


# --- a client that does not stream: 202 at once, then GET …/turns/{turn_id} ----------------------------


async def test_a_message_not_streamed_answers_202_at_once_while_a_permission_waits(
        served: Served, client: httpx.AsyncClient) -> None:
    conversation = await Conversation.create(client, "careful")
    with anyio.fail_after(15):  # the request expires after 300 s: the answer used to wait for that
        reply = await conversation.send("run echo later", key="k-later")
    assert reply.status_code == 202, reply.text
    waiting = reply.json()
    turn_id = waiting["turn_id"]
    [request] = waiting["permission_requests"]
    assert waiting == {"turn_id": turn_id, "digest": conversation.created["digest"], "status": "waiting",
                       "permission_requests": [{"request_id": request["request_id"], "tool": "risky",
                                                "input": {"command": "echo later"},
                                                "expires_at": request["expires_at"]}]}
    [pending] = await audit(client, conversation.id)
    assert (pending["request_id"], pending["expires_at"]) == (request["request_id"], request["expires_at"])

    with anyio.fail_after(15):
        now = await turn_of(client, conversation.id, turn_id)
        held = await turn_of(client, conversation.id, turn_id, wait=0.2)  # answered as it is once S passed
        again = await conversation.send("run echo later", key="k-later")  # a retry: the same answer
    for seen in (now, held):
        assert seen["status"] == "waiting" and seen["permission_requests"] == waiting["permission_requests"]
        assert (seen["id"], seen["turn_id"], seen["digest"]) == (turn_id, turn_id, waiting["digest"])
        assert (seen["output"], seen["ended_at"], seen["attempts"]) == (None, None, 1)
        assert len(seen["trace_id"]) == 32 and int(seen["trace_id"], 16)
        assert [(s["kind"], s["name"], s["outcome"], s["ended_at"] is None, s["attempt"])
                for s in seen["steps"]] == [("model", "careful", "ok", False, 1),
                                            ("tool", "risky", "running", True, 1),
                                            ("permission", "risky", "pending", True, 1)]
        assert seen["messages"][-1]["role"] == "assistant" and seen["messages"][-1]["tool_calls"]
    assert again.status_code == 202 and again.json() == waiting
    assert "echo later" not in served.ran()

    result: dict[str, Any] = {}

    async def read_when_ended() -> None:
        result.update(await turn_of(client, conversation.id, turn_id, wait=60))

    with anyio.fail_after(20):  # well before the 60 s: the answer comes when the turn ends
        async with anyio.create_task_group() as tg:
            tg.start_soon(read_when_ended)
            assert (await decide(client, conversation.id, request["request_id"], "allow")).status_code == 200
        retried = await conversation.send("run echo later", key="k-later")
    assert result["status"] == "completed" and result["output"] == "tool said: ran: echo later"
    assert "permission_requests" not in result and result["ended_at"] and result["stop_reason"]
    assert [m["role"] for m in result["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert retried.status_code == 200, retried.text
    assert retried.json() == {k: result[k] for k in ("turn_id", "digest", "status", "output", "messages")}
    [listed] = await conversation.turns()
    assert {k: result[k] for k in listed} == listed  # every field of the list, as the list has it


async def test_reading_a_turn_refuses_a_bad_wait_and_an_unknown_turn(served: Served,
                                                                     client: httpx.AsyncClient) -> None:
    conversation = await Conversation.create(client, "careful")
    answer = await conversation.say("hello", bound=15)
    path = f"{conversation.path}/turns/{answer['turn_id']}"
    for wait in ("0", "-1", "60.5", "abc", "nan", "inf", ""):
        bad = await client.get(path, params={"wait": wait})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_request", (wait, bad.text)
    ended = (await client.get(path, params={"wait": "60"})).json()  # ended: answered at once
    assert (ended["status"], ended["output"]) == ("completed", "hello") and "permission_requests" not in ended
    other = await Conversation.create(client, "careful")
    for where in (f"{conversation.path}/turns/turn_nope", f"{other.path}/turns/{answer['turn_id']}"):
        unknown = await client.get(where)
        assert unknown.status_code == 404, unknown.text
        assert unknown.json()["error"]["code"] == "turn_not_found"
    gone = await client.get(f"/v1/conversations/conv_nope/turns/{answer['turn_id']}")
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "conversation_not_found"


# --- the OpenAI-compatible route ---------------------------------------------------------------------


async def openai_conversations(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    reply = await client.get("/v1/conversations", params={"agent": "careful", "limit": 1000})
    return [c for c in reply.json()["items"] if c["metadata"].get("source") == "openai"]


async def test_the_openai_route_refuses_a_turn_that_waits_on_a_person_once(served: Served,
                                                                          client: httpx.AsyncClient) -> None:
    """409 `permission_required`, which OpenAI's client would retry (a new turn each time) but for
    `x-should-retry: false`; streamed, an error chunk ends the stream."""
    before = len(await openai_conversations(client))
    async with httpx.AsyncClient(trust_env=False, timeout=20) as http:
        oai = openai.AsyncOpenAI(base_url=f"{served.url}/v1", api_key="x", http_client=http)  # 2 retries
        with pytest.raises(openai.APIStatusError) as caught, anyio.fail_after(20):
            await oai.chat.completions.create(model="careful",
                                              messages=[{"role": "user", "content": "run echo via openai"}])
        with pytest.raises(openai.APIError) as streamed, anyio.fail_after(20):
            stream = await oai.chat.completions.create(
                model="careful", messages=[{"role": "user", "content": "run echo streamed"}], stream=True)
            async for _ in stream:
                pass
    refused = caught.value
    assert refused.status_code == 409 and refused.response.headers["x-should-retry"] == "false"
    error = refused.body
    assert isinstance(error, dict) and error["code"] == "permission_required", error
    assert "needs a person's approval" in error["message"]
    assert isinstance(streamed.value.body, dict) and streamed.value.body["code"] == "permission_required"
    made = await openai_conversations(client)
    assert len(made) == before + 2  # one turn each: nothing was retried
    details = error["details"]
    [request] = details["permission_requests"]
    assert (request["tool"], request["input"]) == ("risky", {"command": "echo via openai"})
    with anyio.fail_after(20):  # the turn goes on once someone answers
        path = f"/v1/conversations/{details['conversation_id']}"
        decided = await client.post(f"{path}/permissions/{request['request_id']}", json={"decision": "allow"})
        assert decided.status_code == 200, decided.text
        result = await turn_of(client, details["conversation_id"], details["turn_id"], wait=20)
    assert result["output"] == "tool said: ran: echo via openai"
