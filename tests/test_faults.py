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

import anyio
import httpx
import pytest

from tests.fakes import Cut, FakeOpenAI, Malformed, Reply, Stall, Status, serve
from tests.support.client import Conversation, talk
from tests.support.events import ended, named
from tests.support.fake_models import checked_client
from tests.support.processes import wait_until
from tests.support.servers import ServerProcess, corral_app, corral_server, serving
from tests.support.trees import gated_definitions, open_gate, write_tree

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
    async with checked_client(base_url, fake) as http:
        yield http


async def still_serving(client: httpx.AsyncClient, conversation: Conversation) -> None:
    assert (await client.get("/healthz")).status_code == 200
    assert (await conversation.get())["status"] == "idle"
    after = await conversation.say("all good?", bound=15)
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
    conversation, answer = await talk(client, "resilient", "hi")
    assert answer["status"] == "completed" and answer["output"] == "recovered"
    assert [r.body["model"] for r in fake.requests] == [FLAKY, FLAKY]
    events = await conversation.events(ended())
    assert "".join(e.data["text"] for e in events if e.name == "message.delta") == "recovered"


async def test_retries_then_the_fallback_model(client: httpx.AsyncClient, fake: FakeOpenAI) -> None:
    fake.script(Status(500), Malformed(), Reply(text="from the backup"))
    _, answer = await talk(client, "resilient", "hi")
    assert answer["status"] == "completed" and answer["output"] == "from the backup"
    assert [r.body["model"] for r in fake.requests] == [FLAKY, FLAKY, BACKUP]


async def test_when_every_model_fails_the_turn_fails_cleanly(client: httpx.AsyncClient,
                                                            fake: FakeOpenAI) -> None:
    fake.script(Status(503), Stall(text=""), Status(429, retry_after="0"))
    conversation, answer = await talk(client, "resilient", "hi")
    assert answer["status"] == "failed" and answer["error"]["code"] == "model_error"
    assert "scripted failure" not in json.dumps(answer)  # the provider's body is never quoted
    assert [r.body["model"] for r in fake.requests] == [FLAKY, FLAKY, BACKUP]
    events = await conversation.events(ended())
    assert [e.name for e in events] == ["turn.started", "turn.failed"]
    assert events[-1].data["error"]["code"] == "model_error"
    fake.script(Reply(text="all good"))
    await still_serving(client, conversation)


@pytest.mark.parametrize("fault", [Cut(text="partial"), Malformed(text="partial"), Stall(text="partial")],
                         ids=["closed-early", "malformed", "timeout"])
async def test_a_fault_after_output_fails_without_repeating_it(client: httpx.AsyncClient, fake: FakeOpenAI,
                                                               fault) -> None:
    fake.script(fault)
    conversation, answer = await talk(client, "resilient", "hi")
    assert answer["status"] == "failed" and answer["error"]["code"] == "model_error"
    assert [r.body["model"] for r in fake.requests] == [FLAKY]
    events = await conversation.events(ended())
    [delta] = [e.data["text"] for e in events if e.name == "message.delta"]  # the fake's first piece, once
    assert delta and "partial".startswith(delta)


# --- tools and hooks ---------------------------------------------------------------------------


@pytest.mark.parametrize(("content", "says"), [
    ("crash", "killed by signal 9"),
    ("hang", "timed out after 1s"),
    ("missing", "corral-test-binary"),
])
async def test_a_broken_tool_is_a_tool_error(client: httpx.AsyncClient, content: str, says: str) -> None:
    conversation, answer = await talk(client, "tooled", content)
    assert answer["status"] == "completed", answer
    [result] = [m for m in answer["messages"] if m["role"] == "tool"]
    assert result["is_error"] and says in result["content"]
    await still_serving(client, conversation)


async def test_hanging_and_crashing_hooks_follow_on_error(client: httpx.AsyncClient, root: Path) -> None:
    pidfile = root / "defs" / "hook.pid"  # the hook runs in the definition directory
    started = time.monotonic()
    # the prompt hook crashes (allow), the tool hook hangs (deny)
    conversation, answer = await talk(client, "hooked", "echo hello")
    assert time.monotonic() - started < 10
    assert answer["status"] == "completed", answer
    [result] = [m for m in answer["messages"] if m["role"] == "tool"]
    assert result["is_error"] and "hook hang timed out after 2s" in result["content"]
    with pytest.raises(ProcessLookupError):  # the hanging hook was killed, not left behind
        os.kill(int(pidfile.read_text()), 0)
    await still_serving(client, conversation)


# --- signals --------------------------------------------------------------------------------


async def test_shutdown_refuses_new_turns(tmp_path: Path) -> None:
    """What SIGTERM starts (`begin_shutdown`), seen while the HTTP server still answers."""
    app = corral_app(gated_definitions(tmp_path / "defs"), tmp_path / "state")
    with serving(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=15, trust_env=False) as client:
            conversation = await Conversation.create(client, "gated")
            app.state.service.begin_shutdown()
            refused = await conversation.send("hi")
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "overloaded"
            assert (await client.get("/readyz")).status_code == 503
            assert (await client.get("/healthz")).status_code == 200


