"""The agent loop: the one state machine every surface consumes.

prepare -> call the model (streaming) -> run the tool calls it asked for ->
feed the results back -> ... -> a final answer. It yields `Emit` (a public
turn event), `Append` (a message for the transcript) and finally `Done`;
failures are raised as `RunError`s with a stable code. The HTTP routes, the
OpenAI-compatible route, MCP and `corral chat` all drive this one generator.

Guards: tool input is validated against the tool's schema and errors go back
to the model (at most `MAX_REPAIRS` times a turn); the same call with the
same arguments three times is a loop; `max_steps` bounds model calls.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from jsonschema import Draft202012Validator

from ..canonical import canonical_json, thaw
from ..errors import RunError, ToolError
from ..messages import AssistantMessage, Message, ToolCall, ToolResultMessage, Usage, UserMessage
from ..providers.base import Finish, ModelPort, ModelRequest, TextDelta, ToolCallChunk, UsageChunk
from ..tools.base import ToolContext, ToolOutput, ToolPort

if TYPE_CHECKING:
    from .hooks import Hooks

MAX_REPAIRS = 3
MAX_STOP_ROUNDS = 3
LOOP_LIMIT = 3
EVENT_TEXT_LIMIT = 4096


@dataclass(frozen=True, slots=True)
class Emit:
    name: str
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Append:
    message: Message


@dataclass(frozen=True, slots=True)
class Done:
    output: str
    stop_reason: str
    usage: Usage


LoopEvent = Emit | Append | Done


@dataclass
class TurnPlan:
    """Everything one turn runs on, fixed when it starts."""

    instructions: str
    model: ModelPort
    tools: Mapping[str, ToolPort]
    history: tuple[Message, ...]
    input: str
    max_steps: int
    context: ToolContext
    hooks: Hooks | None = None
    validators: dict[str, Draft202012Validator] = field(default_factory=dict)


def _clip(text: str) -> str:
    return text if len(text) <= EVENT_TEXT_LIMIT else text[:EVENT_TEXT_LIMIT] + "…"


class _Guards:
    def __init__(self) -> None:
        self.repairs = 0
        self.calls: Counter[bytes] = Counter()

    def check_loop(self, call: ToolCall) -> None:
        key = call.name.encode() + b"\0" + canonical_json(call.arguments)
        self.calls[key] += 1
        if self.calls[key] >= LOOP_LIMIT:
            raise RunError(
                f"loop detected: {call.name} was called {LOOP_LIMIT} times with the same arguments",
                code="loop_detected",
            )

    def repair(self, message: str) -> ToolOutput:
        self.repairs += 1
        if self.repairs > MAX_REPAIRS:
            raise ToolError(f"the model kept sending invalid tool calls: {message}")
        return ToolOutput(message, is_error=True)


async def _prompt(plan: TurnPlan) -> str:
    """The user's message as the model gets it: after session_start and user_prompt_submit hooks."""
    if plan.hooks is None:
        return plan.input
    notes: list[str] = []
    if not plan.history:
        notes += (await plan.hooks.run("session_start", {"source": "startup"})).context
    verdict = await plan.hooks.run("user_prompt_submit", {"prompt": plan.input})
    if verdict.decision == "deny":
        raise RunError(f"the prompt was blocked by a hook: {verdict.reason or 'no reason given'}",
                       code="prompt_blocked")
    notes += verdict.context
    return "\n\n".join([plan.input, *notes])


async def _keep_going(plan: TurnPlan, rounds: int) -> str | None:
    """A stop hook's reason to continue instead of ending the turn (at most MAX_STOP_ROUNDS times)."""
    if plan.hooks is None or rounds >= MAX_STOP_ROUNDS or not plan.hooks.matching("stop"):
        return None
    verdict = await plan.hooks.run("stop", {"stop_hook_active": rounds > 0})
    return verdict.stop_continue


@dataclass
class _Step:
    """What one model call produced."""

    text: list[str] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    stop_reason: str = "end_turn"
    usage: Usage = field(default_factory=Usage)


async def _stream_step(plan: TurnPlan, request: ModelRequest, step: _Step) -> AsyncIterator[Emit]:
    # aclosing: a turn cancelled mid-stream closes the provider's HTTP response at once
    async with aclosing(plan.model.stream(request)) as chunks:
        async for chunk in chunks:
            if isinstance(chunk, TextDelta):
                if chunk.text:
                    step.text.append(chunk.text)
                    yield Emit("message.delta", {"text": chunk.text})
            elif isinstance(chunk, ToolCallChunk):
                step.calls.append(chunk.call)
            elif isinstance(chunk, UsageChunk):
                step.usage = step.usage + chunk.usage
            elif isinstance(chunk, Finish):
                step.stop_reason = chunk.stop_reason


async def run_turn(plan: TurnPlan) -> AsyncIterator[LoopEvent]:
    messages: list[Message] = [*plan.history, UserMessage(content=await _prompt(plan))]
    yield Append(messages[-1])
    specs = tuple(t.spec for t in plan.tools.values())
    usage = Usage()
    guards = _Guards()
    stop_rounds = 0
    for _ in range(plan.max_steps):
        step = _Step()
        async for event in _stream_step(plan, ModelRequest(plan.instructions, tuple(messages), specs), step):
            yield event
        usage = usage + step.usage
        text, calls, stop_reason = step.text, step.calls, step.stop_reason
        reply = AssistantMessage(content="".join(text), tool_calls=tuple(calls))
        messages.append(reply)
        yield Append(reply)
        if not calls:
            reason = await _keep_going(plan, stop_rounds)
            if reason is None:
                yield Done(reply.content, stop_reason, usage)
                return
            stop_rounds += 1
            messages.append(UserMessage(content=reason))
            yield Append(messages[-1])
            continue
        for call in calls:
            yield Emit("tool.started", {"tool_call_id": call.id, "name": call.name,
                                        "arguments": thaw(call.arguments)})
            output = await _call_tool(plan, guards, call)
            yield Emit("tool.finished", {"tool_call_id": call.id, "name": call.name,
                                         "is_error": output.is_error, "content": _clip(output.content)})
            result = ToolResultMessage(tool_call_id=call.id, name=call.name,
                                       content=output.content, is_error=output.is_error)
            messages.append(result)
            yield Append(result)
    raise RunError(f"the agent did not finish within max_steps={plan.max_steps}", code="max_steps_exceeded")


async def _call_tool(plan: TurnPlan, guards: _Guards, call: ToolCall) -> ToolOutput:
    tool = plan.tools.get(call.name)
    if tool is None:
        known = ", ".join(sorted(plan.tools)) or "none"
        return guards.repair(f"no tool named {call.name!r}; available: {known}")
    if not isinstance(call.arguments, Mapping):
        return guards.repair(f"arguments for {call.name} must be a JSON object")
    validator = plan.validators.get(call.name)
    if validator is None:
        validator = plan.validators[call.name] = Draft202012Validator(thaw(tool.spec.input_schema))
    arguments = thaw(call.arguments)
    problems = sorted(validator.iter_errors(arguments), key=lambda e: list(e.path))
    if problems:
        detail = "; ".join(f"{'/'.join(map(str, e.path)) or '(input)'}: {e.message}" for e in problems[:5])
        return guards.repair(f"invalid input for {call.name}: {detail}")
    guards.check_loop(call)
    try:
        return await tool.call(arguments, replace(plan.context, call_id=call.id))
    except ToolError as exc:
        return ToolOutput(exc.message, is_error=True)
