"""Whole turns through the HTTP API, on each provider, with faults injected by the fake servers.

Corral runs for real on loopback and talks to FakeOpenAI / FakeAnthropic over
the real wire protocols; each test scripts what the fake answers next and
reads the outcome only through the API (the answer, the transcript, the
turns, the events).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.fakes import Call, Malformed, Reply, Stall, Status, serve
from tests.support.client import Conversation, talk
from tests.support.events import ended
from tests.support.fake_models import Fakes
from tests.support.servers import corral_server
from tests.support.trees import write_tree

pytestmark = pytest.mark.anyio

OPENAI_KEY = "sk-openai-fake-7f3a9c-never-echo"
ANTHROPIC_KEY = "sk-ant-fake-51d2e8-never-echo"
SHOUT = Call("shout", {"text": "hello world"}, id="call_shout", pieces=4)  # arguments arrive in 4 pieces
TOOL_TURN = (Reply(calls=(SHOUT,), usage=(20, 5)), Reply(text="It said HELLO WORLD", usage=(30, 6)))
TOOL_TURN_USAGE = {"input_tokens": 50, "output_tokens": 11}


def definitions(root: Path, openai_url: str, anthropic_url: str) -> Path:
    openai = f"provider: openai\nbase_url: {openai_url}/v1\napi_key: ${{CORRAL_TEST_OPENAI_KEY}}"
    anthropic = f"provider: anthropic\nbase_url: {anthropic_url}\napi_key: ${{CORRAL_TEST_ANTHROPIC_KEY}}"
    models = [
        f"name: gpt\nmodel: gpt-fake\n{openai}\ntimeout_s: 2",  # retries: the default, 2
        f"name: claude\nmodel: claude-fake\n{anthropic}\ntimeout_s: 2",
        f"name: gpt_once\nmodel: gpt-once\n{openai}\ntimeout_s: 0.5\nretries: 0",
        f"name: primary\nmodel: gpt-primary\n{openai}\ntimeout_s: 2\nretries: 0\nfallbacks: [claude]",
    ]
    agents = {"via_openai": "gpt", "via_anthropic": "claude", "via_scripted": "offline",
              "impatient": "gpt_once", "with_fallback": "primary"}
    return write_tree(root, {
        "models.yaml": "\n---\n".join(f"kind: Model\n{m}" for m in models) + """
---
kind: Model
name: offline
provider: scripted
script:
  - when: "^shout (?P<text>.+)"
    tool_call: { name: shout, arguments: { text: "{text}" } }
    reply: "The tool said {tool_result}"
