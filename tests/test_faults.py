"""Faults end as designed: provider failures, broken tools and hooks, SIGTERM, SIGKILL.

Provider faults go through the real server to a fake OpenAI server that
plays them: a fault before any output is retried, then the fallback model
is tried, then the turn fails cleanly with `model_error`; a fault after
output fails the turn without sending anything twice. Tools and hooks that
crash or hang never take the server down. Signals are sent to a real
`corral serve` process, and what survived is read after a restart on the
same state directory.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from server.http import create_app
from server.settings import Settings
from tests.conftest import corral_server, write_tree
from tests.fakes import Cut, FakeOpenAI, Malformed, Reply, Stall, Status, serve
from tests.live import ended, gated_definitions, named, open_gate, read_events
from tests.server_process import ServerProcess

pytestmark = pytest.mark.anyio

HOOKS = Path(__file__).resolve().parent / "hooks"
SLEEPER = "import time; time.sleep(60)"


def definitions(root: Path, fake_url: str) -> Path:
    openai = f"provider: openai\nbase_url: {fake_url}/v1\napi_key: ${{FAULTS_KEY:-sk-fake}}\ntimeout_s: 1"
    tree = write_tree(root, {
        "models.yaml": f"""
kind: Model
name: flaky
model: flaky-model
{openai}
retries: 1
fallbacks: [backup]
---
kind: Model
name: backup
model: backup-model
{openai}
retries: 0
---
kind: Model
name: offline
provider: scripted
script:
  - when: "^crash"
    tool_call: {{ name: crash }}
  - when: "^hang"
    tool_call: {{ name: hang }}
  - when: "^missing"
    tool_call: {{ name: missing }}
  - when: "^echo (?P<text>.+)"
    tool_call: {{ name: echo, arguments: {{ text: "{{text}}" }} }}
    reply: "echoed: {{tool_result}}"
default: "fine: {{input}}"
""",
        "tools.yaml": f"""
