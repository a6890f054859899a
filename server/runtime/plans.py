"""From a closure to a runnable turn: models wrapped for resilience, tools built.

The runtime owns what turns share (the outbound HTTP client, the process
environment for `${VAR}` secrets and the `Secrets` every tool result and hook
answer is redacted of) and builds a `TurnPlan` for the one agent loop. It
never decides busy/idle or persistence: that is `conversations`.

Every tool is built behind the guard with the name hooks know it by (its
own; an MCP tool's `mcp__SERVER__TOOL`). A turn's hooks get the
conversation so far as `transcript_path`: the caller of `plan` passes what
the turn added so far (`transcript`), and the file is kept in the folder
`transcripts` (the service passes the state directory's `transcripts/`;
without one, hooks get no `transcript_path`). A sub-agent's hooks get its
parent conversation's transcript.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import httpx

from ..compiler.definitions import (
    AgentDefinition,
    Closure,
    MCPServerDefinition,
    ModelDefinition,
    SkillDefinition,
    ToolDefinition,
)
from ..deployment.vault import NO_VAULT, FileVault
from ..errors import RunError
from ..messages import Message
from ..metrics import Metrics
from ..providers.base import ModelPort
from ..providers.counted import CountedModel
from ..providers.scripted import ScriptedProvider
from ..providers.traced import traced
from ..providers.transport import ModelHTTP
from ..providers.wellformed import WellFormedModel
from ..tools.base import ToolContext, ToolPort
from ..tools.confinement import Secrets
from ..tools.skills import ActivateSkill, ReadSkillResource, skills_prompt
from ..tools.stand_in import StandIns, StoodIn
from ..tools.subagent import SubAgentTool
from .budgets import Budget
from .guard import Guarded
from .loop import Done, TurnPlan, run_turn
from .structured import OutputSchema
from .turn_traces import sub_agent_span

if TYPE_CHECKING:
    from ..tools.a2a import A2ACards
    from .hooks import Hooks, Transcript
    from .permissions import PermissionBroker

History = Callable[[], Sequence[Message]]  # the conversation so far: its history, then the turn's own


class MCPToolSource(Protocol):
    """Where tools of MCPServer definitions come from (see `tools.mcp`).

    A port may have `hook_name`, its name to hooks (`mcp__SERVER__TOOL`); else its spec's name."""

    async def tools(self, server: MCPServerDefinition, root: Path,
                    only: str | None = None) -> Sequence[ToolPort]: ...


