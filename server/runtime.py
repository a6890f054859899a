"""From a closure to a runnable turn: models wrapped for resilience, tools built.

The runtime owns what turns share (the outbound HTTP client, the process
environment for `${VAR}` secrets) and builds a `TurnPlan` for the one agent
loop. It never decides busy/idle or persistence: that is `conversations`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

import httpx

from .definitions import (
    AgentDefinition,
    Closure,
    MCPServerDefinition,
    ModelDefinition,
    SkillDefinition,
    ToolDefinition,
)
from .errors import RunError
from .loop import Done, TurnPlan, run_turn
from .messages import Message
from .providers.base import ModelPort
from .providers.scripted import ScriptedProvider
from .tools.base import ToolContext, ToolOutput, ToolPort
from .tools.skills import ActivateSkill, ReadSkillResource, skills_prompt
from .tools.subagent import SubAgentTool


class MCPToolSource(Protocol):
    """Where tools of MCPServer definitions come from (see `tools.mcp`)."""

    async def tools(self, server: MCPServerDefinition, root: Path,
                    only: str | None = None) -> Sequence[ToolPort]: ...


class Denied:
    """A tool whose definition says `permission: deny`: the model is told no."""

    def __init__(self, tool: ToolPort):
        self.spec = tool.spec

    async def call(self, arguments, ctx: ToolContext) -> ToolOutput:
        return ToolOutput(f"permission denied: {self.spec.name} may not be used", is_error=True)


class Runtime:
    def __init__(self, http: httpx.AsyncClient, environ: Mapping[str, str] | None = None,
                 mcp: MCPToolSource | None = None):
        self.http = http
        self.environ = os.environ if environ is None else environ
        self.mcp = mcp

    # --- models --------------------------------------------------------------

    def provider(self, model: ModelDefinition) -> ModelPort:
        if model.provider == "scripted":
            return ScriptedProvider(model)
        from .providers.resilience import RetryingModel

        if model.provider == "openai":
            from .providers.openai import OpenAIProvider

            port: ModelPort = OpenAIProvider(model, self.http, self.environ)
        else:
            from .providers.anthropic import AnthropicProvider

            port = AnthropicProvider(model, self.http, self.environ)
        return RetryingModel(port, model.retries, model.timeout_s)

    def model(self, closure: Closure) -> ModelPort:
        chain = [self.provider(m) for m in closure.model_chain()]
        if len(chain) == 1:
            return chain[0]
        from .providers.resilience import FallbackModel

        return FallbackModel(chain)

    # --- tools ---------------------------------------------------------------

    async def tools(self, closure: Closure) -> dict[str, ToolPort]:
        agent = closure.agent
        tools: dict[str, ToolPort] = {}
        for ref in agent.tools:
            for tool in await self._tool_ref(closure, ref):
                tools[tool.spec.name] = tool
        for name in agent.agents:
            sub = closure.get("Agent", name)
            assert isinstance(sub, AgentDefinition)
            tools[name] = SubAgentTool(sub, self._sub_runner(closure))
        skills = self._skills(closure)
        if skills:
            for tool in (ActivateSkill(skills), ReadSkillResource(skills)):
                tools[tool.spec.name] = tool
        return tools

    async def _tool_ref(self, closure: Closure, ref: str) -> list[ToolPort]:
        if "/" not in ref and ("Tool", ref) in closure.members:
            definition = closure.get("Tool", ref)
            assert isinstance(definition, ToolDefinition)
            tool = self._tool(definition)
            return [Denied(tool) if definition.permission != "allow" else tool]
        server_name, _, only = ref.partition("/")
        server = closure.get("MCPServer", server_name)
        assert isinstance(server, MCPServerDefinition)
        if self.mcp is None:
            raise RunError(f"MCP server {server.name} is not available here", code="tool_error")
        return list(await self.mcp.tools(server, closure.root, only=only or None))

    def _tool(self, definition: ToolDefinition) -> ToolPort:
        if definition.command is not None:
            from .tools.command import CommandTool

            return CommandTool(definition)
        from .tools.http import HttpTool

        return HttpTool(definition, self.http)

    def _skills(self, closure: Closure) -> list[SkillDefinition]:
        found = [closure.get("Skill", n) for n in closure.agent.skills]
        return [s for s in found if isinstance(s, SkillDefinition)]

    def _sub_runner(self, closure: Closure):
        async def run(name: str, message: str, ctx: ToolContext) -> str:
            sub = closure.sub_closure(name)
            plan = await self.plan(sub, (), message, ctx)
            async for event in run_turn(plan):
                if isinstance(event, Done):
                    return event.output
            raise RunError(f"sub-agent {name} ended without an answer")

        return run

    # --- plans ---------------------------------------------------------------

    async def plan(self, closure: Closure, history: tuple[Message, ...], text: str,
                   context: ToolContext) -> TurnPlan:
        agent = closure.agent
        instructions = agent.instructions
        skills = self._skills(closure)
        if skills:
            instructions += skills_prompt(skills)
        return TurnPlan(
            instructions=instructions,
            model=self.model(closure),
            tools=await self.tools(closure),
            history=history,
            input=text,
            max_steps=agent.max_steps,
            context=context,
        )
