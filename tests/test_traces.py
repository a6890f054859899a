"""Traces (§13): the spans a real `corral serve` exports over OTLP/HTTP, and W3C trace context in
and out, read by a real OTLP receiver on loopback (`tests/support/otlp.py`).

One agent, `traced`, on a fake OpenAI server that records every request's headers: asked to
"work", its model calls `whereami` (a command tool that prints its `TRACEPARENT`) and `fetch` (an
http tool against a loopback recorder), then answers. The first model request is answered 503
once, so a retry is a `chat` span of its own. Every wait is on a condition, bounded.
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp.types as types
import pytest
from mcp import Client
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from tests.fakes import Call, FakeOpenAI, Reply, Status, serve
from tests.support.client import Conversation
from tests.support.otlp import OtlpReceiver, ReceivedSpan, by_name, env
from tests.support.servers import ServerProcess
from tests.support.trees import write_tree

pytestmark = pytest.mark.anyio

SECRET = "tok-5ecret-value-0042"  # in TRACES_API_TOKEN: a name that says key, so it is redacted
INBOUND_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
INBOUND_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{INBOUND_TRACE}-{INBOUND_SPAN}-01"
WORK = (Status(503, retry_after="0"),
        Reply(calls=(Call("whereami", {}, id="call_1"), Call("fetch", {}, id="call_2"))),
        Reply(text="done"))


class Recorder:
    """A loopback HTTP endpoint for the `fetch` tool: it keeps each request's headers."""

    def __init__(self) -> None:
        self.headers: list[dict[str, str]] = []
        self.app = Starlette(routes=[Route("/tool", self.tool)])

    async def tool(self, request: Request) -> PlainTextResponse:
        self.headers.append(dict(request.headers))
        return PlainTextResponse("fetched")


def definitions(root: Path, model_url: str, tool_url: str) -> Path:
    return write_tree(root, {
        "traced.yaml": f"""
            kind: Model
            name: remote
            provider: openai
            model: fake-model
            base_url: {model_url}/v1
            api_key: "${{TRACES_MODEL_KEY:-sk-fake}}"
            retries: 1
            ---
            kind: Tool
            name: whereami
            input_schema: {{ type: object, properties: {{}} }}
            command:
              argv: [python3, -c, "import os; print(os.environ.get('TRACEPARENT', 'none'))"]
            ---
            kind: Tool
            name: fetch
            input_schema: {{ type: object, properties: {{}} }}
            http: {{ url: "{tool_url}/tool" }}
            ---
            kind: Tool
            name: leak
            input_schema: {{ type: object, properties: {{}} }}
            command:
              argv: [python3, -c, "import os; print('the token is', os.environ['T'])"]
              env: {{ T: "${{TRACES_API_TOKEN}}" }}
            ---
            kind: Agent
            name: traced
            model: remote
            tools: [whereami, fetch, leak]
        """,
    })


@dataclass
class Rig:
    fake: FakeOpenAI
    recorder: Recorder
    receiver: OtlpReceiver
    defs: Path
    state: Path

    def server(self, **variables: str) -> ServerProcess:
        return ServerProcess(self.defs, self.state, env={"TRACES_API_TOKEN": SECRET, **variables})


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    fake, recorder = FakeOpenAI(), Recorder()
    with serve(fake.app) as model_url, serve(recorder.app) as tool_url, OtlpReceiver() as receiver:
        yield Rig(fake, recorder, receiver, definitions(tmp_path / "defs", model_url, tool_url),
                  tmp_path / "state")


def parents(span: ReceivedSpan, spans: list[ReceivedSpan]) -> list[str]:
    """The names of `span`'s ancestors, nearest first."""
    ids = {s.span_id: s for s in spans}
    out = []
    while span.parent_span_id in ids:
        span = ids[span.parent_span_id]
        out.append(span.name)
    return out


def traceparent_of(text: str) -> tuple[str, str]:
    """(trace id, parent span id) of a `traceparent` value."""
    version, trace_id, span_id, flags = text.strip().split("-")
    assert (version, len(trace_id), len(span_id), len(flags)) == ("00", 32, 16, 2), text
    return trace_id, span_id


async def turn(client: httpx.AsyncClient, conversation: Conversation, turn_id: str) -> dict[str, Any]:
    reply = await client.get(f"{conversation.path}/turns/{turn_id}")
    assert reply.status_code == 200, reply.text
    return reply.json()


