"""A remote A2A agent as a tool: a Tool with `a2a: {url, headers}` (CONTRACT §14).

One call is one `SendMessage` (the official `a2a-sdk` client): its text is
the input's `message` (a Tool with its own input schema sends the arguments
as a data part), its answer the task's artifacts (a task that failed, was
cancelled or waits on the remote side's person is an error result naming
it). The call's execution key is the message id, so the remote side can
recognize a retried call. The remote context is kept per Corral conversation
and tool (`Contexts`), so a follow-up in the same conversation continues it.

`url` is the agent card's URL (or the agent's base URL, the card then
fetched from `/.well-known/agent-card.json` under it). The card is fetched
on every call and its digest (the canonical JSON of the card as served)
compared with `a2a_cards` in `corral.lock`: a difference is reported once
per observed digest (`on_drift`), and in locked mode the call fails naming
it. `${VAR}` secrets in `headers` are resolved at call time and never appear
in what the tool returns.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import httpx
from a2a.client import ClientConfig, ClientFactory
from a2a.client.card_resolver import parse_agent_card
from a2a.helpers import get_artifact_text, get_text_parts
from a2a.types.a2a_pb2 import (
    ROLE_USER,
    TASK_STATE_COMPLETED,
    TASK_STATE_INPUT_REQUIRED,
    AgentCard,
    Message,
    Part,
    SendMessageRequest,
    Task,
    TaskState,
)
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
from a2a.utils.errors import A2AError
from google.protobuf.struct_pb2 import Value

from ..canonical import digest_of
from ..compiler.definitions import DefinitionSet, ToolDefinition
from ..compiler.templates import MissingSecret
from ..messages import ToolSpec
from .base import ToolContext, ToolOutput, cap_output
from .command import redact, resolve_tracked

DriftCallback = Callable[[str, str, str], None]  # (tool name, locked digest, observed digest)
MAX_CONTEXTS = 10_000


class CardUnavailable(Exception):
    """The card could not be fetched or read; the message names no secret."""


def card_url(url: str) -> str:
    """Where the card is: `url` itself when it names a JSON file, else the well-known path under it."""
    return url if url.endswith(".json") else url.rstrip("/") + AGENT_CARD_WELL_KNOWN_PATH


def headers_of(definition: ToolDefinition, environ: Mapping[str, str], secrets: set[str]) -> dict[str, str]:
    assert definition.a2a is not None
    return {k: resolve_tracked(v, environ, secrets) for k, v in (definition.a2a.get("headers") or {}).items()}


async def fetch_card(http: httpx.AsyncClient, definition: ToolDefinition) -> tuple[AgentCard, str]:
    """The card the tool's `url` names, and its digest (the canonical JSON of the card as served)."""
    assert definition.a2a is not None
    where = card_url(definition.a2a["url"])
    try:
        reply = await http.get(where)
    except httpx.HTTPError as exc:
        why = type(exc).__name__
        raise CardUnavailable(f"the agent card at {where} could not be fetched: {why}") from None
    if reply.status_code != 200:
        raise CardUnavailable(f"the agent card at {where} answered HTTP {reply.status_code}")
    try:
        data = reply.json()
        digest = digest_of(data)  # first: the SDK's parser rewrites the 0.3 fields in place
        return parse_agent_card(copy.deepcopy(data)), digest
    except (ValueError, TypeError) as exc:
        raise CardUnavailable(f"the agent card at {where} is not a card: {exc}") from None


class Contexts:
    """The remote context of each (Corral conversation, tool), newest kept (a bounded, in-memory map)."""

    def __init__(self, limit: int = MAX_CONTEXTS):
        self.limit = limit
        self._ids: OrderedDict[tuple[str, str], str] = OrderedDict()

    def get(self, conversation_id: str, tool: str) -> str:
        return self._ids.get((conversation_id, tool), "")

    def put(self, conversation_id: str, tool: str, context_id: str) -> None:
        self._ids[(conversation_id, tool)] = context_id
        self._ids.move_to_end((conversation_id, tool))
        while len(self._ids) > self.limit:
            self._ids.popitem(last=False)


class A2ACards:
    """The lock's card digests and what to do when a card differs: report it (once per digest), and
    refuse the call in locked mode. Also where each conversation's remote contexts are kept."""

    def __init__(self, expected: Mapping[str, str] | None = None, *, locked: bool = False,
                 on_drift: DriftCallback | None = None):
        self.expected = dict(expected or {})
        self.locked = locked
        self.on_drift = on_drift
        self.contexts = Contexts()
        self._reported: dict[str, str] = {}

    def check(self, tool: str, observed: str) -> str | None:
        """None when the card is as locked (or the lock has none for it); else the drift (refused or not)."""
        expected = self.expected.get(tool)
        if expected is None or expected == observed:
            return None
        if self._reported.get(tool) != observed:
            self._reported[tool] = observed
            if self.on_drift is not None:
                self.on_drift(tool, expected, observed)
        return f"A2A tool {tool}: agent card drifted from corral.lock ({expected} -> {observed})"