""",
        "agents.yaml": "\n---\n".join(
            f"kind: Agent\nname: {name}\nmodel: {model}\ninstructions: Be brief.\ntools: [shout]"
            for name, model in agents.items()
        ),
        "tools.yaml": """
            kind: Tool
            name: shout
            description: The text in capitals.
            input_schema:
              type: object
              properties: { text: { type: string } }
              required: [text]
            command:
              argv: [python3, -c, "import sys; print(sys.argv[1].upper())", "{text}"]
              timeout_s: 10
        """,
    })


@pytest.fixture(scope="module")
def fakes() -> Iterator[Fakes]:
    yield Fakes()


@pytest.fixture(scope="module")
def base_url(fakes: Fakes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("turns")
    with pytest.MonkeyPatch.context() as env, serve(fakes.openai.app) as openai_url, \
            serve(fakes.anthropic.app) as anthropic_url:
        env.setenv("CORRAL_TEST_OPENAI_KEY", OPENAI_KEY)
        env.setenv("CORRAL_TEST_ANTHROPIC_KEY", ANTHROPIC_KEY)
        with corral_server(definitions(root / "defs", openai_url, anthropic_url), root / "state") as url:
            yield url


@pytest.fixture
async def client(base_url: str, fakes: Fakes) -> AsyncIterator[httpx.AsyncClient]:
    async with fakes.client(base_url) as http:
        yield http


async def check_tool_turn(conversation: Conversation, answer: dict[str, Any], output: str,
                          usage: dict[str, int] | None) -> None:
    """The answer, transcript and turn record of a turn that called `shout` once."""
    assert answer["status"] == "completed" and answer["output"] == output
    roles = ["user", "assistant", "tool", "assistant"]
    assert [m["role"] for m in answer["messages"]] == roles
    call = answer["messages"][1]["tool_calls"][0]
    assert call["name"] == "shout" and call["arguments"] == {"text": "hello world"}
    assert answer["messages"][2]["content"] == "HELLO WORLD\n"
    assert answer["messages"][2]["tool_call_id"] == call["id"]
    transcript = await conversation.messages()
    assert [{k: m[k] for k in answer["messages"][i]} for i, m in enumerate(transcript)] == answer["messages"]
    record = await conversation.get()
    [turn] = await conversation.turns()
    assert turn["id"] == answer["turn_id"] and turn["status"] == "completed"
    assert turn["digest"] == answer["digest"] == record["digest"]
    assert turn["stop_reason"] == "end_turn" and turn["started_at"] <= turn["ended_at"]
    if usage is not None:
        assert turn["usage"] == usage
    assert record["turns"] == [{"id": turn["id"], "digest": turn["digest"], "status": "completed"}]


async def test_openai_turn_with_a_tool_call(client: httpx.AsyncClient, fakes: Fakes) -> None:
    fakes.openai.script(*TOOL_TURN)
    conversation, answer = await talk(client, "via_openai", "make it loud")
    await check_tool_turn(conversation, answer, "It said HELLO WORLD", TOOL_TURN_USAGE)

    first, second = (r.body for r in fakes.openai.requests)
    assert first["model"] == "gpt-fake" and first["stream"] is True
    assert [t["function"]["name"] for t in first["tools"]] == ["shout"]
    assert first["messages"][0] == {"role": "system", "content": "Be brief."}
    assert json.loads(second["messages"][-2]["tool_calls"][0]["function"]["arguments"]) == SHOUT.arguments
    tool_message = {"role": "tool", "tool_call_id": "call_shout", "content": "HELLO WORLD\n"}
    assert second["messages"][-1] == tool_message
    assert all(r.headers["authorization"] == f"Bearer {OPENAI_KEY}" for r in fakes.openai.requests)


async def test_anthropic_turn_with_a_tool_call(client: httpx.AsyncClient, fakes: Fakes) -> None:
    fakes.anthropic.script(*TOOL_TURN)
    conversation, answer = await talk(client, "via_anthropic", "make it loud")
    await check_tool_turn(conversation, answer, "It said HELLO WORLD", TOOL_TURN_USAGE)

    first, second = (r.body for r in fakes.anthropic.requests)
    assert first["model"] == "claude-fake" and first["system"] == "Be brief."
    assert [t["name"] for t in first["tools"]] == ["shout"]
    [result] = second["messages"][-1]["content"]
    assert second["messages"][-1]["role"] == "user"
    assert result["type"] == "tool_result" and result["tool_use_id"] == "call_shout"
    assert "HELLO WORLD" in json.dumps(result["content"])
    assert all(r.headers["x-api-key"] == ANTHROPIC_KEY for r in fakes.anthropic.requests)


async def test_scripted_turn_with_a_tool_call(client: httpx.AsyncClient) -> None:
    conversation, answer = await talk(client, "via_scripted", "shout hello world")
    await check_tool_turn(conversation, answer, "The tool said HELLO WORLD", None)
    [turn] = await conversation.turns()
    assert turn["usage"]["input_tokens"] > 0 and turn["usage"]["output_tokens"] > 0


async def failure(conversation: Conversation, answer: dict[str, Any]) -> dict[str, Any]:
    """The error of a failed turn, checked to be the same in the answer, the turn and its event."""
    assert answer["status"] == "failed" and answer["output"] is None
    [turn] = await conversation.turns()
    assert turn["status"] == "failed"
    with anyio.fail_after(10):
        events = await conversation.events(ended(answer["turn_id"]))
    assert events[-1].name == "turn.failed"
    error = events[-1].data["error"]
    assert answer["error"] == turn["error"] == error
    assert set(error) >= {"code", "message"} and isinstance(error["message"], str)
    assert "Traceback" not in error["message"]
    return error


async def test_429_with_retry_after_then_success(client: httpx.AsyncClient, fakes: Fakes) -> None:
    fakes.openai.script(Status(429, retry_after="1", error_type="rate_limit_error"), Reply(text="made it"))
    started = time.monotonic()
    _, answer = await talk(client, "via_openai", "hi")
    assert answer["status"] == "completed" and answer["output"] == "made it"
    assert time.monotonic() - started >= 0.9  # Retry-After was honoured
    assert len(fakes.openai.requests) == 2


async def test_500_then_success(client: httpx.AsyncClient, fakes: Fakes) -> None:
    fakes.anthropic.script(Status(500, error_type="api_error"), Reply(text="made it"))
    _, answer = await talk(client, "via_anthropic", "hi")
    assert answer["status"] == "completed" and answer["output"] == "made it"
    assert len(fakes.anthropic.requests) == 2


async def test_persistent_500_fails_the_turn(client: httpx.AsyncClient, fakes: Fakes) -> None:
    fakes.openai.script(*[Status(500)] * 3)
    conversation, answer = await talk(client, "via_openai", "hi")
    error = await failure(conversation, answer)
    assert error["code"] == "model_error"
    assert len(fakes.openai.requests) == 3  # the first attempt and the default 2 retries
    assert "do not quote this body" not in json.dumps(error)


async def test_streamed_failure_ends_with_turn_failed(client: httpx.AsyncClient, fakes: Fakes) -> None:
    fakes.openai.script(Status(500))
    conversation = await Conversation.create(client, "impatient")
    with anyio.fail_after(15):
        events = await conversation.stream("hi")
    assert [e.name for e in events] == ["turn.started", "turn.failed"]
    assert events[-1].data["turn_id"] == events[0].data["turn_id"]
    assert events[-1].data["error"]["code"] == "model_error"


async def test_stalled_stream_times_out(client: httpx.AsyncClient, fakes: Fakes) -> None:
    fakes.openai.script(Stall(text="partial"))
    started = time.monotonic()
    conversation, answer = await talk(client, "impatient", "hi")
    assert time.monotonic() - started < 10  # the fake would stall for 30 s
    assert (await failure(conversation, answer))["code"] == "model_error"


async def test_malformed_chunk_before_any_output_is_retried(client: httpx.AsyncClient, fakes: Fakes) -> None:
    fakes.openai.script(Malformed(), Reply(text="made it"))
    _, answer = await talk(client, "via_openai", "hi")
    assert answer["status"] == "completed" and answer["output"] == "made it"


async def test_malformed_chunk_after_output_fails_the_turn(client: httpx.AsyncClient, fakes: Fakes) -> None:
    fakes.openai.script(Malformed(text="some text"))
    conversation, answer = await talk(client, "impatient", "hi")
    assert (await failure(conversation, answer))["code"] == "model_error"


async def test_fallback_to_the_second_model(client: httpx.AsyncClient, fakes: Fakes) -> None:
    fakes.openai.script(Status(503))
    fakes.anthropic.script(Reply(text="the fallback answered"))
    conversation, answer = await talk(client, "with_fallback", "hi")
    assert answer["status"] == "completed" and answer["output"] == "the fallback answered"
    assert [r.body["model"] for r in fakes.openai.requests] == ["gpt-primary"]
    assert [r.body["model"] for r in fakes.anthropic.requests] == ["claude-fake"]
    [turn] = await conversation.turns()
    assert turn["status"] == "completed"


async def test_api_keys_never_reach_a_response(client: httpx.AsyncClient, fakes: Fakes) -> None:
    fakes.openai.script(Status(401, error_type="invalid_request_error", message=f"bad key {OPENAI_KEY}"))
    fakes.anthropic.script(Reply(text="fine"))
    failed, answer = await talk(client, "impatient", "hi")
    assert (await failure(failed, answer))["code"] == "model_error"
    ok, _ = await talk(client, "via_anthropic", "hi")
    with anyio.fail_after(10):
        events = [e.data for c in (failed, ok) for e in await c.events(ended())]
    tails = ("", "/messages", "/turns")
    paths = ["/v1/agents", "/v1/agents/via_openai", "/v1/definitions", "/v1/definitions/model/gpt",
             "/v1/definitions/model/claude", "/v1/conversations", "/metrics", "/v1/models",
             *(f"{c.path}{tail}" for c in (failed, ok) for tail in tails)]
    bodies = [json.dumps(events)]
    for path in paths:
        r = await client.get(path)
        assert r.status_code == 200, (path, r.text)
        bodies.append(r.text)
    for body in bodies:
        assert OPENAI_KEY not in body and ANTHROPIC_KEY not in body
    spec = (await client.get("/v1/definitions/model/gpt")).json()["spec"]
    assert spec["api_key"] == "${CORRAL_TEST_OPENAI_KEY}"  # the reference is shown, never its value
