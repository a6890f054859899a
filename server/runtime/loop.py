"""The agent loop: the one state machine every surface consumes.

prepare -> call the model (streaming) -> run the tool calls it asked for ->
feed the results back -> ... -> a final answer. It yields `Emit` (a public
turn event), `Append` (a message for the transcript) and finally `Done`;
failures are raised as `RunError`s with a stable code. The HTTP routes, the
OpenAI-compatible route, MCP and `corral chat` all drive this one generator.

Guards: tool input is validated against the tool's schema and errors go back
to the model (at most `MAX_REPAIRS` times a turn); the same call with the
same arguments three times is a loop; `max_steps` bounds model calls.

A resumed turn (its replica died; see `turns`) starts from what it had
committed (`TurnPlan.resumed`): a model step that was cut off is simply made
again, a tool call whose result was committed is not made again, and one
whose start was committed but not its result (`TurnPlan.unknown`) runs
again only if its tool is `replay_safe`; otherwise the model gets an error
result saying the outcome is unknown, and `tool.finished` says
`"outcome": "unknown"`. Every call carries an execution key that is the
same on every attempt, so what it reaches can deduplicate.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jsonschema import Draft202012Validator

from ..canonical import canonical_json, thaw
from ..errors import RunError, ToolError
from ..messages import AssistantMessage, Message, ToolCall, ToolResultMessage, Usage, UserMessage
from ..providers.base import Finish, ModelPort, ModelRequest, TextDelta, ToolCallChunk, UsageChunk
from ..tools.base import ToolContext, ToolOutput, ToolPort, for_call

if TYPE_CHECKING:
    from .hooks import Hooks

MAX_REPAIRS = 3
MAX_STOP_ROUNDS = 3
LOOP_LIMIT = 3
EVENT_TEXT_LIMIT = 4096
UNKNOWN_OUTCOME = ("the outcome of this call is unknown: the server running it stopped before its result"
                   " was recorded, and the tool is not marked safe to run again. Check whether it took"
                   " effect before calling it again.")


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
    resumed: tuple[Message, ...] = ()  # what an earlier attempt of this turn committed
    started: frozenset[str] = frozenset()  # tool calls whose `tool.started` is committed
    unknown: frozenset[str] = frozenset()  # ... and which may have run, with no result committed


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
    guards = _Guards()
    usage = Usage()
    if plan.resumed:
        messages: list[Message] = [*plan.history, *plan.resumed]
        async for event in _resume(plan, guards, messages):
            yield event
            if isinstance(event, Done):
                return
    else:
        messages = [*plan.history, UserMessage(content=await _prompt(plan))]
        yield Append(messages[-1])
    specs = tuple(t.spec for t in plan.tools.values())
    stop_rounds = 0
    steps_done = sum(isinstance(m, AssistantMessage) for m in plan.resumed)
    for _ in range(max(plan.max_steps - steps_done, 0)):
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
            async for event in _tool_call(plan, guards, call, messages):
                yield event
    raise RunError(f"the agent did not finish within max_steps={plan.max_steps}", code="max_steps_exceeded")


async def _resume(plan: TurnPlan, guards: _Guards, messages: list[Message]) -> AsyncIterator[LoopEvent]:
    """Pick up where an earlier attempt's commits end: its final answer, or its step's open calls."""
    replies = [m for m in plan.resumed if isinstance(m, AssistantMessage)]
    if not replies or not isinstance(plan.resumed[-1], AssistantMessage | ToolResultMessage):
        return  # the prompt (or a stop hook's reason) is the last word: the next model step follows
    reply = replies[-1]
    if not reply.tool_calls and plan.resumed[-1] is reply:
        yield Done(reply.content, "end_turn", Usage())
        return
    after = plan.resumed[plan.resumed.index(reply) + 1:]
    answered = {m.tool_call_id for m in after if isinstance(m, ToolResultMessage)}
    for call in reply.tool_calls:
        if call.id not in answered:
            async for event in _tool_call(plan, guards, call, messages):
                yield event


async def _tool_call(plan: TurnPlan, guards: _Guards, call: ToolCall,
                     messages: list[Message]) -> AsyncIterator[LoopEvent]:
    """One call: `tool.started`, the call (or, for an unsafe call a crash cut off, an unknown
    outcome), `tool.finished`, and its result in the transcript."""
    if call.id not in plan.started:
        yield Emit("tool.started", {"tool_call_id": call.id, "name": call.name,
                                    "arguments": thaw(call.arguments)})
    tool = plan.tools.get(call.name)
    unknown = call.id in plan.unknown and not getattr(tool, "replay_safe", False)
    output = ToolOutput(UNKNOWN_OUTCOME, is_error=True) if unknown else await _call_tool(plan, guards, call)
    finished = {"tool_call_id": call.id, "name": call.name, "is_error": output.is_error,
                "content": _clip(output.content)}
    if unknown:
        finished["outcome"] = "unknown"
    yield Emit("tool.finished", finished)
    result = ToolResultMessage(tool_call_id=call.id, name=call.name, content=output.content,
                               is_error=output.is_error)
    messages.append(result)
    yield Append(result)


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
        return await tool.call(arguments, for_call(plan.context, call.id))  # with its execution key
    except ToolError as exc:
        return ToolOutput(exc.message, is_error=True)
