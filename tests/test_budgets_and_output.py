"""Token budgets and structured output (`budget`, `output_schema`; the OpenAI route's `response_format`).

Corral runs for real on loopback and talks to FakeOpenAI / FakeAnthropic,
which report usage as scripted; what the model was sent is read from the
fakes, and what the turn did through the HTTP API, the OpenAI route (with
the official `openai` client) and MCP (with the official `mcp` client).
"""

from __future__ import annotations

import json
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp.types as types
import openai
import pytest
from mcp import Client

from server.compiler.compiler import Compiler
from server.errors import DefinitionsInvalid
from tests.fakes import Call, Reply, serve
from tests.support.client import Conversation, talk
from tests.support.events import ended, named
from tests.support.fake_models import Fakes, checked_client
from tests.support.servers import ServerProcess, corral_server
from tests.support.trees import gate_yaml, open_gate, write_tree

pytestmark = pytest.mark.anyio

ANSWER = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
          "additionalProperties": False}


def definitions(root: Path, openai_url: str, anthropic_url: str) -> Path:
    schema = json.dumps(ANSWER)
    return write_tree(root, {
        "models.yaml": f"""
            kind: Model
            name: gpt
            provider: openai
            model: gpt-fake
            base_url: {openai_url}/v1
            api_key: ${{CORRAL_TEST_OPENAI_KEY}}
            timeout_s: 5
            retries: 0
            ---
            kind: Model
            name: claude
            provider: anthropic
            model: claude-fake
            base_url: {anthropic_url}
            api_key: ${{CORRAL_TEST_ANTHROPIC_KEY}}
            timeout_s: 5
            retries: 0
        """,
        "agents.yaml": f"""
            kind: Agent
            name: plain
            model: gpt
            instructions: Be brief.
            ---
            kind: Agent
            name: thrifty
            model: gpt
            instructions: Be brief.
            budget: {{max_tokens_per_turn: 100}}
            ---
            kind: Agent
            name: frugal
            model: gpt
            instructions: Be brief.
            budget: {{max_tokens_per_conversation: 100}}
            ---
            kind: Agent
            name: typed
            description: Answers with a number.
            model: gpt
            instructions: Answer with a number.
            output_schema: {schema}
            ---
            kind: Agent
            name: typed_claude
            model: claude
            instructions: Answer with a number.
            output_schema: {schema}
        """,
    })


@pytest.fixture(scope="module")
def fakes() -> Iterator[Fakes]:
    yield Fakes()


