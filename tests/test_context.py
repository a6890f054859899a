"""Context management (contract §10): compaction, truncation, the window's limit, and the routes.

`GET …/context` and `POST …/compact` included.

Corral runs for real on loopback against the fake OpenAI-compatible server
(set up as one that reports no usage, as many compatible servers do: counts
are estimated) and the fake Anthropic server (which reports usage: counts
are the provider's). Each test reads what the model was sent (the fakes
record every request body), the stored transcript, the events, and the
context the API reports. Estimates are about four characters a token, so
message sizes below are chosen in characters to land well clear of each limit.

The restart case runs `corral serve` as a child process on the same state
directory twice: the turn after the restart sends the compacted view the
first process committed, and nothing is summarized again.
"""

from __future__ import annotations

import json
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from server.compiler.compiler import Compiler
from server.errors import DefinitionsInvalid
from tests.fakes import Call, FakeOpenAI, Recorded, Reply, serve
from tests.support.client import Conversation
from tests.support.events import ended, named
from tests.support.fake_models import Fakes
from tests.support.servers import ServerProcess, corral_server
from tests.support.trees import gate_yaml, open_gate, write_tree

pytestmark = pytest.mark.anyio

BIG = "alpha " * 300  # 1,800 characters: about 450 tokens
MEDIUM = "beta " * 80  # 400 characters: about 100 tokens
SUMMARY_MARK = "Summary of the earlier part of this conversation"


def models(openai_url: str, anthropic_url: str) -> str:
    openai = f"provider: openai\nbase_url: {openai_url}/v1\napi_key: ${{FAKE_OPENAI_KEY}}\nretries: 0"
    anthropic = (f"provider: anthropic\nbase_url: {anthropic_url}\napi_key: ${{FAKE_ANTHROPIC_KEY}}\n"
                 "retries: 0")
    return "\n---\n".join([
        f"kind: Model\nname: gpt\nmodel: gpt-fake\n{openai}\ncontext_window: 2000\nmax_output_tokens: 100",
        f"kind: Model\nname: gpt_wide\nmodel: gpt-wide\n{openai}",  # no context_window: not managed
        f"kind: Model\nname: gpt_slow\nmodel: gpt-slow\n{openai}\ncontext_window: 2000\n"
        "max_output_tokens: 100\ntimeout_s: 1",
        f"kind: Model\nname: claude\nmodel: claude-fake\n{anthropic}\ncontext_window: 2000\n"
        "max_output_tokens: 100",
        # offline: it echoes what it is sent, so a summary it writes is longer than what it summarizes
        "kind: Model\nname: echo\nprovider: scripted\ncontext_window: 1000\nmax_output_tokens: 100",
    ])


AGENTS = """
kind: Agent
name: summarizing
model: gpt
instructions: Be brief.
tools: [gate]
context: { threshold: 0.5, keep_recent_turns: 1 }
---
kind: Agent
name: truncating
model: gpt
instructions: Be brief.
tools: [blob]
context: { strategy: truncate, threshold: 0.5, keep_recent_turns: 1 }
---
kind: Agent
name: reporting
model: claude
instructions: Be brief.
context: { threshold: 0.5, keep_recent_turns: 1 }
---
kind: Agent
name: reporting_budgeted
model: claude
context: { threshold: 0.5, keep_recent_turns: 1 }
budget: { max_tokens_per_turn: 1000 }
---
kind: Agent
name: summarized_by_claude
model: gpt
instructions: Be brief.
context: { threshold: 0.5, keep_recent_turns: 1, model: claude }
---
kind: Agent
name: echoing
model: echo
context: { threshold: 0.5, keep_recent_turns: 1 }
---
kind: Agent
name: unmanaged
model: gpt_wide
instructions: Be brief.
"""

BLOB = """
kind: Tool
name: blob
description: Prints n characters.
input_schema:
  type: object
  properties: { n: { type: string } }
  required: [n]
command:
  argv: [python3, -c, "import sys; print('x' * int(sys.argv[1]))", "{n}"]
  timeout_s: 10
"""


