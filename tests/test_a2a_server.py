"""Every agent an A2A agent (CONTRACT §14), driven with the official `a2a-sdk` client against a real
`corral serve` with API keys: cards for a name, a digest and an alias; send, stream, get, list,
cancel, subscribe; a tool call waiting on `ask` as input-required, answered through A2A and through
the permissions route; the 0.3 method names on the wire; auth, Host and Origin as on every route.

The scripted model: "say X" answers "said X"; "wait PATH" blocks in the `gate` tool until PATH
exists (a gate never opened is the slow tool a cancel stops); "risky X" calls a tool that asks.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from a2a.client import A2ACardResolver, Client, ClientConfig, create_client
from a2a.helpers import get_artifact_text, get_data_parts, new_text_message
from a2a.types.a2a_pb2 import (
    ROLE_USER,
    TASK_STATE_CANCELED,
    TASK_STATE_COMPLETED,
    TASK_STATE_INPUT_REQUIRED,
    TASK_STATE_WORKING,
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    SendMessageConfiguration,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
)
from a2a.utils.errors import TaskNotCancelableError, TaskNotFoundError
from google.protobuf.struct_pb2 import Value

from tests.support.servers import ServerProcess
from tests.support.trees import gate_yaml, open_gate, write_tree

pytestmark = pytest.mark.anyio
KEY = "k-a2a-7d3e91"
AUTH = {"Authorization": f"Bearer {KEY}"}
SCRIPT = [
    {"when": "^say (?P<what>.+)$", "reply": "said {what}"},
    {"when": "^wait (?P<path>\\S+)", "tool_call": {"name": "gate", "arguments": {"path": "{path}"}},
     "reply": "passed the gate"},
    {"when": "^risky (?P<what>.+)$", "tool_call": {"name": "risky", "arguments": {"what": "{what}"}},
     "reply": "tool said: {tool_result}"},
]


def definitions(root: Path) -> Path:
    documents = [
        {"kind": "Model", "name": "scripted", "provider": "scripted", "script": SCRIPT},
        {"kind": "Tool", "name": "risky", "description": "Prints its input; asks first.", "permission": "ask",
         "input_schema": {"type": "object", "properties": {"what": {"type": "string"}}, "required": ["what"]},
         "command": {"argv": [sys.executable, "-c", "import sys; print('ran ' + sys.argv[1])", "{what}"],
                     "timeout_s": 10}},
        {"kind": "Agent", "name": "helper", "description": "Says things, waits at gates, asks first.",
         "model": "scripted", "tools": ["gate", "risky"]},
        {"kind": "Agent", "name": "other", "model": "scripted"},
    ]
    return write_tree(root, {"defs.yaml": "\n---\n".join(json.dumps(d) for d in documents),
                             "tools.yaml": gate_yaml()})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("a2a")
    with ServerProcess(definitions(root / "defs"), root / "state",
                       env={"CORRAL_API_KEYS": KEY, "CORRAL_SHUTDOWN_GRACE_S": "1"}) as running:
        yield running


@pytest.fixture
async def http(server: ServerProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, headers=AUTH, timeout=30, trust_env=False) as client:
        yield client


def base(http: httpx.AsyncClient) -> str:
    return str(http.base_url).rstrip("/")


async def a2a_client(http: httpx.AsyncClient, ref: str = "helper", *, streaming: bool = False) -> Client:
    return await create_client(f"{base(http)}/a2a/{ref}",
                               client_config=ClientConfig(httpx_client=http, streaming=streaming))


def said(text: str, *, context_id: str = "", task_id: str = "") -> SendMessageRequest:
    message = new_text_message(text, context_id=context_id or None, task_id=task_id or None, role=ROLE_USER)
    return SendMessageRequest(message=message)


def decision(task: Task, request_id: str, answer: str) -> SendMessageRequest:
    data = Value()
    data.struct_value.update({"request_id": request_id, "decision": answer})
    message = Message(message_id=f"decide-{request_id}", task_id=task.id, context_id=task.context_id,
                      role=ROLE_USER, parts=[Part(data=data)])
    return SendMessageRequest(message=message)


async def only_task(client: Client, request: SendMessageRequest) -> Task:
    """The task a non-streaming send answers with."""
    responses = [r async for r in client.send_message(request)]
    assert len(responses) == 1 and responses[0].HasField("task"), responses
    return responses[0].task


async def streamed(client: Client, request: SendMessageRequest) -> list[StreamResponse]:
    with anyio.fail_after(30):
        return [r async for r in client.send_message(request)]


def asked_requests(task_status_message: Message) -> list[dict[str, Any]]:
    (data,) = get_data_parts(task_status_message.parts)
    return data["permission_requests"]


async def digest_of(http: httpx.AsyncClient, agent: str) -> str:
    reply = await http.get(f"/v1/agents/{agent}")
    assert reply.status_code == 200, reply.text
    return reply.json()["digest"]


async def turn_of(http: httpx.AsyncClient, context_id: str, task_id: str) -> dict[str, Any]:
    reply = await http.get(f"/v1/conversations/{context_id}/turns/{task_id}")
    assert reply.status_code == 200, reply.text
    return reply.json()


# --- cards ----------------------------------------------------------------------------------------


async def test_a_card_for_a_name_a_digest_and_an_alias_names_the_digest_it_serves(
        http: httpx.AsyncClient) -> None:
    digest = await digest_of(http, "helper")
    put = await http.put("/v1/agents/helper/aliases/prod", json={"digest": digest})
    assert put.status_code == 200, put.text
    for ref in ("helper", f"helper@{digest}", "helper@prod"):
        reply = await http.get(f"/a2a/{ref}/.well-known/agent-card.json")
        assert reply.status_code == 200, reply.text
        card = reply.json()
        assert card["name"] == "helper" and card["version"] == digest
        assert card["description"] == "Says things, waits at gates, asks first."
        endpoint = f"{base(http)}/a2a/{ref}"
        interfaces = {(i["url"], i["protocolBinding"], i["protocolVersion"])
                      for i in card["supportedInterfaces"]}
        assert interfaces == {(endpoint, "JSONRPC", "1.0"), (endpoint, "JSONRPC", "0.3")}
        assert card["url"] == endpoint  # the 0.3 fields, beside the 1.0 ones
        assert card["capabilities"]["streaming"] is True
        assert [s["id"] for s in card["skills"]] == ["helper"]
        assert card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] == "Bearer"
        parsed = await A2ACardResolver(http, endpoint).get_agent_card()  # the SDK reads it as it is served
        assert parsed.version == digest and parsed.capabilities.streaming
    other = (await http.get("/a2a/other/.well-known/agent-card.json")).json()
    assert other["version"] == await digest_of(http, "other") and other["skills"][0]["id"] == "other"


async def test_an_unknown_agent_is_a_404_for_its_card_and_its_endpoint(http: httpx.AsyncClient) -> None:
    card = await http.get("/a2a/nobody/.well-known/agent-card.json")
    assert card.status_code == 404 and card.json()["error"]["code"] == "agent_not_found"
    call = await http.post("/a2a/nobody", json={"jsonrpc": "2.0", "id": 1, "method": "GetTask",
                                                "params": {"id": "x"}})
    assert call.status_code == 404 and call.json()["error"]["code"] == "agent_not_found"
    bad = await http.get("/a2a/helper@sha256:" + "0" * 64 + "/.well-known/agent-card.json")
    assert bad.status_code == 404 and bad.json()["error"]["code"] == "digest_not_found"


# --- send, stream, get, list ----------------------------------------------------------------------


async def test_send_answers_with_the_task_and_a_follow_up_continues_the_context(
        http: httpx.AsyncClient) -> None:
    client = await a2a_client(http)
    first = await only_task(client, said("say hello"))
    assert first.status.state == TASK_STATE_COMPLETED
    assert get_artifact_text(first.artifacts[0]) == "said hello"
    assert first.metadata["digest"] == await digest_of(http, "helper")
    turn = await turn_of(http, first.context_id, first.id)  # the context is a conversation, the task a turn
    assert turn["status"] == "completed" and turn["output"] == "said hello"
    second = await only_task(client, said("say again", context_id=first.context_id))
    assert second.context_id == first.context_id and second.id != first.id
    conversation = (await http.get(f"/v1/conversations/{first.context_id}")).json()
    assert [t["id"] for t in conversation["turns"]] == [first.id, second.id]
    assert conversation["agent"] == "helper"
    got = await client.get_task(GetTaskRequest(id=second.id))
    assert got.status.state == TASK_STATE_COMPLETED and get_artifact_text(got.artifacts[0]) == "said again"
    listed = await client.list_tasks(ListTasksRequest(context_id=first.context_id, include_artifacts=True))
    assert [t.id for t in listed.tasks] == [second.id, first.id] and listed.total_size == 2
    paged = await client.list_tasks(ListTasksRequest(context_id=first.context_id, page_size=1))
    assert [t.id for t in paged.tasks] == [second.id] and paged.next_page_token
    rest = await client.list_tasks(ListTasksRequest(context_id=first.context_id, page_size=1,
                                                    page_token=paged.next_page_token))
    assert [t.id for t in rest.tasks] == [first.id] and not rest.next_page_token
    everywhere = await client.list_tasks(ListTasksRequest(status=TASK_STATE_COMPLETED))  # every context
    assert {first.id, second.id} <= {t.id for t in everywhere.tasks}
    assert all(t.status.state == TASK_STATE_COMPLETED for t in everywhere.tasks)
    with pytest.raises(TaskNotFoundError):
        await client.get_task(GetTaskRequest(id="turn_nothing"))
    other = await a2a_client(http, "other")  # another agent's endpoint does not show helper's tasks
    with pytest.raises(TaskNotFoundError):
        await other.get_task(GetTaskRequest(id=first.id))


async def test_a_retried_message_id_finds_the_task_it_started(http: httpx.AsyncClient) -> None:
    client = await a2a_client(http)
    first = await only_task(client, said("say once"))
    retry = said("say once", context_id=first.context_id)
    retry.message.message_id = "retry-1"
    one = await only_task(client, retry)
    again = await only_task(client, retry)
    assert one.id == again.id
    turns = (await http.get(f"/v1/conversations/{first.context_id}")).json()["turns"]
    assert len(turns) == 2


async def test_stream_sends_the_task_then_updates_until_it_completes(http: httpx.AsyncClient) -> None:
    client = await a2a_client(http, streaming=True)
    events = await streamed(client, said("say streamed words"))
    assert events[0].HasField("task") and events[0].task.status.state == TASK_STATE_WORKING
    task_id = events[0].task.id
    chunks = [e.artifact_update for e in events if e.HasField("artifact_update")]
    assert chunks and all(c.task_id == task_id for c in chunks)
    assert chunks[-1].last_chunk and get_artifact_text(chunks[-1].artifact) == "said streamed words"
    assert events[-1].HasField("status_update")
    assert events[-1].status_update.status.state == TASK_STATE_COMPLETED
    got = await client.get_task(GetTaskRequest(id=task_id))
    assert got.status.state == TASK_STATE_COMPLETED


# --- cancel, subscribe ----------------------------------------------------------------------------


async def test_cancel_stops_a_slow_tool_and_the_turn_ends_cancelled(http: httpx.AsyncClient,
                                                                     tmp_path: Path) -> None:
    client = await a2a_client(http)
    request = said(f"wait {tmp_path / 'never'}")
    request.configuration.CopyFrom(SendMessageConfiguration(return_immediately=True))
    task = await only_task(client, request)
    assert task.status.state == TASK_STATE_WORKING
    cancelled = await client.cancel_task(CancelTaskRequest(id=task.id))
    assert cancelled.status.state == TASK_STATE_CANCELED
    assert (await turn_of(http, task.context_id, task.id))["status"] == "cancelled"
    with pytest.raises(TaskNotCancelableError):
        await client.cancel_task(CancelTaskRequest(id=task.id))
    listed = await client.list_tasks(ListTasksRequest(context_id=task.context_id))
    assert [t.status.state for t in listed.tasks] == [TASK_STATE_CANCELED]


async def test_subscribe_rejoins_a_running_task_until_it_ends(http: httpx.AsyncClient,
                                                              tmp_path: Path) -> None:
    client = await a2a_client(http, streaming=True)
    gate = tmp_path / "gate"
    request = said(f"wait {gate}")
    request.configuration.CopyFrom(SendMessageConfiguration(return_immediately=True))
    plain = await a2a_client(http)
    task = await only_task(plain, request)
    seen: list[StreamResponse] = []
    with anyio.fail_after(30):
        async for event in client.subscribe(SubscribeToTaskRequest(id=task.id)):
            seen.append(event)
            if len(seen) == 1:
                assert event.HasField("task") and event.task.status.state == TASK_STATE_WORKING
                open_gate(gate)
    assert seen[-1].status_update.status.state == TASK_STATE_COMPLETED
    texts = [get_artifact_text(e.artifact_update.artifact) for e in seen if e.HasField("artifact_update")]
    assert texts[-1] == "passed the gate"


# --- input-required -------------------------------------------------------------------------------


async def test_a_tool_waiting_on_ask_is_input_required_and_an_a2a_message_answers_it(
        http: httpx.AsyncClient) -> None:
    client = await a2a_client(http)
    task = await only_task(client, said("risky one"))
    assert task.status.state == TASK_STATE_INPUT_REQUIRED
    (request,) = asked_requests(task.status.message)
    assert request["tool"] == "risky" and request["input"] == {"what": "one"}
    got = await client.get_task(GetTaskRequest(id=task.id))
    assert got.status.state == TASK_STATE_INPUT_REQUIRED
    done = await only_task(client, decision(task, request["request_id"], "allow"))
    assert done.id == task.id and done.status.state == TASK_STATE_COMPLETED
    assert get_artifact_text(done.artifacts[0]) == "tool said: ran one"
    audit = (await http.get(f"/v1/conversations/{task.context_id}/permissions")).json()["items"]
    assert [(p["status"], p["decided_by"].startswith("key:")) for p in audit] == [("allowed", True)]


async def test_a_streamed_task_stops_at_input_required_and_the_permissions_route_lets_it_go_on(
        http: httpx.AsyncClient) -> None:
    client = await a2a_client(http, streaming=True)
    events = await streamed(client, said("risky two"))
    last = events[-1].status_update
    assert last.status.state == TASK_STATE_INPUT_REQUIRED
    (request,) = asked_requests(last.status.message)
    rest: list[StreamResponse] = []
    with anyio.fail_after(30):  # rejoined while it waits, then answered through the permissions route
        async for event in client.subscribe(SubscribeToTaskRequest(id=last.task_id)):
            rest.append(event)
            if len(rest) == 1:
                assert event.task.status.state == TASK_STATE_INPUT_REQUIRED
                decided = await http.post(
                    f"/v1/conversations/{last.context_id}/permissions/{request['request_id']}",
                    json={"decision": "deny"})
                assert decided.status_code == 200, decided.text
    assert rest[-1].status_update.status.state == TASK_STATE_COMPLETED
    got = await client.get_task(GetTaskRequest(id=last.task_id))
    assert "denied" in get_artifact_text(got.artifacts[0])


# --- the 0.3 names, errors and guards -------------------------------------------------------------


async def rpc(http: httpx.AsyncClient, method: str, params: dict[str, Any], *, ref: str = "helper",
              version: str | None = None) -> dict[str, Any]:
    headers = {"A2A-Version": version} if version else {}
    reply = await http.post(f"/a2a/{ref}", headers=headers,
                            json={"jsonrpc": "2.0", "id": "r1", "method": method, "params": params})
    assert reply.status_code == 200, reply.text
    return reply.json()


async def test_the_0_3_method_names_on_the_wire(http: httpx.AsyncClient) -> None:
    message = {"kind": "message", "messageId": "m-03", "role": "user",
               "parts": [{"kind": "text", "text": "say old"}]}
    sent = await rpc(http, "message/send", {"message": message})  # no A2A-Version header: 0.3
    task = sent["result"]
    assert task["kind"] == "task" and task["status"]["state"] == "completed"
    assert task["artifacts"][0]["parts"][0]["text"] == "said old"
    got = await rpc(http, "tasks/get", {"id": task["id"]})
    assert got["result"]["id"] == task["id"] and got["result"]["contextId"] == task["contextId"]
    missing = await rpc(http, "tasks/get", {"id": "turn_nothing"})
    assert missing["error"]["code"] == -32001  # TaskNotFoundError
    # the 1.0 names answer 1.0 shapes
    new = await rpc(http, "SendMessage", {"message": {"messageId": "m-10", "role": "ROLE_USER",
                                                      "parts": [{"text": "say new"}]}}, version="1.0")
    assert new["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    # the SDK's own 0.3 client, from a card that offers only the 0.3 interface
    card = await A2ACardResolver(http, f"{base(http)}/a2a/helper").get_agent_card()
    del card.supported_interfaces[0]
    wire: list[tuple[str, str]] = []

    async def note(request: httpx.Request) -> None:
        wire.append((request.headers.get("a2a-version", ""), json.loads(request.content)["method"]))

    async with httpx.AsyncClient(headers=AUTH, timeout=30, trust_env=False,
                                 event_hooks={"request": [note]}) as watched:
        old = await create_client(card, client_config=ClientConfig(httpx_client=watched, streaming=False))
        answered = await only_task(old, said("say through 0.3"))
        assert get_artifact_text(answered.artifacts[0]) == "said through 0.3"
        streaming = ClientConfig(httpx_client=watched, streaming=True)
        old_stream = await create_client(card, client_config=streaming)
        events = await streamed(old_stream, said("say streamed in 0.3"))
    assert wire == [("0.3", "message/send"), ("0.3", "message/stream")]
    assert events[-1].status_update.status.state == TASK_STATE_COMPLETED
    chunks = [e.artifact_update for e in events if e.HasField("artifact_update")]
    assert get_artifact_text(chunks[-1].artifact) == "said streamed in 0.3"


async def test_errors_come_from_the_error_table(http: httpx.AsyncClient) -> None:
    no_text = {"message": {"messageId": "m-e", "role": "ROLE_USER", "parts": []}}
    empty = await rpc(http, "SendMessage", no_text, version="1.0")
    assert empty["error"]["code"] == -32602
    assert empty["error"]["data"][0]["metadata"]["code"] == "invalid_request"
    nowhere = await rpc(http, "SendMessage", {"message": {"messageId": "m-n", "role": "ROLE_USER",
                                                          "contextId": "conv_nothing",
                                                          "parts": [{"text": "say x"}]}}, version="1.0")
    assert nowhere["error"]["data"][0]["metadata"]["code"] == "conversation_not_found"
    lone = b'{"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "\\ud800"}}'
    surrogate = await http.post("/a2a/helper", content=lone, headers={"content-type": "application/json"})
    assert surrogate.status_code == 400 and surrogate.json()["error"]["code"] == "invalid_request"


async def test_keys_host_and_origin_guard_the_cards_and_the_endpoint(server: ServerProcess) -> None:
    card_path = "/a2a/helper/.well-known/agent-card.json"
    body = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}}
    async with httpx.AsyncClient(base_url=server.url, timeout=30, trust_env=False) as anonymous:
        assert (await anonymous.get(card_path)).status_code == 401
        assert (await anonymous.post("/a2a/helper", json=body)).status_code == 401
        keyed = {**AUTH}
        foreign = await anonymous.post("/a2a/helper", json=body, headers={**keyed, "Origin": "https://evil.example"})
        assert foreign.status_code == 403
        rebound = await anonymous.get(card_path, headers={**keyed, "Host": "evil.example"})
        assert rebound.status_code == 421


async def test_public_cards_need_no_key_but_the_endpoint_does(tmp_path: Path) -> None:
    env = {"CORRAL_API_KEYS": KEY, "CORRAL_A2A_PUBLIC_CARDS": "1"}
    with ServerProcess(definitions(tmp_path / "defs"), tmp_path / "state", env=env) as running:
        async with httpx.AsyncClient(base_url=running.url, timeout=30, trust_env=False) as anonymous:
            card = await anonymous.get("/a2a/helper/.well-known/agent-card.json")
            assert card.status_code == 200 and card.json()["securitySchemes"]["bearer"]
            call = await anonymous.post("/a2a/helper", json={"jsonrpc": "2.0", "id": 1, "method": "GetTask",
                                                             "params": {"id": "x"}})
            assert call.status_code == 401
            assert (await anonymous.get("/v1/agents")).status_code == 401


async def test_a_streamed_decision_streams_the_task_on_to_its_end(http: httpx.AsyncClient) -> None:
    client = await a2a_client(http, streaming=True)
    asked = (await streamed(client, said("risky three")))[-1].status_update
    assert asked.status.state == TASK_STATE_INPUT_REQUIRED
    (request,) = asked_requests(asked.status.message)
    task = Task(id=asked.task_id, context_id=asked.context_id)
    events = await streamed(client, decision(task, request["request_id"], "allow"))
    assert events[0].task.id == task.id  # the same task, followed on (its answered request not asked again)
    states = [e.status_update.status.state for e in events if e.HasField("status_update")]
    assert TASK_STATE_INPUT_REQUIRED not in states and states[-1] == TASK_STATE_COMPLETED
    chunks = [e.artifact_update for e in events if e.HasField("artifact_update")]
    assert get_artifact_text(chunks[-1].artifact) == "tool said: ran three"