class Runtime:
    def __init__(self, http: httpx.AsyncClient, environ: Mapping[str, str] | None = None,
                 mcp: MCPToolSource | None = None, permissions: PermissionBroker | None = None,
                 files: FileVault = NO_VAULT,
                 metrics: Metrics | None = None, secrets: Secrets | None = None,
                 transcripts: Path | None = None, a2a: A2ACards | None = None,
                 models: ModelHTTP | None = None):
        self.http = http  # tools and hooks
        self.models = ModelHTTP() if models is None else models  # model providers (see its module)
        self.a2a = a2a  # remote A2A agents: the lock's cards, drift, contexts (made on first use)
        self.environ = os.environ if environ is None else environ
        self.secrets = Secrets(self.environ) if secrets is None else secrets
        self.mcp = mcp
        self.permissions = permissions
        self.files = files
        self.metrics = metrics
        self.transcripts = transcripts  # None: hooks get no transcript_path
        self.stand_ins: StandIns | None = None  # results given in place of tools (eval cases, §12)
        self._learned: set[str] = set()  # agent digests whose closures' secrets `secrets` knows

    # --- models --------------------------------------------------------------

    def provider(self, model: ModelDefinition) -> ModelPort:
        # Outermost: a surrogate pair split across chunks is rejoined within one attempt's stream.
        return WellFormedModel(self._provider(model))

    def _provider(self, model: ModelDefinition) -> ModelPort:
        if model.provider == "scripted":
            return self._counted(ScriptedProvider(model))
        from ..providers.resilience import RetryingModel

        if model.provider == "openai":
            from ..providers.openai import OpenAIProvider

            port: ModelPort = OpenAIProvider(model, self.models, self.environ)
        else:
            from ..providers.anthropic import AnthropicProvider

            port = AnthropicProvider(model, self.models, self.environ)
        return RetryingModel(self._counted(port), model.retries, model.timeout_s)

    def _counted(self, port: ModelPort) -> ModelPort:
        # Inside the retries: each attempt is a request the provider saw (and may bill), and a span.
        port = traced(port)
        return port if self.metrics is None else CountedModel(port, self.metrics.model_requests)

    def model(self, closure: Closure) -> ModelPort:
        chain = [self.provider(m) for m in closure.model_chain()]
        if len(chain) == 1:
            return chain[0]
        from ..providers.resilience import FallbackModel

        return FallbackModel(chain)

    # --- tools ---------------------------------------------------------------

    async def tools(self, closure: Closure, hooks: Hooks | None = None,
                    transcript: Transcript | None = None) -> dict[str, ToolPort]:
        """Every tool the agent may call, each behind the guard (hooks, then permission)."""
        agent = closure.agent
        tools: list[tuple[ToolPort, str]] = []
        for ref in agent.tools:
            tools += await self._tool_ref(closure, ref)
        for name in agent.agents:
            sub = closure.get("Agent", name)
            assert isinstance(sub, AgentDefinition)
            tools.append((SubAgentTool(sub, self._sub_runner(closure, transcript)), "allow"))
        skills = self._skills(closure)
        if skills:
            tools += [(ActivateSkill(skills), "allow"), (ReadSkillResource(skills), "allow")]
        redactor = self.secrets.redactor
        if self.stand_ins is not None:
            tools = [(StoodIn(tool, self.stand_ins), permission) for tool, permission in tools]
        return {tool.spec.name: Guarded(tool, permission, hooks, self.permissions, redactor,
                                        hook_name=getattr(tool, "hook_name", None))
                for tool, permission in tools}

    async def _tool_ref(self, closure: Closure, ref: str) -> list[tuple[ToolPort, str]]:
        if "/" not in ref and ("Tool", ref) in closure.members:
            definition = closure.get("Tool", ref)
            assert isinstance(definition, ToolDefinition)
            return [(self._tool(definition), definition.permission)]
        server_name, _, only = ref.partition("/")
        server = closure.get("MCPServer", server_name)
        assert isinstance(server, MCPServerDefinition)
        if self.mcp is None:
            raise RunError(f"MCP server {server.name} is not available here", code="tool_error")
        return [(tool, "allow") for tool in await self.mcp.tools(server, closure.root, only=only or None)]

    def _tool(self, definition: ToolDefinition) -> ToolPort:
        if definition.a2a is not None:
            from ..tools.a2a import A2ACards, A2ATool

            if self.a2a is None:
                self.a2a = A2ACards()
            return A2ATool(definition, self.a2a)
        if definition.command is not None:
            from ..tools.command import CommandTool

            return CommandTool(definition)
        from ..tools.http import HttpTool

        return HttpTool(definition, self.http)

    def _skills(self, closure: Closure) -> list[SkillDefinition]:
        found = [closure.get("Skill", n) for n in closure.agent.skills]
        return [s for s in found if isinstance(s, SkillDefinition)]

    def _sub_runner(self, closure: Closure, transcript: Transcript | None):
        async def run(name: str, message: str, ctx: ToolContext) -> str:
            sub = closure.sub_closure(name)
            plan = await self._plan(sub, (), message, ctx, transcript)
            with sub_agent_span(name, sub.agent.digest, ctx):
                async for event in run_turn(plan):
                    if isinstance(event, Done):
                        return event.output
            raise RunError(f"sub-agent {name} ended without an answer")

        return run

    def hooks(self, closure: Closure, context: ToolContext,
              transcript: Transcript | None = None) -> Hooks | None:
        found = [closure.get("Hook", name) for name in closure.agent.hooks]
        if not found:
            return None
        from .hooks import Hooks

        base = {"session_id": context.conversation_id, "cwd": str(closure.root),
                "corral": {"agent": context.agent, "digest": context.digest, "turn_id": context.turn_id}}
        return Hooks(found, root=closure.root, http=self.http, environ=self.environ, base=base,
                     files=self.files, redactor=self.secrets.redactor, transcript=transcript,
                     confirm=context.channel.confirm if context.channel is not None else None)

    def transcript(self, conversation_id: str, messages: History) -> Transcript | None:
        """The file hooks read the conversation so far from (None when there is no state directory)."""
        if self.transcripts is None:
            return None
        from .hooks import Transcript

        return Transcript.of(self.transcripts, conversation_id, messages)

    async def forget_transcript(self, conversation_id: str) -> None:
        """Remove the file hooks read the conversation from: the conversation was deleted."""
        transcript = self.transcript(conversation_id, tuple)
        if transcript is not None:
            await transcript.remove()

    # --- plans ---------------------------------------------------------------

    async def plan(self, closure: Closure, history: tuple[Message, ...], text: str,
                   context: ToolContext, transcript: History | None = None) -> TurnPlan:
        """The plan of one turn; `transcript` gives the conversation so far while it runs (by default
        `history` alone), for hooks' `transcript_path`."""
        messages = transcript if transcript is not None else (lambda: history)
        return await self._plan(closure, history, text, context,
                                self.transcript(context.conversation_id, messages))

    async def _plan(self, closure: Closure, history: tuple[Message, ...], text: str,
                    context: ToolContext, transcript: Transcript | None) -> TurnPlan:
        agent = closure.agent
        # a pinned closure may reference secrets the current set no longer does (once per closure: an
        # agent's digest covers its whole closure, and walking every spec costs more than a turn's SQL)
        if agent.digest not in self._learned:
            self.secrets.learn(d.spec for d in closure.members.values())
            self._learned.add(agent.digest)
        instructions = agent.instructions
        skills = self._skills(closure)
        if skills:
            instructions += skills_prompt(skills)
        hooks = self.hooks(closure, context, transcript)
        return TurnPlan(
            instructions=instructions,
            model=self.model(closure),
            tools=await self.tools(closure, hooks, transcript),
            hooks=hooks,
            history=history,
            input=text,
            max_steps=agent.max_steps,
            context=context,
            budget=Budget.of_agent(agent),
            output=OutputSchema.of_agent(agent),
        )