class A2ATool:
    def __init__(self, definition: ToolDefinition, cards: A2ACards):
        assert definition.a2a is not None
        self.definition = definition
        self.cards = cards
        self.spec = ToolSpec(definition.name, definition.description, definition.input_schema)
        self.replay_safe = definition.replay_safe
        self.timeout_s = float(definition.a2a.get("timeout_s", 120.0))

    async def call(self, arguments: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        secrets: set[str] = set()
        try:
            headers = headers_of(self.definition, ctx.environ, secrets)
        except MissingSecret as exc:
            return ToolOutput(f"A2A tool {self.definition.name}: {exc}", is_error=True)
        try:
            with anyio.fail_after(self.timeout_s):
                output = await self._call(arguments, ctx, headers)
        except TimeoutError:
            output = ToolOutput(f"the remote agent did not answer within {self.timeout_s:g}s", is_error=True)
        except (CardUnavailable, A2AError, httpx.HTTPError, ValueError) as exc:
            why = str(exc) or type(exc).__name__
            output = ToolOutput(f"A2A tool {self.definition.name}: {why}", is_error=True)
        return ToolOutput(redact(output.content, secrets), is_error=output.is_error)

    async def _call(self, arguments: Mapping[str, Any], ctx: ToolContext,
                    headers: dict[str, str]) -> ToolOutput:
        name = self.definition.name
        async with httpx.AsyncClient(headers=headers, timeout=self.timeout_s, trust_env=False) as http:
            card, observed = await fetch_card(http, self.definition)
            drift = self.cards.check(name, observed)
            if drift is not None and self.cards.locked:
                return ToolOutput(drift + "; refused in locked mode", is_error=True)
            client = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(card)
            message = self._message(arguments, ctx)
            task: Task | None = None
            async for response in client.send_message(SendMessageRequest(message=message)):
                if response.HasField("task"):
                    task = response.task
                elif response.HasField("message"):
                    return ToolOutput(cap_output("\n".join(get_text_parts(response.message.parts)).encode()))
        if task is None:
            return ToolOutput("the remote agent answered with no task", is_error=True)
        if task.context_id:
            self.cards.contexts.put(ctx.conversation_id, name, task.context_id)
        return _result(task)

    def _message(self, arguments: Mapping[str, Any], ctx: ToolContext) -> Message:
        text = arguments.get("message")
        if isinstance(text, str) and set(arguments) == {"message"}:
            part = Part(text=text)
        else:  # a Tool with its own input schema: the arguments as they are
            data = Value()
            data.struct_value.update(dict(arguments))
            part = Part(data=data, media_type="application/json")
        context_id = self.cards.contexts.get(ctx.conversation_id, self.definition.name)
        return Message(message_id=ctx.execution_key or ctx.call_id or ctx.turn_id, role=ROLE_USER,
                       parts=[part], context_id=context_id)


def _result(task: Task) -> ToolOutput:
    state: TaskState = task.status.state
    answer = "\n".join(get_artifact_text(a) for a in task.artifacts)
    said = "\n".join(get_text_parts(task.status.message.parts))
    if state == TASK_STATE_COMPLETED:
        return ToolOutput(cap_output((answer or said).encode()))
    if state == TASK_STATE_INPUT_REQUIRED:
        return ToolOutput(f"the remote agent's task {task.id} waits on a person there: {said}", is_error=True)
    what = TaskState.Name(state).removeprefix("TASK_STATE_").lower()
    return ToolOutput(f"the remote agent's task {task.id} ended {what}: {said}".rstrip(": "), is_error=True)


async def observe_cards(definitions: DefinitionSet, environ: Mapping[str, str]) -> dict[str, str]:
    """`corral lock`: the card digest of every `a2a` tool, fetched now. Raises `CardsUnavailable`."""
    tools = [t for t in definitions.of_kind("Tool") if isinstance(t, ToolDefinition) and t.a2a is not None]
    found: dict[str, str] = {}
    failures: dict[str, str] = {}
    for tool in tools:
        secrets: set[str] = set()
        try:
            async with httpx.AsyncClient(headers=headers_of(tool, environ, secrets), timeout=30,
                                         trust_env=False) as http:
                found[tool.name] = (await fetch_card(http, tool))[1]
        except (CardUnavailable, MissingSecret) as exc:
            failures[tool.name] = redact(str(exc), secrets)
    if failures:
        raise CardsUnavailable(failures)
    return found


class CardsUnavailable(Exception):
    def __init__(self, failures: dict[str, str]):
        super().__init__(", ".join(sorted(failures)))
        self.failures = failures