async def test_a_turn_with_tools_is_a_span_tree_in_the_callers_trace(rig: Rig) -> None:
    rig.fake.script(*WORK)
    with rig.server(**env(rig.receiver)) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30, trust_env=False) as client:
            conversation = await Conversation.create(client, "traced")
            with anyio.fail_after(30):
                reply = await client.post(f"{conversation.path}/messages", json={"content": "work"},
                                          headers={"traceparent": TRACEPARENT})
            assert reply.status_code == 200 and reply.json()["output"] == "done", reply.text
            result = await turn(client, conversation, reply.json()["turn_id"])
            spans = rig.receiver.wait(lambda got: len(by_name(got, "invoke_agent traced")) == 1)
    [agent] = by_name(spans, "invoke_agent traced")
    digest = conversation.created["digest"]
    assert (agent.trace_id, agent.parent_span_id) == (INBOUND_TRACE, INBOUND_SPAN)  # the caller's child
    assert result["trace_id"] == INBOUND_TRACE
    # its steps, from what it committed: each model step with the tokens its request used
    assert [(s["kind"], s["name"], s.get("usage")) for s in result["steps"]] == [
        ("model", "traced", {"input_tokens": 12, "output_tokens": 7}), ("tool", "whereami", None),
        ("tool", "fetch", None), ("model", "traced", {"input_tokens": 12, "output_tokens": 7})]
    assert result["usage"] == {"input_tokens": 24, "output_tokens": 14}
    assert agent.resource["service.name"] == "corral"
    assert agent.attributes == {
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "traced",
        "gen_ai.agent.version": digest, "corral.agent.digest": digest,
        "gen_ai.conversation.id": conversation.id, "corral.turn.id": result["id"], "corral.attempt": 1,
        "corral.outcome": "completed"}
    ours = [s for s in spans if s.trace_id == INBOUND_TRACE]
    assert all(s.attributes["corral.agent.digest"] == digest for s in ours)
    chats = sorted(by_name(ours, "chat fake-model"), key=lambda s: s.start_ns)
    assert [parents(s, ours) for s in chats] == [["invoke_agent traced"]] * 3
    assert [(s.failed, s.attributes.get("error.type")) for s in chats] == [
        (True, "model_error"), (False, None), (False, None)]  # the 503, its retry, the answer
    assert chats[1].attributes | {"corral.agent.digest": "-"} == {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "fake-model", "corral.model": "remote",
        "gen_ai.usage.input_tokens": 12, "gen_ai.usage.output_tokens": 7,
        "gen_ai.response.finish_reasons": ("tool_calls",), "gen_ai.agent.name": "traced",
        "corral.agent.digest": "-", "corral.turn.id": result["id"], "gen_ai.conversation.id": conversation.id}
    # each model request named its own span as the parent
    sent = [traceparent_of(r.headers["traceparent"]) for r in rig.fake.requests]
    assert sent == [(INBOUND_TRACE, s.span_id) for s in chats]
    tools = {s.attributes["gen_ai.tool.name"]: s for s in ours if s.name.startswith("execute_tool ")}
    assert set(tools) == {"whereami", "fetch"}
    for name, call_id in (("whereami", "call_1"), ("fetch", "call_2")):
        span = tools[name]
        assert parents(span, ours) == ["invoke_agent traced"]
        attributes = span.attributes
        assert (attributes["gen_ai.tool.call.id"], attributes["gen_ai.tool.type"]) == (call_id, "function")
        assert attributes["corral.outcome"] == "ok" and attributes["corral.execution_key"].startswith("ek_")
    # the command tool saw its span as TRACEPARENT; the http tool got it as a header
    [whereami] = [m for m in result["messages"] if m.get("name") == "whereami"]
    assert traceparent_of(whereami["content"]) == (INBOUND_TRACE, tools["whereami"].span_id)
    [fetched] = rig.recorder.headers
    assert traceparent_of(fetched["traceparent"]) == (INBOUND_TRACE, tools["fetch"].span_id)
    # no content without the opt-in
    assert not any(k.startswith(("gen_ai.input", "gen_ai.output", "gen_ai.system_instructions",
                                 "gen_ai.tool.call.arguments", "gen_ai.tool.call.result"))
                   for s in spans for k in s.attributes)


async def test_a_failed_turn_is_an_error_span_with_its_code(rig: Rig) -> None:
    rig.fake.script(Status(400, error_type="invalid_request_error"))
    with rig.server(**env(rig.receiver)) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30, trust_env=False) as client:
            conversation = await Conversation.create(client, "traced")
            assert (await conversation.say("fail", bound=30))["status"] == "failed"
            spans = rig.receiver.wait(lambda got: len(by_name(got, "invoke_agent traced")) == 1)
    [agent] = by_name(spans, "invoke_agent traced")
    [chat] = by_name(spans, "chat fake-model")
    assert agent.parent_span_id == ""  # no caller's trace: a root
    assert (agent.failed, agent.attributes["error.type"], agent.attributes["corral.outcome"]) == (
        True, "model_error", "failed")
    assert (chat.failed, chat.attributes["error.type"], chat.parent_span_id) == (True, "model_error",
                                                                                agent.span_id)


