"""What operators see: exact /metrics after a known sequence, live gauges, JSON log lines.

The counters are read after a sequence whose every count is known (two
completed turns of agent `a`, one failed turn of `b`, one tool call, an
applied and a rejected swap), and compared family by family, every sample.
The JSON logs come from a real `corral serve` process's stderr.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from tests.fakes import FakeOpenAI, Status, serve
from tests.support.client import Conversation
from tests.support.events import conversation_events, named
from tests.support.servers import ServerProcess, corral_server
from tests.support.trees import gated_definitions, open_gate, write_tree

SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
Samples = dict[str, dict[frozenset[tuple[str, str]], float]]


def parse(text: str) -> Samples:
    """Prometheus text: metric name -> {frozenset of (label, value): value}."""
    samples: Samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        name, labels, value = match.groups()
        samples.setdefault(name, {})[frozenset(LABEL.findall(labels or ""))] = float(value)
    return samples


def family(samples: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(labels)): value for labels, value in samples.get(name, {}).items()}


async def metrics(client: httpx.AsyncClient) -> Samples:
    response = await client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return parse(response.text)


AGENTS = """
kind: Agent
name: a
description: {description}
model: offline
tools: [shout]
---
kind: Agent
name: b
model: remote
"""


def definitions(root: Path, fake_url: str) -> Path:
    return write_tree(root, {
        "models.yaml": f"""
            kind: Model
            name: offline
            provider: scripted
            script:
              - when: "^shout (?P<text>.+)"
                tool_call: {{ name: shout, arguments: {{ text: "{{text}}" }} }}
            ---
            kind: Model
            name: remote
            provider: openai
            model: remote-model
            base_url: {fake_url}/v1
            api_key: "${{OBS_KEY:-sk-fake}}"
            retries: 0
        """,
        "tools.yaml": """
            kind: Tool
            name: shout
            input_schema: { type: object, properties: { text: { type: string } }, required: [text] }
            command: { argv: [python3, -c, "import sys; print(sys.argv[1].upper())", "{text}"] }
        """,
        "agents.yaml": AGENTS.format(description="first"),
    })


@pytest.mark.anyio
async def test_counters_after_a_known_sequence(tmp_path: Path) -> None:
    fake = FakeOpenAI()
    with serve(fake.app) as fake_url, corral_server(definitions(tmp_path / "defs", fake_url),
                                                     tmp_path / "state") as url:
        async with httpx.AsyncClient(base_url=url, timeout=20, trust_env=False) as client:
            first = await metrics(client)
            assert family(first, "corral_busy_conversations") == {(): 0}
            assert family(first, "corral_active_streams") == {(): 0}
            a = await Conversation.create(client, "a")
            b = await Conversation.create(client, "b")
            assert (await a.say("shout hi"))["output"] == "HI"  # two model steps and a tool call
            assert (await a.say("plain"))["status"] == "completed"  # one model step
            fake.script(Status(400, error_type="invalid_request_error"))
            assert (await b.say("anything"))["status"] == "failed"
            (tmp_path / "defs" / "agents.yaml").write_text(AGENTS.format(description="second"))
            assert (await client.post("/v1/definitions/reload")).json()["status"] == "applied"
            (tmp_path / "defs" / "broken.yaml").write_text("kind: Agent\nname: [not, a, name]\n")
            assert (await client.post("/v1/definitions/reload")).json()["status"] == "rejected"
            seen = await metrics(client)
    a_, b_ = ("agent", "a"), ("agent", "b")
    assert family(seen, "corral_turns_total") == {
        (a_, ("outcome", "completed")): 2, (b_, ("outcome", "failed")): 1}
    assert family(seen, "corral_turn_duration_seconds_count") == {(a_,): 2, (b_,): 1}
    assert family(seen, "corral_model_requests_total") == {
        (("outcome", "ok"), ("provider", "scripted")): 3, (("outcome", "error"), ("provider", "openai")): 1}
    assert family(seen, "corral_tool_calls_total") == {(("outcome", "ok"), ("tool", "shout")): 1}
    assert family(seen, "corral_swaps_total") == {(("status", "applied"),): 1, (("status", "rejected"),): 1}
    assert family(seen, "corral_busy_conversations") == {(): 0}
    assert family(seen, "corral_active_streams") == {(): 0}
    buckets = family(seen, "corral_turn_duration_seconds_bucket")
    assert buckets[(a_, ("le", "+Inf"))] == 2 and buckets[(b_, ("le", "+Inf"))] == 1


async def wait_for_gauge(client: httpx.AsyncClient, name: str, value: float) -> None:
    """Poll /metrics until `name` reads `value` (a server notices a closed stream a moment later)."""
    with anyio.fail_after(10):
        while family(parse((await client.get("/metrics")).text), name)[()] != value:
            await anyio.sleep(0.02)


@pytest.fixture
def gated_url(tmp_path: Path) -> Iterator[str]:
    with corral_server(gated_definitions(tmp_path / "defs"), tmp_path / "state") as url:
        yield url


@pytest.mark.anyio
async def test_busy_and_stream_gauges_follow_what_is_open(gated_url: str, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    async with httpx.AsyncClient(base_url=gated_url, timeout=20, trust_env=False) as client:
        conversation = await Conversation.create(client, "gated")
        try:
            with anyio.fail_after(20):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(conversation.send, f"wait {gate}")
                    await conversation.events(named("tool.started"))
                    await wait_for_gauge(client, "corral_active_streams", 0)  # that reader has left
                    now = parse((await client.get("/metrics")).text)
                    assert family(now, "corral_busy_conversations") == {(): 1}
                    # Held in a name: a generator left by `break` is closed when collected, and would
                    # take the connection with it.
                    async with conversation_events(client, conversation.id) as events:
                        assert (await anext(events)).name == "turn.started"  # counted by now
                        assert gauge_of(await client.get("/metrics"), "corral_active_streams") == 1
                        open_gate(gate)
                        await events.aclose()
                    await wait_for_gauge(client, "corral_busy_conversations", 0)
                    await wait_for_gauge(client, "corral_active_streams", 0)
        finally:
            open_gate(gate)
    [reply] = conversation.replies
    assert reply.json()["status"] == "completed", reply.text


def gauge_of(response: httpx.Response, name: str) -> float:
    return family(parse(response.text), name)[()]


def test_json_logs_carry_the_request_id(tmp_path: Path) -> None:
    defs = gated_definitions(tmp_path / "defs")
    with ServerProcess(defs, tmp_path / "state", env={"CORRAL_LOG_FORMAT": "json"}) as server, \
            httpx.Client(base_url=server.url, timeout=15, trust_env=False) as client:
        reload = client.post("/v1/definitions/reload", headers={"X-Request-ID": "obs-reload-1"})
        missing = client.get("/v1/conversations/conv_nope", headers={"X-Request-ID": "obs-missing-2"})
        assert reload.status_code == 200 and missing.status_code == 404
        anonymous = client.get("/v1/agents").headers["x-request-id"]
        server.terminate()
    lines = [line for line in server.stderr.splitlines() if line.strip()]
    entries = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all(isinstance(e, dict) and {"ts", "level", "logger", "message"} <= e.keys() for e in entries)
    by_request: dict[str, list[dict]] = {}
    for entry in entries:
        by_request.setdefault(entry.get("request_id", ""), []).append(entry)
    assert {e["logger"] for e in by_request["obs-reload-1"]} >= {"corral.swaps", "uvicorn.access"}
    assert any("POST /v1/definitions/reload" in e["message"] for e in by_request["obs-reload-1"])
    assert [e["logger"] for e in by_request["obs-missing-2"]] == ["uvicorn.access"]
    assert "404" in by_request["obs-missing-2"][0]["message"]
    assert any("GET /v1/agents" in e["message"] for e in by_request[anonymous])