def definitions(root: Path, openai_url: str, anthropic_url: str) -> Path:
    return write_tree(root, {"models.yaml": models(openai_url, anthropic_url), "agents.yaml": AGENTS,
                             "tools.yaml": gate_yaml() + "\n---\n" + BLOB})


@pytest.fixture(scope="module")
def fakes() -> Iterator[Fakes]:
    yield Fakes(FakeOpenAI(report_usage=False))


@pytest.fixture(scope="module")
def urls(fakes: Fakes) -> Iterator[tuple[str, str]]:
    with serve(fakes.openai.app) as openai_url, serve(fakes.anthropic.app) as anthropic_url:
        yield openai_url, anthropic_url


@pytest.fixture(scope="module")
def defs(urls: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return definitions(tmp_path_factory.mktemp("context") / "defs", *urls)


@pytest.fixture(scope="module")
def base_url(defs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("FAKE_OPENAI_KEY", "sk-fake-openai")
        env.setenv("FAKE_ANTHROPIC_KEY", "sk-fake-anthropic")
        with corral_server(defs, tmp_path_factory.mktemp("state")) as url:
            yield url


@pytest.fixture
async def client(base_url: str, fakes: Fakes) -> AsyncIterator[httpx.AsyncClient]:
    async with fakes.client(base_url) as http:
        yield http


# --- reading what the model was sent ------------------------------------------------------------


def openai_texts(request: Recorded) -> list[tuple[str, str]]:
    """(role, text) of every message of an OpenAI request, the system message included."""
    return [(m["role"], m.get("content") or "") for m in request.body["messages"]]


def anthropic_texts(request: Recorded) -> list[tuple[str, str]]:
    out = []
    for message in request.body["messages"]:
        for block in message["content"]:
            out.append((message["role"], block.get("text") or str(block.get("content", ""))))
    return out


def summary_text(summary: str) -> str:
    """The message that stands for the messages a summary replaced."""
    return f"{SUMMARY_MARK} (its older messages were compacted to fit the context window):\n\n{summary}"


def is_summary_request(request: Recorded) -> bool:
    system = request.body.get("system") or next(
        (m["content"] for m in request.body["messages"] if m["role"] == "system"), "")
    return system.startswith("You compact a conversation")


async def context(conversation: Conversation) -> dict[str, Any]:
    r = await conversation.client.get(f"{conversation.path}/context")
    assert r.status_code == 200, r.text
    return r.json()


async def compacted_events(conversation: Conversation, turn_id: str | None = None) -> list[Any]:
    with anyio.fail_after(10):
        events = await conversation.events(ended(turn_id) if turn_id else named("context.compacted"))
    return [e for e in events if e.name == "context.compacted"]


async def say(conversation: Conversation, text: str) -> dict[str, Any]:
    answer = await conversation.say(text, bound=20)
    assert answer["status"] == "completed", answer
    return answer


# --- summarize ----------------------------------------------------------------------------------


async def test_summarize_compacts_once_and_the_model_sees_the_summary_and_recent_turns(
        client: httpx.AsyncClient, fakes: Fakes) -> None:
    fake = fakes.openai
    fake.script(Reply(text="one"), Reply(text="two"), Reply(text="SUMMARY-OF-TURN-ONE"),
                Reply(text="three"), Reply(text="four"), Reply(text="five"))
    c = await Conversation.create(client, "summarizing")
    await say(c, "first " + BIG)
    await say(c, "second " + BIG)
    before = await context(c)
    assert before["source"] == "estimated" and before["compactions"] == 0  # this fake reports no usage
    assert before["window"] == 2000 and before["threshold"] == 0.5
    assert 800 < before["used"] < 1000
    third = await say(c, "third " + MEDIUM)  # over 1,000 tokens with it: compacted before it is sent
    await say(c, "fourth")
    await say(c, "fifth")

    requests = fake.requests
    assert [is_summary_request(r) for r in requests] == [False, False, True, False, False, False]
    summary_request = openai_texts(requests[2])
    assert "first alpha" in summary_request[-1][1] and "second" not in summary_request[-1][1]
    view = [("user", summary_text("SUMMARY-OF-TURN-ONE")),
            ("user", "second " + BIG), ("assistant", "two")]
    assert openai_texts(requests[3]) == [("system", "Be brief."), *view, ("user", "third " + MEDIUM)]
    # the next turns reuse the view: no new summary, the messages since appended to it
    assert openai_texts(requests[5]) == [("system", "Be brief."), *view, ("user", "third " + MEDIUM),
                                         ("assistant", "three"), ("user", "fourth"), ("assistant", "four"),
                                         ("user", "fifth")]

    transcript = await c.messages()  # the stored transcript is whole
    assert [m["content"] for m in transcript] == [
        "first " + BIG, "one", "second " + BIG, "two", "third " + MEDIUM, "three", "fourth", "four", "fifth",
        "five"]
    [event] = await compacted_events(c)
    assert event.data["turn_id"] == third["turn_id"] and event.data["strategy"] == "summarize"
    assert event.data["messages"] == 2 and event.data["source"] == "estimated"
    assert event.data["before"] > 1000 > event.data["after"]
    after = await context(c)
    assert after["compactions"] == 1 and after["source"] == "estimated"
    assert after["used"] < before["used"]


async def test_reported_usage_drives_compaction(client: httpx.AsyncClient, fakes: Fakes) -> None:
    """With a provider that reports usage, the counts are its own: here far above the estimate."""
    fake = fakes.anthropic
    fake.script(Reply(text="one", usage=(300, 2)), Reply(text="two", usage=(990, 2)),
                Reply(text="SUMMARY-A", usage=(50, 3)), Reply(text="three", usage=(60, 2)))
    c = await Conversation.create(client, "reporting")
    await say(c, f"first {MEDIUM}")  # longer than a summary: else the summary would be dropped
    used = await context(c)
    assert used["source"] == "actual" and used["used"] > 300  # the reported 300, and "one" since
    await say(c, "second")
    assert (await context(c))["used"] > 990
    third = await say(c, "third question, and a longer one")  # 990 + what came since: over 1,000
    assert [is_summary_request(r) for r in fake.requests] == [False, False, True, False]
    assert anthropic_texts(fake.requests[3]) == [
        ("user", summary_text("SUMMARY-A")),
        ("user", "second"), ("assistant", "two"), ("user", "third question, and a longer one")]
    [event] = await compacted_events(c, third["turn_id"])
    assert event.data["source"] == "actual" and event.data["before"] > 1000 and event.data["messages"] == 2
    now = await context(c)
    assert now["source"] == "actual" and 60 < now["used"] < 100 and now["compactions"] == 1
    # the summary request is the turn's: its usage counts with the turn's own request
    assert (await c.turns())[2]["usage"] == {"input_tokens": 50 + 60, "output_tokens": 3 + 2}


async def test_a_summary_request_counts_toward_the_turn_budget(client: httpx.AsyncClient,
                                                               fakes: Fakes) -> None:
    """The third turn's own request (962 tokens) fits its budget of 1,000; with the summary request
    its compaction made (53 tokens), the turn passes it."""
    fake = fakes.anthropic
    fake.script(Reply(text="one", usage=(300, 2)), Reply(text="two", usage=(990, 2)),
                Reply(text="SUMMARY-B", usage=(50, 3)), Reply(text="three", usage=(960, 2)))
    c = await Conversation.create(client, "reporting_budgeted")
    await say(c, f"first {MEDIUM}")
    await say(c, "second")
    third = await c.say("third question, and a longer one", bound=20)
    assert [is_summary_request(r) for r in fake.requests] == [False, False, True, False]
    assert third["status"] == "failed" and third["error"]["code"] == "budget_exceeded", third
    assert third["error"]["details"] == {"budget": "max_tokens_per_turn", "limit": 1000, "used": 1015,
                                         "source": "actual"}


async def test_the_summary_model_can_be_another(client: httpx.AsyncClient, fakes: Fakes) -> None:
    fakes.openai.script(Reply(text="one"), Reply(text="two"), Reply(text="three"))
    fakes.anthropic.script(Reply(text="SUMMARY-BY-CLAUDE"))
    c = await Conversation.create(client, "summarized_by_claude")
    for text in ("first " + BIG, "second " + BIG, "third " + MEDIUM):
        await say(c, text)
    [summary] = fakes.anthropic.requests
    assert is_summary_request(summary) and "first alpha" in anthropic_texts(summary)[-1][1]
    assert "SUMMARY-BY-CLAUDE" in openai_texts(fakes.openai.requests[2])[1][1]


# --- truncate -----------------------------------------------------------------------------------


async def test_truncate_cuts_old_tool_results_once(client: httpx.AsyncClient, fakes: Fakes) -> None:
    fake = fakes.openai
    blob = Call("blob", {"n": "1600"}, id="call_blob")
    fake.script(Reply(calls=(blob,)), Reply(text="one"), Reply(calls=(blob,)), Reply(text="two"),
                Reply(calls=(blob,)), Reply(text="three"), Reply(text="four"))
    c = await Conversation.create(client, "truncating")
    await say(c, "first")
    await say(c, "second")
    third = await say(c, "third")  # its tool result takes the request over 1,000: cut before it is sent
    await say(c, "fourth")
    assert not any(is_summary_request(r) for r in fake.requests)
    results = lambda request: [text for role, text in openai_texts(request) if role == "tool"]  # noqa: E731
    cut = "[tool result cut to fit the context window: 1601 characters]"
    full = "x" * 1600 + "\n"
    assert results(fake.requests[4]) == [full, full]  # third's first request: still under
    assert results(fake.requests[5]) == [cut, full, full]  # after its own result: the oldest one cut
    assert results(fake.requests[6]) == [cut, full, full]  # and so it stays
    assert [m["content"] for m in await c.messages() if m["role"] == "tool"] == [full] * 3
    [event] = await compacted_events(c, third["turn_id"])
    assert event.data["strategy"] == "truncate" and event.data["messages"] == 1
    assert event.data["before"] > 1000 > event.data["after"]
    assert (await context(c))["compactions"] == 1


async def test_truncate_drops_the_oldest_turns_when_cutting_is_not_enough(client: httpx.AsyncClient,
                                                                        fakes: Fakes) -> None:
    fake = fakes.openai
    fake.script(Reply(text="one"), Reply(text="two"), Reply(text="three"))
    c = await Conversation.create(client, "truncating")
    await say(c, "first " + BIG)
    await say(c, "second " + BIG)
    third = await say(c, "third " + MEDIUM)
    note = "[2 earlier messages of this conversation were left out to fit the context window]"
    assert openai_texts(fake.requests[2])[1:] == [("user", note), ("user", "second " + BIG),
                                                  ("assistant", "two"), ("user", "third " + MEDIUM)]
    [event] = await compacted_events(c, third["turn_id"])
    assert event.data["messages"] == 2 and event.data["after"] < 1000
    assert len(await c.messages()) == 6


async def test_a_fork_compacts_the_transcript_it_shares_on_its_own(client: httpx.AsyncClient,
                                                                    fakes: Fakes) -> None:
    fake = fakes.openai
    fake.script(Reply(text="one"), Reply(text="two"), Reply(text="three"))
    source = await Conversation.create(client, "truncating")
    await say(source, "first " + BIG)
    await say(source, "second " + BIG)
    r = await client.post(f"{source.path}/fork", json={})
    assert r.status_code == 201, r.text
    fork = Conversation(client, r.json())
    third = await say(fork, "third " + MEDIUM)  # its source's messages (shared, not copied) are the history
    note = "[2 earlier messages of this conversation were left out to fit the context window]"
    assert openai_texts(fake.requests[2])[1:] == [("user", note), ("user", "second " + BIG),
                                                  ("assistant", "two"), ("user", "third " + MEDIUM)]
    [event] = await compacted_events(fork, third["turn_id"])
    assert event.data["messages"] == 2
    assert (await context(fork))["compactions"] == 1 and (await context(source))["compactions"] == 0
    assert len(await fork.messages()) == 6 and len(await source.messages()) == 4


# --- what cannot fit ------------------------------------------------------------------------------


async def test_an_oversized_message_fails_before_anything_is_sent(client: httpx.AsyncClient,
                                                                  fakes: Fakes) -> None:
    fakes.openai.script(Reply(text="one"))
    c = await Conversation.create(client, "summarizing")
    await say(c, "first")
    answer = await c.say("x" * 8000, bound=20)  # 2,000 tokens: no room for it in a 2,000-token window
    assert answer["status"] == "failed" and answer["error"]["code"] == "context_window_exceeded"
    assert answer["error"]["details"]["window"] == 2000
    assert len(fakes.openai.requests) == 1  # neither the turn's request nor a summary was sent
    assert [m["content"] for m in await c.messages()][-1] == "x" * 8000  # the message is kept


async def test_a_model_without_a_context_window_is_not_managed(client: httpx.AsyncClient,
                                                               fakes: Fakes) -> None:
    fakes.openai.script(Reply(text="one"), Reply(text="two"))
    c = await Conversation.create(client, "unmanaged")
    await say(c, "x" * 8000)
    await say(c, "y" * 8000)
    assert len(openai_texts(fakes.openai.requests[1])) == 4
    body = await context(c)
    assert body["window"] is None and body["compactions"] == 0 and body["used"] > 4000


# --- POST …/compact -----------------------------------------------------------------------------


async def test_compact_now_under_the_threshold_and_409_while_a_turn_runs(
        client: httpx.AsyncClient, fakes: Fakes, tmp_path: Path) -> None:
    fake = fakes.openai
    gate = tmp_path / "gate"
    fake.script(Reply(text="one"), Reply(text="two"), Reply(text="three"), Reply(text="SUMMARY-NOW"),
                Reply(calls=(Call("gate", {"path": str(gate)}),)), Reply(text="four"))
    c = await Conversation.create(client, "summarizing")
    for text in ("first", "second", "third"):  # each longer than a summary (else it would be dropped)
        await say(c, f"{text} {MEDIUM}")
    r = await client.post(f"{c.path}/compact")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["compacted"] is True and body["messages"] == 4 and body["turn_id"] is None
    assert body["context"]["compactions"] == 1
    [event] = await compacted_events(c)
    assert event.data["messages"] == 4 and event.data["turn_id"] is None
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.send, "fourth")
            await c.started()
            busy = await client.post(f"{c.path}/compact")
            assert busy.status_code == 409 and busy.json()["error"]["code"] == "conversation_busy"
            open_gate(gate)
    assert c.replies[-1].json()["status"] == "completed"
    assert openai_texts(fake.requests[4])[1:] == [
        ("user", summary_text("SUMMARY-NOW")),
        ("user", f"third {MEDIUM}"), ("assistant", "three"), ("user", "fourth")]
    fake.script(Reply(text="SUMMARY-AGAIN"))
    again = await client.post(f"{c.path}/compact")  # the third turn now: the summary goes on from the last
    assert again.status_code == 200 and again.json()["messages"] == 2
    asked = openai_texts(fake.requests[-1])[-1][1]
    assert "SUMMARY-NOW" in asked and "third" in asked and "first" not in asked and "fourth" not in asked
    nothing = await client.post(f"{c.path}/compact")  # only the last turn is left: nothing older
    assert nothing.status_code == 200 and nothing.json()["compacted"] is False
    assert nothing.json()["context"]["compactions"] == 2


async def test_a_summary_no_smaller_than_what_it_replaces_is_dropped_for_truncate(
        client: httpx.AsyncClient) -> None:
    """The offline `scripted` model echoes the conversation it is asked to summarize: each summary
    would be longer than the messages it replaces, so it is dropped and the oldest turns are left
    out instead; every turn goes on, and `POST …/compact` never makes the view larger either."""
    c = await Conversation.create(client, "echoing")
    for n in range(6):  # about 200 tokens a turn (the model echoes), against a threshold of 500
        await say(c, f"turn {n} {MEDIUM}")
    events = await compacted_events(c)
    assert events and {e.data["strategy"] for e in events} == {"truncate"}, [e.data for e in events]
    assert all(e.data["after"] < e.data["before"] and e.data["messages"] > 0 for e in events)
    used = (await context(c))["used"]
    assert used <= 500
    r = await client.post(f"{c.path}/compact")
    assert r.status_code == 200, r.text
    assert r.json()["context"]["used"] <= used
    await say(c, "one more")


async def test_context_of_an_unknown_conversation_is_404(client: httpx.AsyncClient) -> None:
    for r in (await client.get("/v1/conversations/conv_nope/context"),
              await client.post("/v1/conversations/conv_nope/compact")):
        assert r.status_code == 404 and r.json()["error"]["code"] == "conversation_not_found"


# --- a restart ------------------------------------------------------------------------------------


async def test_compaction_survives_a_restart(defs: Path, fakes: Fakes, tmp_path: Path) -> None:
    fake = fakes.openai
    fake.reset()
    state = tmp_path / "state"
    env = {"FAKE_OPENAI_KEY": "sk-fake-openai", "FAKE_ANTHROPIC_KEY": "sk-fake-anthropic"}
    fake.script(Reply(text="one"), Reply(text="two"), Reply(text="SUMMARY-BEFORE-RESTART"),
                Reply(text="three"))
    with ServerProcess(defs, state, env=env) as first:
        async with httpx.AsyncClient(base_url=first.url, timeout=20, trust_env=False) as http:
            c = await Conversation.create(http, "summarizing")
            for text in ("first " + BIG, "second " + BIG, "third " + MEDIUM):
                await say(c, text)
            used = (await context(c))["used"]
        assert first.terminate() in (0, -signal.SIGTERM), first.stderr  # uvicorn re-raises the SIGTERM
    last_before = openai_texts(fake.requests[-1])
    fake.reset()
    fake.script(Reply(text="four"))
    with ServerProcess(defs, state, env=env) as second:
        async with httpx.AsyncClient(base_url=second.url, timeout=20, trust_env=False) as http:
            c = c.through(http)
            assert (await context(c))["used"] == used and (await context(c))["compactions"] == 1
            await say(c, "fourth")
            [request] = fake.requests  # no summary made again
            assert openai_texts(request) == [*last_before, ("assistant", "three"), ("user", "fourth")]
            assert "SUMMARY-BEFORE-RESTART" in last_before[1][1]
            assert len(await compacted_events(c)) == 1


# --- the definitions ------------------------------------------------------------------------------


def agent_digest(root: Path, context: str, extra: str = "") -> str:
    write_tree(root, {"defs.yaml": f"""
        kind: Model
        name: m
        provider: scripted
        ---
        kind: Model
        name: writer
        provider: scripted
        default: {extra or "a summary"}
        ---
        kind: Agent
        name: a
        model: m
        {context}
    """})
    return Compiler(root).compile().by_key[("Agent", "a")].digest


def test_context_is_in_the_digest_and_its_defaults_change_nothing(tmp_path: Path) -> None:
    plain = agent_digest(tmp_path / "0", "")
    assert agent_digest(tmp_path / "1", "context: {}") == plain
    defaults = "context: { strategy: summarize, threshold: 0.8, keep_recent_turns: 2 }"
    assert agent_digest(tmp_path / "2", defaults) == plain
    assert agent_digest(tmp_path / "3", "context: { model: m }") == plain  # the agent's own is the default
    assert agent_digest(tmp_path / "4", "context: { threshold: 0.5 }") != plain
    assert agent_digest(tmp_path / "5", "context: { strategy: none }") != plain
    writer = agent_digest(tmp_path / "6", "context: { model: writer }")
    assert writer != plain
    # the summary model is in the closure: editing it changes the agent's digest
    assert agent_digest(tmp_path / "7", "context: { model: writer }", "another summary") != writer


@pytest.mark.parametrize(("context", "where", "words"), [
    ("context: { model: nowhere }", "context.model", "no Model named 'nowhere'"),
    ("context: { threshold: 1.5 }", "context.threshold", "less than or equal to 1"),
    ("context: { strategy: forget }", "context.strategy", "summarize"),
    ("context: { keep: 2 }", "context.keep", "unknown field"),
])
def test_context_errors_point_at_the_field(tmp_path: Path, context: str, where: str, words: str) -> None:
    with pytest.raises(DefinitionsInvalid) as raised:
        agent_digest(tmp_path, context)
    text = json.dumps([str(e) for e in raised.value.errors])
    assert where in text and words in text, text


def test_on_busy_steer_is_accepted(tmp_path: Path) -> None:
    assert agent_digest(tmp_path / "a", "on_busy: steer") != agent_digest(tmp_path / "b", "")