kind: Tool
name: crash
command: {{ argv: [python3, -c, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"] }}
---
kind: Tool
name: hang
command: {{ argv: [python3, -c, "{SLEEPER}"], timeout_s: 1 }}
---
kind: Tool
name: missing
command: {{ argv: [/nonexistent/corral-test-binary] }}
---
kind: Tool
name: echo
input_schema: {{ type: object, properties: {{ text: {{ type: string }} }}, required: [text] }}
command: {{ argv: [python3, -c, "import sys; print(sys.argv[1])", "{{text}}"] }}
""",
        "hooks.yaml": """
kind: Hook
name: hang
event: pre_tool_use
matcher: echo
command: [python3, hang.py, hook.pid]
timeout_s: 2
---
kind: Hook
name: crash
event: user_prompt_submit
command: [python3, -c, "raise SystemExit(1)"]
on_error: allow
""",
        "agents.yaml": """
kind: Agent
name: resilient
model: flaky
---
kind: Agent
name: tooled
model: offline
tools: [crash, hang, missing, echo]
---
kind: Agent
name: hooked
model: offline
tools: [echo]
hooks: [hang, crash]
""",
    })
    shutil.copy(HOOKS / "hang.py", tree / "hang.py")
    return tree


@pytest.fixture(scope="module")
def fake() -> FakeOpenAI:
    return FakeOpenAI()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("faults")


@pytest.fixture(scope="module")
def base_url(fake: FakeOpenAI, root: Path) -> Iterator[str]:
    with serve(fake.app) as fake_url, corral_server(definitions(root / "defs", fake_url),
                                                     root / "state") as url:
        yield url


@pytest.fixture
async def client(base_url: str, fake: FakeOpenAI) -> AsyncIterator[httpx.AsyncClient]:
    fake.reset()
    async with httpx.AsyncClient(base_url=base_url, timeout=20, trust_env=False) as http:
        yield http
    assert fake.pending == 0, "a scripted scenario was never asked for"


async def turn(client: httpx.AsyncClient, agent: str, content: str, cid: str | None = None) -> dict[str, Any]:
    if cid is None:
        cid = (await client.post("/v1/conversations", json={"agent": agent})).json()["id"]
    with anyio.fail_after(15):
        reply = await client.post(f"/v1/conversations/{cid}/messages", json={"content": content})
    assert reply.status_code == 200, reply.text
    return {"cid": cid, **reply.json()}


async def still_serving(client: httpx.AsyncClient, agent: str, cid: str) -> None:
    assert (await client.get("/healthz")).status_code == 200
    assert (await client.get(f"/v1/conversations/{cid}")).json()["status"] == "idle"
    after = await turn(client, agent, "all good?", cid)
    assert after["status"] == "completed", after


# --- model faults ------------------------------------------------------------------------

FLAKY, BACKUP = "flaky-model", "backup-model"
RECOVERED = [  # (fault before any output, then an answer): retried on the same model
    pytest.param(Status(429, retry_after="0"), id="429"),
    pytest.param(Status(500), id="500"),
    pytest.param(Cut(text=""), id="closed-early"),
    pytest.param(Malformed(), id="malformed"),
    pytest.param(Stall(text=""), id="timeout"),
]


@pytest.mark.parametrize("fault", RECOVERED)
async def test_a_fault_before_output_is_retried(client: httpx.AsyncClient, fake: FakeOpenAI, fault) -> None:
    fake.script(fault, Reply(text="recovered"))
    answer = await turn(client, "resilient", "hi")
    assert answer["status"] == "completed" and answer["output"] == "recovered"
    assert [r.body["model"] for r in fake.requests] == [FLAKY, FLAKY]
    events = await read_events(client, answer["cid"], ended())
    assert "".join(e.data["text"] for e in events if e.name == "message.delta") == "recovered"


async def test_retries_then_the_fallback_model(client: httpx.AsyncClient, fake: FakeOpenAI) -> None:
    fake.script(Status(500), Malformed(), Reply(text="from the backup"))
    answer = await turn(client, "resilient", "hi")
    assert answer["status"] == "completed" and answer["output"] == "from the backup"
    assert [r.body["model"] for r in fake.requests] == [FLAKY, FLAKY, BACKUP]


async def test_when_every_model_fails_the_turn_fails_cleanly(client: httpx.AsyncClient,
                                                            fake: FakeOpenAI) -> None:
    fake.script(Status(503), Stall(text=""), Status(429, retry_after="0"))
    answer = await turn(client, "resilient", "hi")
    assert answer["status"] == "failed" and answer["error"]["code"] == "model_error"
    assert "scripted failure" not in json.dumps(answer)  # the provider's body is never quoted
    assert [r.body["model"] for r in fake.requests] == [FLAKY, FLAKY, BACKUP]
    events = await read_events(client, answer["cid"], ended())
    assert [e.name for e in events] == ["turn.started", "turn.failed"]
    assert events[-1].data["error"]["code"] == "model_error"
    fake.script(Reply(text="all good"))
    await still_serving(client, "resilient", answer["cid"])


@pytest.mark.parametrize("fault", [Cut(text="partial"), Malformed(text="partial"), Stall(text="partial")],
                         ids=["closed-early", "malformed", "timeout"])
async def test_a_fault_after_output_fails_without_repeating_it(client: httpx.AsyncClient, fake: FakeOpenAI,
                                                               fault) -> None:
    fake.script(fault)
    answer = await turn(client, "resilient", "hi")
    assert answer["status"] == "failed" and answer["error"]["code"] == "model_error"
    assert [r.body["model"] for r in fake.requests] == [FLAKY]
    events = await read_events(client, answer["cid"], ended())
    [delta] = [e.data["text"] for e in events if e.name == "message.delta"]  # the fake's first piece, once
    assert delta and "partial".startswith(delta)


# --- tools and hooks ---------------------------------------------------------------------------


@pytest.mark.parametrize(("content", "says"), [
    ("crash", "killed by signal 9"),
    ("hang", "timed out after 1s"),
    ("missing", "corral-test-binary"),
])
async def test_a_broken_tool_is_a_tool_error(client: httpx.AsyncClient, content: str, says: str) -> None:
    answer = await turn(client, "tooled", content)
    assert answer["status"] == "completed", answer
    [result] = [m for m in answer["messages"] if m["role"] == "tool"]
    assert result["is_error"] and says in result["content"]
    await still_serving(client, "tooled", answer["cid"])


async def test_hanging_and_crashing_hooks_follow_on_error(client: httpx.AsyncClient, root: Path) -> None:
    pidfile = root / "defs" / "hook.pid"  # the hook runs in the definition directory
    started = time.monotonic()
    answer = await turn(client, "hooked", "echo hello")  # prompt hook crashes (allow), tool hook hangs (deny)
    assert time.monotonic() - started < 10
    assert answer["status"] == "completed", answer
    [result] = [m for m in answer["messages"] if m["role"] == "tool"]
    assert result["is_error"] and "hook hang timed out after 2s" in result["content"]
    with pytest.raises(ProcessLookupError):  # the hanging hook was killed, not left behind
        os.kill(int(pidfile.read_text()), 0)
    await still_serving(client, "hooked", answer["cid"])


# --- signals --------------------------------------------------------------------------------


async def test_shutdown_refuses_new_turns(tmp_path: Path) -> None:
    """What SIGTERM starts (`begin_shutdown`), seen while the HTTP server still answers."""
    app = create_app(Settings(definitions=gated_definitions(tmp_path / "defs"), state_dir=tmp_path / "state",
                              watch=False))
    with serve(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=15, trust_env=False) as client:
            cid = (await client.post("/v1/conversations", json={"agent": "gated"})).json()["id"]
            app.state.service.begin_shutdown()
            refused = await client.post(f"/v1/conversations/{cid}/messages", json={"content": "hi"})
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "overloaded"
            assert (await client.get("/readyz")).status_code == 503
            assert (await client.get("/healthz")).status_code == 200


async def test_a_turn_queued_before_shutdown_does_not_start(tmp_path: Path) -> None:
    """A request already waiting its turn when shutdown begins is refused when its slot frees.

    White-box where the API gives no signal: the queue is read, and `accepting` set, directly
    (plain attributes: the service runs on the server thread's event loop, not this test's).
    """
    app = create_app(Settings(definitions=gated_definitions(tmp_path / "defs"), state_dir=tmp_path / "state",
                              watch=False))
    gate = tmp_path / "gate"
    with serve(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=15, trust_env=False) as client:
            cid = (await client.post("/v1/conversations", json={"agent": "queued"})).json()["id"]
            conversations = app.state.service.conversations
            answers: dict[str, httpx.Response] = {}

            async def post(name: str, content: str) -> None:
                url = f"/v1/conversations/{cid}/messages"
                answers[name] = await client.post(url, json={"content": content})

            async with anyio.create_task_group() as tg:
                tg.start_soon(post, "held", f"wait {gate}")
                with anyio.fail_after(10):
                    while not (cid in conversations._live and conversations._live[cid].running):
                        await anyio.sleep(0.02)
                    tg.start_soon(post, "queued", "second")
                    while len(conversations._live[cid].queue) < 2:
                        await anyio.sleep(0.02)
                conversations.accepting = False
                open_gate(gate)
            assert answers["held"].json()["status"] == "completed"
            assert answers["queued"].status_code == 503
            assert answers["queued"].json()["error"]["code"] == "overloaded"


async def post_turn(client: httpx.AsyncClient, cid: str, content: str, answers: dict[str, Any]) -> None:
    """A turn whose answer may never come (the server goes away): the answer, or the error."""
    try:
        reply = await client.post(f"/v1/conversations/{cid}/messages", json={"content": content})
        answers[cid] = reply.json()
    except httpx.HTTPError as exc:
        answers[cid] = exc


async def turns_of(client: httpx.AsyncClient, cid: str) -> list[dict[str, Any]]:
    return (await client.get(f"/v1/conversations/{cid}/turns")).json()["items"]


async def test_sigterm_drains_running_turns(tmp_path: Path) -> None:
    defs, state = gated_definitions(tmp_path / "defs"), tmp_path / "state"
    short, long_ = tmp_path / "short", tmp_path / "long"
    answers: dict[str, Any] = {}
    server = ServerProcess(defs, state, env={"CORRAL_SHUTDOWN_GRACE_S": "2"})
    try:
        with server, anyio.fail_after(40):
            async with httpx.AsyncClient(base_url=server.url, timeout=30, trust_env=False) as client:
                a, b, c = [(await client.post("/v1/conversations", json={"agent": "gated"})).json()["id"]
                           for _ in range(3)]
                async with anyio.create_task_group() as tg:
                    tg.start_soon(post_turn, client, a, f"wait {short}", answers)
                    tg.start_soon(post_turn, client, b, f"wait {long_}", answers)
                    for cid in (a, b):
                        await read_events(client, cid, named("tool.started"))
                    server.signal(signal.SIGTERM)
                    stopped_at = time.monotonic()
                    await post_turn(client, c, "too late", answers)  # refused: 503, or no connection at all
                    open_gate(short)
                code = await anyio.to_thread.run_sync(server.wait, 15)
                took = time.monotonic() - stopped_at
    finally:
        open_gate(short)
        open_gate(long_)
    assert code in (0, -signal.SIGTERM) and took < 2 + 5, (code, took, server.stderr)
    assert isinstance(answers[c], httpx.HTTPError) or answers[c]["error"]["code"] == "overloaded"
    assert answers[a]["status"] == "completed" and answers[a]["output"] == "passed the gate"
    assert isinstance(answers[b], httpx.HTTPError) or answers[b]["error"]["code"] == "interrupted"
    with ServerProcess(defs, state) as again:
        async with httpx.AsyncClient(base_url=again.url, timeout=15, trust_env=False) as client:
            [done] = await turns_of(client, a)
            [cut] = await turns_of(client, b)
            assert done["status"] == "completed"
            assert cut["status"] == "failed" and cut["error"]["code"] == "interrupted"
            events = await read_events(client, b, ended(cut["id"]))
            assert events[-1].name == "turn.failed" and events[-1].data["error"]["code"] == "interrupted"
            assert await turns_of(client, c) == []


async def test_sigkill_loses_nothing_committed(tmp_path: Path) -> None:
    defs, state, gate = gated_definitions(tmp_path / "defs"), tmp_path / "state", tmp_path / "gate"
    answers: dict[str, Any] = {}
    try:
        with ServerProcess(defs, state) as server, anyio.fail_after(30):
            async with httpx.AsyncClient(base_url=server.url, timeout=30, trust_env=False) as client:
                cid = (await client.post("/v1/conversations", json={"agent": "gated"})).json()["id"]
                first = (await client.post(f"/v1/conversations/{cid}/messages",
                                           json={"content": "one"})).json()
                async with anyio.create_task_group() as tg:
                    tg.start_soon(post_turn, client, cid, f"wait {gate}", answers)
                    started = await read_events(client, cid, named("tool.started"))
                    before = (await client.get(f"/v1/conversations/{cid}/messages")).json()["items"]
                    server.signal(signal.SIGKILL)
                    await anyio.to_thread.run_sync(server.wait, 10)
    finally:
        open_gate(gate)  # the orphaned tool process polls for it, and exits
    held = next(e.data["turn_id"] for e in reversed(started) if e.name == "turn.started")
    assert isinstance(answers[cid], httpx.HTTPError)
    assert [m["role"] for m in before] == ["user", "assistant", "user", "assistant"]
    with ServerProcess(defs, state) as again:
        async with httpx.AsyncClient(base_url=again.url, timeout=15, trust_env=False) as client:
            assert (await client.get(f"/v1/conversations/{cid}")).json()["status"] == "idle"
            after_restart = (await client.get(f"/v1/conversations/{cid}/messages")).json()["items"]
            assert after_restart == before
            turns = await turns_of(client, cid)
            assert [(t["id"], t["status"]) for t in turns] == [(first["turn_id"], "completed"),
                                                               (held, "failed")]
            assert turns[1]["error"]["code"] == "interrupted"
            events = await read_events(client, cid, ended(held))
            assert events[-1].name == "turn.failed" and events[-1].data["error"]["code"] == "interrupted"
            third = (await client.post(f"/v1/conversations/{cid}/messages", json={"content": "three"})).json()
            assert third["status"] == "completed" and third["output"] == "echo: three"
            messages = (await client.get(f"/v1/conversations/{cid}/messages")).json()["items"]
            assert [m["seq"] for m in messages] == list(range(1, len(before) + 3))
            assert messages[: len(before)] == before
            replay = await read_events(client, cid, ended(third["turn_id"]))
            ids = [e.id for e in replay]
            assert ids == sorted(set(ids)) and [e.name for e in replay].count("turn.failed") == 1