@pytest.fixture(scope="module")
def base_url(fakes: Fakes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("budgets")
    with pytest.MonkeyPatch.context() as env, serve(fakes.openai.app) as openai_url, \
            serve(fakes.anthropic.app) as anthropic_url:
        env.setenv("CORRAL_TEST_OPENAI_KEY", "sk-fake-openai")
        env.setenv("CORRAL_TEST_ANTHROPIC_KEY", "sk-fake-anthropic")
        with corral_server(definitions(root / "defs", openai_url, anthropic_url), root / "state") as url:
            yield url


@pytest.fixture
async def client(base_url: str, fakes: Fakes) -> AsyncIterator[httpx.AsyncClient]:
    async with fakes.client(base_url) as http:
        yield http


@pytest.fixture
async def oai(client: httpx.AsyncClient, base_url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with httpx.AsyncClient(trust_env=False, timeout=20) as http:
        yield openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0, http_client=http)


async def failed_with(conversation: Conversation, answer: dict[str, Any], code: str) -> dict[str, Any]:
    """The error of a failed turn: the same in the answer, the turn record and its `turn.failed`."""
    assert answer["status"] == "failed" and answer["output"] is None, answer
    assert "structured" not in answer
    turn = next(t for t in await conversation.turns() if t["id"] == answer["turn_id"])
    with anyio.fail_after(10):
        events = await conversation.events(ended(answer["turn_id"]))
    assert events[-1].name == "turn.failed"
    assert answer["error"] == turn["error"] == events[-1].data["error"]
    assert answer["error"]["code"] == code
    return answer["error"]


# --- budgets -------------------------------------------------------------------------------------------


async def test_turn_budget_passed_on_reported_usage(client: httpx.AsyncClient, fakes: Fakes) -> None:
    fakes.openai.script(Reply(text="a long answer", usage=(90, 20)))
    conversation, answer = await talk(client, "thrifty", "hi")
    error = await failed_with(conversation, answer, "budget_exceeded")
    assert error["details"] == {"budget": "max_tokens_per_turn", "limit": 100, "used": 110,
                                "source": "actual"}
    assert len(fakes.openai.requests) == 1
    [turn] = await conversation.turns()
    assert turn["usage"] == {"input_tokens": 90, "output_tokens": 20}  # what it spent is on record
    # the answer that passed the budget is not the conversation's: only the prompt is
    assert [(m["role"], m["content"]) for m in await conversation.messages()] == [("user", "hi")]


async def test_turn_budget_passed_on_the_estimate_sends_nothing(client: httpx.AsyncClient,
                                                                 fakes: Fakes) -> None:
    conversation, answer = await talk(client, "thrifty", "word " * 200)  # ~250 tokens, estimated
    error = await failed_with(conversation, answer, "budget_exceeded")
    assert error["details"]["source"] == "estimated" and error["details"]["used"] > 100
    assert fakes.openai.requests == []  # the model was never asked


async def test_within_the_budget(client: httpx.AsyncClient, fakes: Fakes) -> None:
    fakes.openai.script(Reply(text="fine", usage=(50, 10)))
    _, answer = await talk(client, "thrifty", "hi")
    assert answer["status"] == "completed" and answer["output"] == "fine"
    assert "structured" not in answer  # no output schema, no structured value


async def test_conversation_budget_across_turns(client: httpx.AsyncClient, fakes: Fakes) -> None:
    fakes.openai.script(Reply(text="one", usage=(40, 20)), Reply(text="two", usage=(40, 20)))
    conversation = await Conversation.create(client, "frugal")
    first = await conversation.say("first", bound=15)
    assert first["status"] == "completed"
    second = await conversation.say("second", bound=15)  # sent (60 + its estimate fit), then 120 > 100
    error = await failed_with(conversation, second, "budget_exceeded")
    assert error["details"] == {"budget": "max_tokens_per_conversation", "limit": 100, "used": 120,
                                "source": "actual"}
    third = await conversation.say("third", bound=15)  # 120 spent already: refused before sending
    error = await failed_with(conversation, third, "budget_exceeded")
    assert error["details"]["source"] == "estimated" and error["details"]["used"] > 120
    assert len(fakes.openai.requests) == 2

    # another conversation of the same agent has its own budget
    fakes.openai.script(Reply(text="fresh", usage=(40, 20)))
    _, answer = await talk(client, "frugal", "again")
    assert answer["status"] == "completed"


async def test_a_resumed_turn_counts_what_its_earlier_attempt_spent(fakes: Fakes, tmp_path: Path) -> None:
    """A turn's first step (110 tokens) is committed, then its server is killed in the tool call that
    followed. The next start resumes the turn, whose next request (about 130 tokens estimated, within
    the budget of 300 with the 110) spends 210: 320 in all, past the turn's budget (counted from
    zero, the resumed attempt would pass it)."""
    fake, gate = fakes.openai, tmp_path / "gate"
    with serve(fake.app) as url:
        defs = write_tree(tmp_path / "defs", {
            "models.yaml": f"kind: Model\nname: gpt\nprovider: openai\nmodel: gpt-fake\nbase_url: {url}/v1\n"
                           "api_key: ${CORRAL_TEST_OPENAI_KEY}\nretries: 0",
            "tools.yaml": gate_yaml(),
            "agents.yaml": "kind: Agent\nname: thrifty\nmodel: gpt\ntools: [gate]\n"
                           "budget: {max_tokens_per_turn: 300}",
        })
        env, state = {"CORRAL_TEST_OPENAI_KEY": "sk-fake"}, tmp_path / "state"
        try:
            with ServerProcess(defs, state, env=env) as server, anyio.fail_after(30):
                async with checked_client(server.url, fake) as client:
                    fake.script(Reply(calls=(Call("gate", {"path": str(gate)}),), usage=(100, 10)))
                    c = await Conversation.create(client, "thrifty")
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(c.try_send, "go")
                        started = await c.events(named("tool.started"))  # the step is committed
                        server.signal(signal.SIGKILL)
                        await anyio.to_thread.run_sync(server.wait, 10)
        finally:
            open_gate(gate)  # the orphaned tool process polls for it, and exits
        turn_id = next(e.data["turn_id"] for e in started if e.name == "turn.started")
        fake.script(Reply(text="done", usage=(200, 10)))  # the turn resumes as the server starts
        with ServerProcess(defs, state, env=env) as again, anyio.fail_after(30):
            async with httpx.AsyncClient(base_url=again.url, timeout=20, trust_env=False) as client:
                resumed = c.through(client)
                events = await resumed.events(ended(turn_id))
                [turn] = await resumed.turns()
    assert events[-1].name == "turn.failed", events[-1]
    assert fake.pending == 0, events[-1]
    error = events[-1].data["error"]
    assert error["code"] == "budget_exceeded", error
    assert error["details"] == {"budget": "max_tokens_per_turn", "limit": 300, "used": 320,
                                "source": "actual"}
    assert (turn["attempts"], turn["usage"]) == (2, {"input_tokens": 300, "output_tokens": 20})


# --- output_schema over HTTP ---------------------------------------------------------------------------


async def test_output_repaired_once_then_valid(client: httpx.AsyncClient, fakes: Fakes) -> None:
    fakes.openai.script(Reply(text="The answer is 42."), Reply(text='{"answer": 42}'))
    conversation = await Conversation.create(client, "typed")
    reply = await conversation.send("what is six times seven", key="k-42")
    answer = reply.json()
    assert answer["status"] == "completed", answer
    assert answer["output"] == '{"answer": 42}' and answer["structured"] == {"answer": 42}

    first, second = (r.body for r in fakes.openai.requests)
    system = first["messages"][0]
    assert system["role"] == "system" and '"answer"' in system["content"]  # the model is told the form
    native = first["response_format"]  # and an OpenAI-compatible model gets it natively
    assert native == {"type": "json_schema", "json_schema": {"name": "typed", "schema": ANSWER}}
    repair = second["messages"][-1]
    assert repair["role"] == "user" and "not valid" in repair["content"] and "not JSON" in repair["content"]
    assert second["messages"][-2] == {"role": "assistant", "content": "The answer is 42."}

    # the transcript keeps all of it; the turn's output is the JSON text; its event has the value
    said = [m["role"] for m in await conversation.messages()]
    assert said == ["user", "assistant", "user", "assistant"]
    [turn] = await conversation.turns()
    assert turn["output"] == '{"answer": 42}'
    events = await conversation.events(ended(answer["turn_id"]))
    assert events[-1].name == "turn.completed" and events[-1].data["structured"] == {"answer": 42}

    # a retry with the same key answers the stored turn, structured value included; nothing is asked
    again = (await conversation.send("what is six times seven", key="k-42")).json()
    assert again["turn_id"] == answer["turn_id"] and again["structured"] == {"answer": 42}
    read = (await client.get(f"{conversation.path}/turns/{answer['turn_id']}")).json()  # one turn, read
    assert (read["status"], read["structured"]) == ("completed", {"answer": 42})
    assert read["output"] == turn["output"]
    assert len(fakes.openai.requests) == 2


async def test_output_never_valid(client: httpx.AsyncClient, fakes: Fakes) -> None:
    fakes.openai.script(Reply(text="it is 42"), Reply(text='{"answer": "42"}'),
                        Reply(text='{"number": 42}'))
    conversation, answer = await talk(client, "typed", "what is six times seven")
    error = await failed_with(conversation, answer, "output_invalid")
    assert error["details"]["repairs"] == 2 and "schema" in error["details"]["problem"]
    assert len(fakes.openai.requests) == 3  # the answer, then two repairs: bounded


async def test_output_repaired_on_anthropic(client: httpx.AsyncClient, fakes: Fakes) -> None:
    fakes.anthropic.script(Reply(text="seven"), Reply(text='```json\n{"answer": 7}\n```'))
    _, answer = await talk(client, "typed_claude", "how many days in a week")
    assert answer["status"] == "completed"
    assert answer["output"] == '{"answer": 7}' and answer["structured"] == {"answer": 7}  # fence dropped
    first, second = (r.body for r in fakes.anthropic.requests)
    assert "response_format" not in first and '"answer"' in first["system"]
    assert "not valid" in json.dumps(second["messages"][-1])


# --- the OpenAI route ------------------------------------------------------------------------------------

PLACE = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


async def test_openai_route_response_format(oai: openai.AsyncOpenAI, fakes: Fakes) -> None:
    fakes.openai.script(Reply(text="Paris, of course"), Reply(text='{"city": "Paris"}'))
    response_format = {"type": "json_schema",
                       "json_schema": {"name": "place", "schema": PLACE, "strict": True}}
    with anyio.fail_after(15):
        completion = await oai.chat.completions.create(
            model="plain", messages=[{"role": "user", "content": "capital of France?"}],
            response_format=response_format)  # type: ignore[arg-type]
    assert json.loads(completion.choices[0].message.content or "") == {"city": "Paris"}
    first, second = (r.body for r in fakes.openai.requests)
    assert first["response_format"] == second["response_format"] == response_format  # passed on natively
    assert second["messages"][-1]["role"] == "user" and "not valid" in second["messages"][-1]["content"]

    # without response_format the agent (which has no output_schema) answers free text
    fakes.openai.reset()
    fakes.openai.script(Reply(text="Paris"))
    with anyio.fail_after(15):
        plain = await oai.chat.completions.create(
            model="plain", messages=[{"role": "user", "content": "capital of France?"}])
    assert plain.choices[0].message.content == "Paris"
    assert "response_format" not in fakes.openai.requests[0].body


async def test_openai_route_json_object_and_failure(oai: openai.AsyncOpenAI, fakes: Fakes) -> None:
    fakes.openai.script(Reply(text="[1, 2]"), Reply(text='{"items": [1, 2]}'))
    with anyio.fail_after(15):
        completion = await oai.chat.completions.create(
            model="plain", messages=[{"role": "user", "content": "a list"}],
            response_format={"type": "json_object"})
    assert json.loads(completion.choices[0].message.content or "") == {"items": [1, 2]}
    assert fakes.openai.requests[0].body["response_format"] == {"type": "json_object"}

    fakes.openai.reset()
    fakes.openai.script(*(Reply(text="no") for _ in range(3)))
    with pytest.raises(openai.APIStatusError) as caught, anyio.fail_after(15):
        await oai.chat.completions.create(
            model="plain", messages=[{"role": "user", "content": "a place"}],
            response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PLACE}})
    assert caught.value.status_code == 422
    assert caught.value.body["code"] == "output_invalid"  # type: ignore[index]

    with pytest.raises(openai.BadRequestError):  # not a JSON Schema: refused before any turn
        await oai.chat.completions.create(
            model="plain", messages=[{"role": "user", "content": "a place"}],
            response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": 5}}})


async def test_openai_route_output_invalid_is_not_retried_by_openais_client(
        base_url: str, client: httpx.AsyncClient, fakes: Fakes) -> None:
    """OpenAI's client retries a 5xx (and 408, 409, 429) twice by default: each retry a new, paid turn.
    `output_invalid` is a 422 with `x-should-retry: false`, so the one turn that failed is the only one."""
    fakes.openai.script(*(Reply(text="no") for _ in range(3)))  # one turn: the answer and two repairs
    async with httpx.AsyncClient(trust_env=False, timeout=20) as http:
        oai = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="x", http_client=http)  # max_retries 2
        with pytest.raises(openai.APIStatusError) as caught, anyio.fail_after(30):
            await oai.chat.completions.create(
                model="plain", messages=[{"role": "user", "content": "a place"}],
                response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PLACE}})
    assert caught.value.status_code == 422, caught.value
    assert caught.value.body["code"] == "output_invalid"  # type: ignore[index]
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert len(fakes.openai.requests) == 3  # a retried request would have asked the model again