async def test_a_turn_queued_before_shutdown_does_not_start(tmp_path: Path) -> None:
    """A request already waiting its turn when shutdown begins is refused when its slot frees.

    White-box where the API gives no signal: the queue is read, and `accepting` set, directly
    (plain attributes: the service runs on the server thread's event loop, not this test's).
    """
    app = corral_app(gated_definitions(tmp_path / "defs"), tmp_path / "state")
    gate = tmp_path / "gate"
    with serving(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=15, trust_env=False) as client:
            conversation = await Conversation.create(client, "queued")
            cid = conversation.id
            conversations = app.state.service.conversations
            answers: dict[str, httpx.Response] = {}

            async def post(name: str, content: str) -> None:
                answers[name] = await conversation.send(content)

            async with anyio.create_task_group() as tg:
                tg.start_soon(post, "held", f"wait {gate}")
                with anyio.fail_after(10):
                    await wait_until(lambda: conversations.admission.running(cid) is not None, bound=10)
                    tg.start_soon(post, "queued", "second")
                    await wait_until(lambda: conversations.admission.waiting_here(cid) >= 1, bound=10)
                conversations.accepting = False
                open_gate(gate)
            assert answers["held"].json()["status"] == "completed"
            assert answers["queued"].status_code == 503
            assert answers["queued"].json()["error"]["code"] == "overloaded"


async def test_sigterm_drains_running_turns(tmp_path: Path) -> None:
    defs, state = gated_definitions(tmp_path / "defs"), tmp_path / "state"
    short, long_ = tmp_path / "short", tmp_path / "long"
    server = ServerProcess(defs, state, env={"CORRAL_SHUTDOWN_GRACE_S": "2"})
    try:
        with server, anyio.fail_after(40):
            async with httpx.AsyncClient(base_url=server.url, timeout=30, trust_env=False) as client:
                a, b, c = [await Conversation.create(client, "gated") for _ in range(3)]
                async with anyio.create_task_group() as tg:
                    tg.start_soon(a.try_send, f"wait {short}")
                    tg.start_soon(b.try_send, f"wait {long_}")
                    for conversation in (a, b):
                        await conversation.events(named("tool.started"))
                    server.signal(signal.SIGTERM)
                    stopped_at = time.monotonic()
                    late = await c.try_send("too late")  # refused: 503, or no connection at all
                    open_gate(short)
                code = await anyio.to_thread.run_sync(server.wait, 15)
                took = time.monotonic() - stopped_at
    finally:
        open_gate(short)
        open_gate(long_)
    assert code in (0, -signal.SIGTERM) and took < 2 + 5, (code, took, server.stderr)
    assert isinstance(late, httpx.HTTPError) or late.json()["error"]["code"] == "overloaded"
    [drained] = a.replies
    assert drained.json()["status"] == "completed" and drained.json()["output"] == "passed the gate"
    # cut off at the end of the grace, the turn is handed over, not failed: its client is told so
    assert b.lost or b.replies[0].json()["error"]["code"] == "overloaded"
    with ServerProcess(defs, state) as again:
        async with httpx.AsyncClient(base_url=again.url, timeout=15, trust_env=False) as client:
            [done] = await a.through(client).turns()
            assert done["status"] == "completed"
            # the next start resumes it: the gate call's start was committed, not its result, and
            # the tool is not `replay: safe`, so the model is told its outcome is unknown
            events = await b.through(client).events(ended())
            [cut] = await b.through(client).turns()
            assert (cut["status"], cut["attempts"]) == ("completed", 2), cut
            resumed = [e.data for e in events if e.name == "turn.resumed"]
            assert resumed == [{"turn_id": cut["id"], "attempt": 2}]
            [finished] = [e.data for e in events if e.name == "tool.finished"]
            assert finished["outcome"] == "unknown" and finished["is_error"], finished
            assert [e.name for e in events].count("tool.started") == 1
            assert await c.through(client).turns() == []


async def test_sigkill_loses_nothing_committed(tmp_path: Path) -> None:
    defs, state, gate = gated_definitions(tmp_path / "defs"), tmp_path / "state", tmp_path / "gate"
    try:
        with ServerProcess(defs, state) as server, anyio.fail_after(30):
            async with httpx.AsyncClient(base_url=server.url, timeout=30, trust_env=False) as client:
                conversation = await Conversation.create(client, "gated")
                first = await conversation.say("one")
                async with anyio.create_task_group() as tg:
                    tg.start_soon(conversation.try_send, f"wait {gate}")
                    started = await conversation.events(named("tool.started"))
                    before = await conversation.messages()
                    server.signal(signal.SIGKILL)
                    await anyio.to_thread.run_sync(server.wait, 10)
    finally:
        open_gate(gate)  # the orphaned tool process polls for it, and exits
    held = next(e.data["turn_id"] for e in reversed(started) if e.name == "turn.started")
    assert conversation.lost, conversation.replies  # the held turn was never answered
    assert [m["role"] for m in before] == ["user", "assistant", "user", "assistant"]
    with ServerProcess(defs, state) as again:
        async with httpx.AsyncClient(base_url=again.url, timeout=15, trust_env=False) as client:
            restarted = conversation.through(client)
            # the next start resumes the held turn from what it had committed (durable turns)
            events = await restarted.events(ended(held))
            assert events[-1].name == "turn.completed", events[-1]
            assert (await restarted.get())["status"] == "idle"
            after_restart = await restarted.messages()
            assert after_restart[: len(before)] == before  # nothing committed was lost or doubled
            assert [m["role"] for m in after_restart[len(before):]] == ["tool", "assistant"]
            turns = await restarted.turns()
            assert [(t["id"], t["status"], t["attempts"]) for t in turns] == [
                (first["turn_id"], "completed", 1), (held, "completed", 2)]
            third = await restarted.say("three")
            assert third["status"] == "completed" and third["output"] == "echo: three"
            messages = await restarted.messages()
            assert [m["seq"] for m in messages] == list(range(1, len(before) + 5))
            assert messages[: len(before)] == before
            replay = await restarted.events(ended(third["turn_id"]))
            ids = [e.id for e in replay]
            assert ids == sorted(set(ids)) and [e.name for e in replay].count("turn.resumed") == 1
