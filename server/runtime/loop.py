"""The agent loop: the one state machine every surface consumes.

prepare -> call the model (streaming) -> run the tool calls it asked for ->
feed the results back -> ... -> a final answer. It yields `Emit` (a public
turn event, one of `turn_events`), `Append` (a message for the transcript)
and finally `Done`; failures are raised as `RunError`s with a stable code.
The HTTP routes, the OpenAI-compatible route, MCP and `corral chat` all
drive this one generator.

Guards: tool input is validated against the tool's schema and errors go back
to the model (at most `MAX_REPAIRS` times a turn); the same call with the
same arguments three times is a loop; `max_steps` bounds model calls.

A resumed turn (its replica died; see `turn_runner`) starts from what it had
committed (`TurnPlan.resumed`): a model step that was cut off is simply made
again, a tool call whose result was committed is not made again, and one
whose start was committed but not its result (`TurnPlan.unknown`) runs
again only if its tool is `replay_safe`; otherwise the model gets an error
result saying the outcome is unknown, and `tool.finished` says
`"outcome": "unknown"`. Every call carries an execution key that is the
same on every attempt, so what it reaches can deduplicate.

Context (`context_window`): before each model request, messages steered into the
running turn join it (`steers`), and the request carries the conversation's
view (`window`: compacted when it must be, refused when it cannot fit).

Budgets and structured output (`budgets`, `structured`): a turn's `budget`
is checked before each model request (on an estimate) and after it (on the
reported usage), and `Spent` reports what the turn spent so far after each
request; with an `output` schema, a final answer that is not valid JSON for
it gets a repair message (at most `structured.MAX_REPAIRS`), then the turn
fails with `output_invalid`; `Done` then carries the JSON text and its value.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jsonschema import Draft202012Validator

from ..canonical import canonical_json, thaw
from ..compiler import schemas
from ..errors import RunError, ToolError
from ..messages import AssistantMessage, Message, ToolCall, ToolResultMessage, Usage, UserMessage
from ..providers.base import Finish, ModelPort, ModelRequest, TextDelta, ToolCallChunk, UsageChunk
from ..tools.base import ToolContext, ToolOutput, ToolPort, for_call
from ..turn_events import ABSENT, MessageDelta, ToolFinished, ToolStarted, TurnEvent
from .budgets import Budget, TurnSpend
from .structured import MAX_REPAIRS as MAX_OUTPUT_REPAIRS
from .structured import MISSING, OutputProblem, OutputSchema
from .turn_traces import tool_span

if TYPE_CHECKING:
    from .context_window import ContextWindow
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
    """A public turn event; `name` and `data` are its wire form."""

    event: TurnEvent

    @property
    def name(self) -> str:
        return self.event.name

    @property
    def data(self) -> dict[str, Any]:
        return self.event.to_json()


@dataclass(frozen=True, slots=True)
class Append:
    message: Message


@dataclass(frozen=True, slots=True)
class Spent:
    usage: Usage  # what the turn's model requests have used so far (reported by the providers)


@dataclass(frozen=True, slots=True)
class Done:
    output: str
    stop_reason: str
    usage: Usage
    structured: Any = MISSING  # the output's value, when the turn had an output schema


LoopEvent = Emit | Append | Spent | Done


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
    budget: Budget | None = None  # the agent's token budget (`budgets`)
    used: Usage = field(default_factory=Usage)  # what earlier attempts of this turn used (committed)
    output: OutputSchema | None = None  # the JSON the final answer must be (`structured`)
    window: ContextWindow | None = None  # what each model request carries, compacted (`context_window`)
    steers: Callable[[], Awaitable[list[Message]]] | None = None  # messages steered in, once committed


def _clip(text: str) -> str:
    return text if len(text) <= EVENT_TEXT_LIMIT else text[:EVENT_TEXT_LIMIT] + "…"


class _Guards:
    def __init__(self) -> None:
        self.repairs = 0
        self.output_repairs = 0  # answers that were not the JSON of the turn's output schema
        self.stop_rounds = 0  # times a stop hook had the turn go on
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
    return await plan.hooks.submitted(plan.input, notes)


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
                    yield Emit(MessageDelta(text=chunk.text))
            elif isinstance(chunk, ToolCallChunk):
                step.calls.append(chunk.call)
            elif isinstance(chunk, UsageChunk):
                step.usage = step.usage + chunk.usage
            elif isinstance(chunk, Finish):
                step.stop_reason = chunk.stop_reason
    if plan.window is not None:  # the provider's count of what the request carried, if it gave one
        plan.window.observe(step.usage)


async def _carried(plan: TurnPlan, messages: list[Message]) -> tuple[tuple[Message, ...], Usage]:
    """What the next request carries: the turn so far, with the messages steered into it since
    (`if_busy: steer`), as the conversation's context window has it (compacted, or refused); and
    what compacting it spent on a summary."""
    if plan.steers is not None:
        messages += await plan.steers()
    if plan.window is None:
        return tuple(messages), Usage()
    carried = await plan.window.prepare(messages)
    return carried, plan.window.take_spent()


async def run_turn(plan: TurnPlan) -> AsyncIterator[LoopEvent]:
    guards = _Guards()
    usage = plan.used  # a resumed turn goes on from what its earlier attempts spent
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
    steps_done = sum(isinstance(m, AssistantMessage) for m in plan.resumed)
    instructions, response_format = _form(plan)
    spend = TurnSpend(plan.budget, instructions, specs)
    spend.add(plan.used)
    for _ in range(max(plan.max_steps - steps_done, 0)):
        step = _Step()
        carried, summarized = await _carried(plan, messages)
        usage = usage + summarized  # compacting the context may have asked a model for a summary
        yield Spent(usage)
        spend.add(summarized)
        request = ModelRequest(instructions, carried, specs, response_format)
        spend.before(request)
        async for event in _stream_step(plan, request, step):
            yield event
        usage = usage + step.usage
        yield Spent(usage)
        text, calls, stop_reason = step.text, step.calls, step.stop_reason
        reply = AssistantMessage(content="".join(text), tool_calls=tuple(calls))
        spend.after(step.usage, reply)
        messages.append(reply)
        yield Append(reply)
        if not calls:
            follow_up = await _follow_up(plan, guards, reply)
            if not isinstance(follow_up, UserMessage):
                yield Done(follow_up[0], stop_reason, usage, follow_up[1])
                return
            messages.append(follow_up)
            yield Append(follow_up)
            continue
        for index, call in enumerate(calls):  # the first call says what the step that asked for it used
            async for event in _tool_call(plan, guards, call, messages, step.usage if index == 0 else None):
                yield event
    raise RunError(f"the agent did not finish within max_steps={plan.max_steps}", code="max_steps_exceeded")


def _form(plan: TurnPlan) -> tuple[str, Mapping[str, Any] | None]:
    """The instructions the model gets, and the `response_format` of providers that take one."""
    if plan.output is None:
        return plan.instructions, None
    return plan.instructions + plan.output.note(), plan.output.response_format


def _answer(plan: TurnPlan, guards: _Guards, reply: AssistantMessage) -> tuple[str, Any] | UserMessage:
    """A final reply's output and structured value; or, when it is not the JSON the turn's schema asks
    for, the message asking for a repair (past `MAX_OUTPUT_REPAIRS`, `output_invalid`)."""
    if plan.output is None:
        return reply.content, MISSING
    try:
        return plan.output.parse(reply.content)
    except OutputProblem as problem:
        guards.output_repairs += 1
        if guards.output_repairs > MAX_OUTPUT_REPAIRS:
            raise plan.output.failed(problem) from None
        return UserMessage(content=plan.output.repair(problem))


async def _follow_up(plan: TurnPlan, guards: _Guards,
                     reply: AssistantMessage) -> tuple[str, Any] | UserMessage:
    """After a reply without tool calls: what ends the turn (its output and structured value), or
    the user message the model gets next (a repair, or a stop hook's reason to go on)."""
    answer = _answer(plan, guards, reply)
    if isinstance(answer, UserMessage):
        return answer
    reason = await _keep_going(plan, guards.stop_rounds)
    if reason is None:
        return answer
    guards.stop_rounds += 1
    return UserMessage(content=reason)


async def _resume(plan: TurnPlan, guards: _Guards, messages: list[Message]) -> AsyncIterator[LoopEvent]:
    """Pick up where an earlier attempt's commits end: its final answer, or its step's open calls."""
    replies = [m for m in plan.resumed if isinstance(m, AssistantMessage)]
    if not replies or not isinstance(plan.resumed[-1], AssistantMessage | ToolResultMessage):
        return  # the prompt (or a stop hook's reason) is the last word: the next model step follows
    reply = replies[-1]
    if not reply.tool_calls and plan.resumed[-1] is reply:
        answer = _answer(plan, guards, reply)
        if isinstance(answer, UserMessage):  # cut off before its repair was asked for: ask now
            messages.append(answer)
            yield Append(answer)
        else:
            yield Done(answer[0], "end_turn", plan.used, answer[1])
        return
    after = plan.resumed[plan.resumed.index(reply) + 1:]
    answered = {m.tool_call_id for m in after if isinstance(m, ToolResultMessage)}
    for call in reply.tool_calls:
        if call.id not in answered:
            async for event in _tool_call(plan, guards, call, messages):
                yield event


async def _tool_call(plan: TurnPlan, guards: _Guards, call: ToolCall, messages: list[Message],
                     usage: Usage | None = None) -> AsyncIterator[LoopEvent]:
    """One call: `tool.started` (with `usage`, what the model step that asked for it used, when
    given: a turn's steps read it), the call (or, for an unsafe call a crash cut off, an unknown
    outcome), `tool.finished`, and its result in the transcript."""
    if call.id not in plan.started:
        yield Emit(ToolStarted(tool_call_id=call.id, tool=call.name, arguments=thaw(call.arguments),
                               usage=ABSENT if usage is None else usage.to_json()))
    tool = plan.tools.get(call.name)
    unknown = call.id in plan.unknown and not getattr(tool, "replay_safe", False)
    with tool_span(plan.context, call) as traced:
        output = (ToolOutput(UNKNOWN_OUTCOME, is_error=True) if unknown
                  else await _call_tool(plan, guards, call))
        traced.finished(output, unknown)
    # the hooks that ran for it: the turn's steps read them from here
    yield Emit(ToolFinished(tool_call_id=call.id, tool=call.name, is_error=output.is_error,
                            content=_clip(output.content), hooks=traced.hooks or ABSENT,
                            outcome="unknown" if unknown else ABSENT))
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
        validator = plan.validators[call.name] = schemas.validator(thaw(tool.spec.input_schema))
    arguments = thaw(call.arguments)
    problems = schemas.problems(validator, arguments)
    if problems:
        detail = "; ".join(f"{'/'.join(map(str, e.path)) or '(input)'}: {e.message}" for e in problems[:5])
        return guards.repair(f"invalid input for {call.name}: {detail}")
    guards.check_loop(call)
    try:
        return await tool.call(arguments, for_call(plan.context, call.id))  # with its execution key
    except ToolError as exc:
        return ToolOutput(exc.message, is_error=True)
