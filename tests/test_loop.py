"""The agent loop's guards, driven through `run_turn` with a model that plays scripted steps.

The model is a fake of the provider port (`Steps`: the n-th model call gets
the n-th step, every request is kept); the tool is a fake of the tool port
that records what it was called with. What is checked is what the loop does
with them: a repeated call is a loop, input that fails the schema goes back
to the model a bounded number of times, `max_steps` bounds model calls.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from server.errors import RunError, ToolError
from server.messages import ToolCall, ToolResultMessage, ToolSpec
from server.providers.base import Finish, ModelChunk, ModelRequest, TextDelta, ToolCallChunk
from server.runtime.loop import LOOP_LIMIT, MAX_REPAIRS, Done, Emit, LoopEvent, TurnPlan, run_turn
from server.tools.base import ToolContext, ToolOutput

pytestmark = pytest.mark.anyio

SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}, "n": {"type": "integer"}},
          "required": ["text"]}


class Steps:
    """A model that answers its n-th call with the n-th step; `requests` holds what it was sent."""

    definition = None  # the loop never reads it

    def __init__(self, *steps: Sequence[ModelChunk]):
        self.steps = steps
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        self.requests.append(request)
        assert len(self.requests) <= len(self.steps), "the loop asked for a step beyond the script"
        for chunk in self.steps[len(self.requests) - 1]:
            yield chunk


class Echo:
    """A tool that answers with its `text` argument; `calls` holds the arguments of every call it ran."""

    spec = ToolSpec(name="echo", description="Say the text back.", input_schema=SCHEMA)

    def __init__(self) -> None:
        self.calls: list[Mapping[str, Any]] = []

    async def call(self, arguments: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        self.calls.append(arguments)
        return ToolOutput(f"echo: {arguments['text']}")


CALL_IDS = itertools.count(1)


def call(arguments: Any, name: str = "echo") -> list[ModelChunk]:
    """A step that asks for one tool call (each with an id of its own, as models give them)."""
    return [ToolCallChunk(ToolCall(id=f"call_{next(CALL_IDS)}", name=name, arguments=arguments)),
            Finish("tool_use")]


def reply(text: str) -> list[ModelChunk]:
    return [TextDelta(text), Finish("end_turn")]


def plan(model: Steps, tool: Echo, tmp_path: Path, max_steps: int = 10) -> TurnPlan:
    context = ToolContext(conversation_id="conv_1", turn_id="turn_1", agent="a", digest="sha256:0",
                          root=tmp_path)
    return TurnPlan(instructions="", model=model, tools={"echo": tool}, history=(), input="go",
                    max_steps=max_steps, context=context)


async def drive(turn: TurnPlan, events: list[LoopEvent]) -> None:
    """Run the turn, keeping every event it yields (also those before it raises)."""
    with anyio.fail_after(10):
        async for event in run_turn(turn):
            events.append(event)


def results(request: ModelRequest) -> list[ToolResultMessage]:
    return [m for m in request.messages if isinstance(m, ToolResultMessage)]


# --- loop detection -------------------------------------------------------------------------------


async def test_the_same_call_three_times_ends_the_turn_as_a_loop(tmp_path: Path) -> None:
    assert LOOP_LIMIT == 3
    model, tool = Steps(*[call({"text": "again"}) for _ in range(3)], reply("never")), Echo()
    events: list[LoopEvent] = []
    with pytest.raises(RunError) as caught:
        await drive(plan(model, tool, tmp_path), events)
    assert caught.value.code == "loop_detected"
    assert "echo was called 3 times with the same arguments" in caught.value.message
    assert tool.calls == [{"text": "again"}] * 2  # the third call never ran
    assert len(model.requests) == 3
    finished = [e.data for e in events if isinstance(e, Emit) and e.name == "tool.finished"]
    assert [f["is_error"] for f in finished] == [False, False]


async def test_the_same_arguments_in_another_key_order_are_the_same_call(tmp_path: Path) -> None:
    steps = [call({"text": "a", "n": 1}), call({"n": 1, "text": "a"}), call({"text": "a", "n": 1})]
    model, tool = Steps(*steps), Echo()
    with pytest.raises(RunError) as caught:
        await drive(plan(model, tool, tmp_path), [])
    assert caught.value.code == "loop_detected"
    assert len(tool.calls) == 2


async def test_calls_with_other_arguments_are_no_loop(tmp_path: Path) -> None:
    steps = [call({"text": text}) for text in ("a", "b", "a", "b")]
    model, tool = Steps(*steps, reply("done")), Echo()
    events: list[LoopEvent] = []
    await drive(plan(model, tool, tmp_path), events)
    assert isinstance(events[-1], Done) and events[-1].output == "done"
    assert tool.calls == [{"text": text} for text in ("a", "b", "a", "b")]


# --- repairs --------------------------------------------------------------------------------------

INVALID = [
    pytest.param({"text": 5}, "echo", "invalid input for echo: text: 5 is not of type 'string'", id="schema"),
    pytest.param({}, "echo", "invalid input for echo: (input): 'text' is a required property", id="required"),
    pytest.param("not json", "echo", "arguments for echo must be a JSON object", id="not-an-object"),
    pytest.param({"text": "x"}, "shout", "no tool named 'shout'; available: echo", id="unknown-tool"),
]


@pytest.mark.parametrize(("arguments", "name", "error"), INVALID)
async def test_invalid_input_goes_back_to_the_model_at_most_max_repairs_times(
        tmp_path: Path, arguments: Any, name: str, error: str) -> None:
    assert MAX_REPAIRS == 3
    model, tool = Steps(*[call(arguments, name) for _ in range(MAX_REPAIRS + 1)], reply("never")), Echo()
    events: list[LoopEvent] = []
    with pytest.raises(ToolError) as caught:
        await drive(plan(model, tool, tmp_path), events)
    assert caught.value.code == "tool_error"
    assert caught.value.message == f"the model kept sending invalid tool calls: {error}"
    assert tool.calls == []
    assert len(model.requests) == MAX_REPAIRS + 1  # every repair went back to the model, then no more
    for n, request in enumerate(model.requests):
        sent = results(request)
        assert len(sent) == n
        assert all(r.is_error and r.content == error for r in sent)
    finished = [e.data for e in events if isinstance(e, Emit) and e.name == "tool.finished"]
    assert [(f["is_error"], f["content"]) for f in finished] == [(True, error)] * MAX_REPAIRS


async def test_a_valid_call_after_a_repair_runs(tmp_path: Path) -> None:
    model = Steps(call({"text": 5}), call({"text": "fixed"}), reply("done"))
    tool = Echo()
    events: list[LoopEvent] = []
    await drive(plan(model, tool, tmp_path), events)
    done = events[-1]
    assert isinstance(done, Done) and done.output == "done" and done.stop_reason == "end_turn"
    assert tool.calls == [{"text": "fixed"}]
    repaired, ran = results(model.requests[2])
    assert repaired.is_error and repaired.content == "invalid input for echo: text: 5 is not of type 'string'"
    assert not ran.is_error and ran.content == "echo: fixed"
    assert results(model.requests[1]) == [repaired]


async def test_the_repair_budget_is_per_turn(tmp_path: Path) -> None:
    tool = Echo()
    for _ in range(2):  # MAX_REPAIRS repairs in each of two turns: neither fails
        model = Steps(*[call({"text": 5}) for _ in range(MAX_REPAIRS)], reply("done"))
        events: list[LoopEvent] = []
        await drive(plan(model, tool, tmp_path), events)
        assert isinstance(events[-1], Done) and events[-1].output == "done"
    assert tool.calls == []


# --- max_steps ------------------------------------------------------------------------------------


async def test_max_steps_ends_a_turn_that_never_answers(tmp_path: Path) -> None:
    model, tool = Steps(call({"text": "a"}), call({"text": "b"}), reply("too late")), Echo()
    with pytest.raises(RunError) as caught:
        await drive(plan(model, tool, tmp_path, max_steps=2), [])
    assert caught.value.code == "max_steps_exceeded"
    assert caught.value.message == "the agent did not finish within max_steps=2"
    assert len(model.requests) == 2  # the third step is never asked for
    assert tool.calls == [{"text": "a"}, {"text": "b"}]


async def test_an_answer_at_the_last_step_completes(tmp_path: Path) -> None:
    model, tool = Steps(call({"text": "a"}), call({"text": "b"}), reply("just in time")), Echo()
    events: list[LoopEvent] = []
    await drive(plan(model, tool, tmp_path, max_steps=3), events)
    assert isinstance(events[-1], Done) and events[-1].output == "just in time"
    assert len(model.requests) == 3