async def test_openai_route_streams_only_the_valid_answer(oai: openai.AsyncOpenAI, fakes: Fakes) -> None:
    fakes.openai.script(Reply(text="Oslo it is"), Reply(text='{"city": "Oslo"}'))
    with anyio.fail_after(15):
        stream = await oai.chat.completions.create(
            model="plain", messages=[{"role": "user", "content": "capital of Norway?"}], stream=True,
            response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": PLACE}})
        chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert json.loads(text) == {"city": "Oslo"}  # not the deltas of the answer that needed a repair


# --- MCP --------------------------------------------------------------------------------------------------


async def test_mcp_tool_result_carries_the_structured_value(base_url: str, client: httpx.AsyncClient,
                                                             fakes: Fakes) -> None:
    fakes.openai.script(Reply(text="nine"), Reply(text='{"answer": 9}'))
    with anyio.fail_after(30):
        async with Client(base_url + "/mcp") as mcp_client:
            tool = next(t for t in (await mcp_client.list_tools()).tools if t.name == "typed")
            assert "structured" in (tool.output_schema or {})["properties"]
            result = await mcp_client.call_tool("typed", {"message": "three squared"})
            assert not result.is_error
            text = "".join(c.text for c in result.content if isinstance(c, types.TextContent))
            assert json.loads(text) == {"answer": 9}
            structured = result.structured_content or {}
            assert structured["structured"] == {"answer": 9}
            assert structured["conversation_id"] and structured["turn_id"] and structured["digest"]

            fakes.openai.script(*(Reply(text="nope") for _ in range(3)))
            failed = await mcp_client.call_tool("typed", {"message": "three squared"})
            assert failed.is_error
            assert "".join(c.text for c in failed.content if isinstance(c, types.TextContent)).startswith(
                "[output_invalid]")


# --- definitions -------------------------------------------------------------------------------------------

# Hashed before `budget` and `output_schema` existed: these digests must never change.
GOLDEN_TREE = {"defs.yaml": """
    kind: Model
    name: m
    provider: scripted
    ---
    kind: Model
    name: gpt
    provider: openai
    model: gpt-4o-mini
    context_window: 128000
    ---
    kind: Agent
    name: plain
    model: m
    instructions: Answer.
    ---
    kind: Agent
    name: busy
    description: Every field but the new ones.
    model: gpt
    instructions: Be brief.
    agents: [plain]
    max_steps: 4
    on_busy: enqueue
"""}
GOLDEN = {
    "agent/busy": "sha256:4fbe30571b46cf71c43da3d8d9ff8280437e19c482e9c9912946c9f5ca3d9bf0",
    "agent/plain": "sha256:bd939e537a962fe4c4c3be00d899dc0f14de72ca1cb650ef07441e2c0bf0060a",
    "model/gpt": "sha256:3aaed990d03cead56686f4a0fd7a4a79b9f70cfcd5304a1bd9fdffc9e8b22430",
    "model/m": "sha256:585af55632d1fea55fec2758826374eb640d5a984590607d714cae7e52c274f9",
}


def compile_tree(root: Path, files: dict[str, str]):
    return Compiler(write_tree(root, files)).compile()


def with_plain(extra: str) -> dict[str, str]:
    line = "    instructions: Answer.\n"
    return {"defs.yaml": GOLDEN_TREE["defs.yaml"].replace(line, line + extra, 1)}


def test_agents_without_the_new_fields_hash_as_before(tmp_path: Path) -> None:
    assert compile_tree(tmp_path / "golden", GOLDEN_TREE).digests() == GOLDEN
    # a budget without limits is no budget
    empty = compile_tree(tmp_path / "empty", with_plain("    budget: {}\n"))
    assert empty.digests() == GOLDEN
    plain = empty.get("Agent", "plain")
    assert plain is not None and "budget" not in plain.spec and "output_schema" not in plain.spec


def test_budget_and_output_schema_are_part_of_the_digest(tmp_path: Path) -> None:
    budget = compile_tree(tmp_path / "budget", with_plain("    budget: {max_tokens_per_turn: 500}\n"))
    schema = compile_tree(tmp_path / "schema", with_plain("    output_schema: {type: object}\n"))
    for changed in (budget, schema):
        digests = changed.digests()
        assert digests["agent/plain"] != GOLDEN["agent/plain"]
        assert digests["agent/busy"] != GOLDEN["agent/busy"]  # it reaches plain as a sub-agent
        assert digests["model/m"] == GOLDEN["model/m"]
    plain = budget.get("Agent", "plain")
    assert plain is not None and plain.spec["budget"] == {"max_tokens_per_turn": 500}


@pytest.mark.parametrize(("extra", "field", "says"), [
    ("    budget: {max_tokens_per_trun: 5}\n", "budget.max_tokens_per_trun", "max_tokens_per_turn"),
    ("    budget: {max_tokens_per_turn: 0}\n", "budget.max_tokens_per_turn", "greater than 0"),
    ("    budget: {max_tokens_per_conversation: lots}\n", "budget.max_tokens_per_conversation", "integer"),
    ("    output_schema: {type: 5}\n", "output_schema", "not a valid JSON Schema"),
    ("    output_schema: [1, 2]\n", "output_schema", ""),
])
def test_bad_budget_or_output_schema_is_located(tmp_path: Path, extra: str, field: str, says: str) -> None:
    with pytest.raises(DefinitionsInvalid) as info:
        compile_tree(tmp_path, with_plain(extra))
    [error] = info.value.errors
    assert error.file == "defs.yaml" and error.kind == "Agent" and error.name == "plain"
    assert error.field == field and says in error.message, str(error)
    assert error.line == 15  # the line of the offending field (or key)
