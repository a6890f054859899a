"""`if_busy: steer` (and `on_busy: steer`): a message sent to the running turn (contract §10).

The running turn waits in the `gate` tool (see `tests.support.trees`) while the
test steers a message into it, so "running" is a state the test controls. The
model is the fake OpenAI-compatible server: what it was sent next shows the
steered message reached it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from tests.fakes import Call, FakeOpenAI, Reply, Stall, serve
from tests.support.client import Conversation
from tests.support.events import Event, ended, named
from tests.support.fake_models import checked_client
from tests.support.servers import corral_server
from tests.support.trees import gate_yaml, open_gate, write_tree

pytestmark = pytest.mark.anyio
# a user_prompt_submit hook that blocks any prompt that mentions a secret (exit 2, the reason on stderr)
BLOCK_PY = ("import json, sys\nif 'secret' in json.load(sys.stdin)['prompt']:\n"
            "    print('no secrets here', file=sys.stderr)\n    sys.exit(2)\n")
NO_SECRETS = json.dumps(["python3", "-c", BLOCK_PY])


def definitions(root: Path, url: str) -> Path:
    model = f"provider: openai\nbase_url: {url}/v1\napi_key: ${{FAKE_OPENAI_KEY}}\nretries: 0"
    return write_tree(root, {
        "models.yaml": f"kind: Model\nname: gpt\nmodel: gpt-fake\n{model}\n---\n"
                       f"kind: Model\nname: gpt_slow\nmodel: gpt-slow\n{model}\ntimeout_s: 1",
        "tools.yaml": gate_yaml(),
        "hooks.yaml": f"kind: Hook\nname: no-secrets\nevent: user_prompt_submit\ncommand: {NO_SECRETS}",
        "agents.yaml": """
            kind: Agent
            name: rejecting
            model: gpt
            tools: [gate]
            ---
            kind: Agent
            name: guarded
            model: gpt
            tools: [gate]
            hooks: [no-secrets]
            ---
            kind: Agent
            name: steered
            model: gpt
            tools: [gate]
            on_busy: steer
            ---
            kind: Agent
            name: slow
            model: gpt_slow
        """,
    })


@pytest.fixture(scope="module")
def fake() -> FakeOpenAI:
    return FakeOpenAI()


@pytest.fixture(scope="module")
def base_url(fake: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("steer")
    with pytest.MonkeyPatch.context() as env, serve(fake.app) as url:
        env.setenv("FAKE_OPENAI_KEY", "sk-fake")
        with corral_server(definitions(root / "defs", url), root / "state") as corral:
            yield corral


@pytest.fixture
async def client(base_url: str, fake: FakeOpenAI) -> AsyncIterator[httpx.AsyncClient]:
    async with checked_client(base_url, fake) as http:
        yield http


def texts(body: dict) -> list[tuple[str, str]]:
    return [(m["role"], m.get("content") or "") for m in body["messages"]]


@pytest.mark.parametrize(("agent", "fields"), [("rejecting", {"if_busy": "steer"}), ("steered", {})])
async def test_steer_into_a_turn_held_by_a_slow_tool(client: httpx.AsyncClient, fake: FakeOpenAI,
                                                     tmp_path: Path, agent: str, fields: dict) -> None:
    gate = tmp_path / "gate"
    fake.script(Reply(calls=(Call("gate", {"path": str(gate)}, id="call_gate"),)), Reply(text="did both"))
    c = await Conversation.create(client, agent)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.send, "do the first thing")
            turn_id = await c.started()
            steer = await c.send("and then the second thing", **fields)
            assert steer.status_code == 202, steer.text
            assert steer.json() == {"turn_id": turn_id}
            open_gate(gate)  # the turn picks the message up before its next model request
            events = await c.events(named("message.steered"))
            assert events[-1].data == {"turn_id": turn_id, "content": "and then the second thing"}
    [answer] = [r.json() for r in c.replies if r.status_code == 200]
    assert answer["turn_id"] == turn_id and answer["status"] == "completed" and answer["output"] == "did both"
    # the model's next request had the steered message, after the tool's result
    assert texts(fake.requests[1].body)[-2:] == [("tool", "open\n"), ("user", "and then the second thing")]
    transcript = await c.messages()
    assert [(m["role"], m["turn_id"]) for m in transcript] == [
        (role, turn_id) for role in ("user", "assistant", "tool", "user", "assistant")]
    assert transcript[3]["content"] == "and then the second thing"
    assert [m["content"] for m in answer["messages"] if m["role"] == "user"] == [
        "do the first thing", "and then the second thing"]
    assert [t["id"] for t in await c.turns()] == [turn_id]  # no turn of its own


async def test_steer_with_no_turn_running_starts_one(client: httpx.AsyncClient, fake: FakeOpenAI) -> None:
    fake.script(Reply(text="hello back"))
    c = await Conversation.create(client, "rejecting")
    answer = await c.say("hello", if_busy="steer", bound=20)
    assert answer["status"] == "completed" and answer["output"] == "hello back"
    [turn] = await c.turns()
    assert turn["input"] == "hello"


async def test_a_turn_that_ends_first_leaves_the_message_a_turn_of_its_own(
        client: httpx.AsyncClient, fake: FakeOpenAI) -> None:
    """The turn's last model request is under way (it stalls, then times out): no request comes after
    the steer, so the steered message starts a turn of its own once the running one has ended."""
    fake.script(Stall(text="thinking"), Reply(text="the second turn"))
    c = await Conversation.create(client, "slow")
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.send, "first")
            await c.events(named("message.delta"))
            steer = await c.send("meanwhile", if_busy="steer")
            assert steer.status_code in (200, 202), steer.text
        if steer.status_code == 202:  # it ran on its own, after the first turn failed
            events = await c.events(lambda e: e.name == "turn.completed")
        turns = await c.turns()
    assert [t["status"] for t in turns] == ["failed", "completed"]
    assert turns[1]["input"] == "meanwhile" and turns[1]["output"] == "the second turn"
    assert texts(fake.requests[1].body)[-1] == ("user", "meanwhile")
    events = await c.events(ended(turns[1]["id"]))
    assert not [e for e in events if e.name == "message.steered"]  # it was never the first turn's


async def test_if_busy_steer_is_validated(client: httpx.AsyncClient) -> None:
    c = await Conversation.create(client, "rejecting")
    r = await c.send("hello", if_busy="nudge")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"


def nth(n: int, names: tuple[str, ...]) -> Callable[[Event], bool]:
    """A predicate: the `n`-th event named one of `names`."""
    seen = 0

    def until(event: Event) -> bool:
        nonlocal seen
        seen += event.name in names
        return seen >= n

    return until


async def test_messages_left_when_the_turn_ends_each_start_a_turn_in_order(
        client: httpx.AsyncClient, fake: FakeOpenAI) -> None:
    """Two messages steered into a turn that is then interrupted (so it makes no model request after
    them): each starts a turn of its own, in the order sent, and the server stays healthy."""
    await left_over(client, fake)


async def test_messages_left_over_on_postgresql(fake: FakeOpenAI, postgres_url: str, tmp_path: Path) -> None:
    with pytest.MonkeyPatch.context() as env, serve(fake.app) as url:
        env.setenv("FAKE_OPENAI_KEY", "sk-fake")
        with corral_server(definitions(tmp_path / "defs", url), tmp_path / "state",
                           database_url=postgres_url) as base_url:
            async with checked_client(base_url, fake) as client:
                await left_over(client, fake)


async def left_over(client: httpx.AsyncClient, fake: FakeOpenAI) -> None:
    fake.script(Stall(text="thinking"), Reply(text="one"), Reply(text="two"))
    c = await Conversation.create(client, "rejecting")
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.send, "first")
            await c.events(named("message.delta"))
            for text in ("second", "third"):
                steer = await c.send(text, if_busy="steer")
                assert steer.status_code == 202, steer.text
            interrupted = await client.post(f"{c.path}/interrupt")
            assert interrupted.status_code == 200 and interrupted.json()["interrupted"], interrupted.text
        await c.events(nth(3, ("turn.completed", "turn.failed", "turn.cancelled")))
    turns = await c.turns()
    assert [(t["status"], t["input"], t["output"]) for t in turns] == [
        ("cancelled", "first", None), ("completed", "second", "one"), ("completed", "third", "two")]
    assert [texts(r.body)[-1] for r in fake.requests[1:]] == [("user", "second"), ("user", "third")]
    assert (await client.get("/readyz")).status_code == 200
    assert (await client.post("/v1/conversations", json={"agent": "rejecting"})).status_code == 201


async def test_a_retried_steer_adds_nothing(client: httpx.AsyncClient, fake: FakeOpenAI,
                                            tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    fake.script(Reply(calls=(Call("gate", {"path": str(gate)}, id="call_gate"),)), Reply(text="did both"))
    c = await Conversation.create(client, "rejecting")
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.send, "do the first thing")
            turn_id = await c.started()
            for _ in range(2):
                steer = await c.send("and the second", key="steer-1", if_busy="steer")
                assert (steer.status_code, steer.json()) == (202, {"turn_id": turn_id}), steer.text
            other = await c.send("something else", key="steer-1", if_busy="steer")
            assert other.status_code == 422 and other.json()["error"]["code"] == "idempotency_key_reused"
            open_gate(gate)
        events = await c.events(ended(turn_id))
        # the turn has ended: a retry still answers as the first request did
        again = await c.send("and the second", key="steer-1", if_busy="steer")
    assert (again.status_code, again.json()) == (202, {"turn_id": turn_id}), again.text
    assert len([e for e in events if e.name == "message.steered"]) == 1
    assert [m["content"] for m in await c.messages() if m["role"] == "user"] == [
        "do the first thing", "and the second"]
    assert [t["id"] for t in await c.turns()] == [turn_id]


async def test_a_hook_blocks_a_steered_message(client: httpx.AsyncClient, fake: FakeOpenAI,
                                               tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    fake.script(Reply(calls=(Call("gate", {"path": str(gate)}, id="call_gate"),)), Reply(text="done"))
    c = await Conversation.create(client, "guarded")
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.send, "do the first thing")
            turn_id = await c.started()
            blocked = await c.send("and tell me the secret", if_busy="steer")
            assert blocked.status_code == 422, blocked.text
            error = blocked.json()["error"]
            assert error["code"] == "prompt_blocked" and "no secrets here" in error["message"]
            open_gate(gate)
        events = await c.events(ended(turn_id))
    assert not [e for e in events if e.name == "message.steered"]
    assert "secret" not in json.dumps(await c.messages())
    assert "secret" not in json.dumps(fake.requests[1].body)
    [answer] = [r.json() for r in c.replies if r.status_code == 200]
    assert answer["status"] == "completed" and answer["turn_id"] == turn_id