async def test_content_is_in_spans_only_on_the_opt_in_and_redacted(rig: Rig) -> None:
    rig.fake.script(Reply(calls=(Call("leak", {}, id="call_9"),)), Reply(text="noted"))
    variables = env(rig.receiver, OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="true")
    with rig.server(**variables) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30, trust_env=False) as client:
            conversation = await Conversation.create(client, "traced")
            said = await conversation.say(f"remember {SECRET}", bound=30)
            assert said["output"] == "noted"
            spans = rig.receiver.wait(lambda got: len(by_name(got, "invoke_agent traced")) == 1)
    chats = sorted(by_name(spans, "chat fake-model"), key=lambda s: s.start_ns)
    [tool] = by_name(spans, "execute_tool leak")
    assert all(SECRET not in str(s.attributes) for s in spans)
    assert "remember [redacted]" in chats[0].attributes["gen_ai.input.messages"]
    assert '"name": "leak"' in chats[0].attributes["gen_ai.output.messages"]
    assert "the token is [redacted]" in chats[1].attributes["gen_ai.input.messages"]
    assert tool.attributes["gen_ai.tool.call.result"].strip() == "the token is [redacted]"
    assert tool.attributes["gen_ai.tool.call.arguments"] == "{}"


@pytest.mark.parametrize("variables", ["none", "disabled"])
async def test_nothing_is_sent_without_the_variables_and_the_trace_still_propagates(rig: Rig,
                                                                                    variables: str) -> None:
    rig.fake.script(*WORK)
    # the receiver runs, but nothing names it; or the SDK's own switch turns exporting off
    extra = env(rig.receiver, OTEL_SDK_DISABLED="true") if variables == "disabled" else {}
    with rig.server(**extra) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30, trust_env=False) as client:
            conversation = await Conversation.create(client, "traced")
            said = await conversation.say("work", bound=30)
            result = await turn(client, conversation, said["turn_id"])
        # a clean stop (uvicorn re-raises the SIGTERM): anything queued would have been flushed by now
        assert server.terminate() in (0, -signal.SIGTERM), server.stderr
    assert (rig.receiver.requests, rig.receiver.spans) == (0, [])
    trace_id = result["trace_id"]
    assert len(trace_id) == 32 and int(trace_id, 16)
    # the turn's trace id still reaches what it calls, so their own traces can be joined to it
    assert {traceparent_of(r.headers["traceparent"])[0] for r in rig.fake.requests} == {trace_id}
    [whereami] = [m for m in result["messages"] if m.get("name") == "whereami"]
    assert traceparent_of(whereami["content"])[0] == trace_id
    assert traceparent_of(rig.recorder.headers[0]["traceparent"])[0] == trace_id


def test_the_receiver_decodes_what_the_sdk_exports() -> None:
    """The test receiver itself, against the SDK's exporter in this process (no Corral)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    with OtlpReceiver() as receiver:
        provider = TracerProvider()
        exporter = OTLPSpanExporter(endpoint=receiver.url + "/v1/traces")
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        with provider.get_tracer("t").start_as_current_span("outer", attributes={"n": 1, "l": ("a", "b")}):
            pass
        provider.shutdown()
        [span] = receiver.wait(lambda got: len(got) == 1, 10)
    assert (span.name, span.attributes) == ("outer", {"n": 1, "l": ("a", "b")})
    assert receiver.paths == ["/v1/traces"]


def mcp_definitions(root: Path) -> Path:
    fixture = json.dumps([str(Path(__file__).parent / "mcp_fixture_server.py")])
    return write_tree(root, {
        "mcp.yaml": f"""
            kind: MCPServer
            name: fixture
            command: {sys.executable}
            args: {fixture}
            timeout_s: 20
            ---
            kind: Model
            name: offline
            provider: scripted
            script:
              - when: "^where"
                tool_call: {{ name: fixture__traceparent }}
                reply: "{{tool_result}}"
            ---
            kind: Agent
            name: asker
            description: Asks the fixture MCP server what trace its call was in.
            model: offline
            tools: [fixture/traceparent]
        """,
    })


async def test_mcp_carries_the_trace_in_and_out_in_meta(tmp_path: Path) -> None:
    with OtlpReceiver() as receiver, ServerProcess(mcp_definitions(tmp_path / "defs"), tmp_path / "state",
                                                   env=env(receiver)) as server:
        with anyio.fail_after(60):
            async with Client(server.url + "/mcp") as client:
                meta = {"traceparent": TRACEPARENT}
                result = await client.call_tool("asker", {"message": "where"}, meta=meta)
        spans = receiver.wait(lambda got: len(by_name(got, "invoke_agent asker")) == 1)
    assert not result.is_error, result
    [agent] = by_name(spans, "invoke_agent asker")
    [tool] = by_name(spans, "execute_tool fixture__traceparent")
    assert (agent.trace_id, agent.parent_span_id) == (INBOUND_TRACE, INBOUND_SPAN)  # in: `_meta` of the call
    assert tool.parent_span_id == agent.span_id
    seen = "".join(c.text for c in result.content if isinstance(c, types.TextContent))
    assert traceparent_of(seen) == (INBOUND_TRACE, tool.span_id)  # out: the `_meta` of Corral's MCP call
