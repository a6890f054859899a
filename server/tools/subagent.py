"""A sub-agent as a tool: the parent's model delegates a message to it.

The sub-agent runs a turn of its own (fresh transcript, its own model and
tools) on the closure the parent turn started with, and its final answer is
the tool's result. It is not `replay_safe`: running it again would run a
whole new turn of the sub-agent, tools and all; resuming the parent turn is
to resume the sub-agent's own turn instead (§9). The sub-agent's turn runs on
the context of the call that started it, so its own calls' execution keys
derive from that call's key (`tools.base.for_call`) and never repeat one of
the parent's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ..canonical import freeze
from ..compiler.definitions import AgentDefinition
from ..errors import RunError
from ..messages import ToolSpec
from .base import ToolContext, ToolOutput

RunSubAgent = Callable[[str, str, ToolContext], Awaitable[str]]


class SubAgentTool:
    replay_safe = False

    def __init__(self, agent: AgentDefinition, run: RunSubAgent):
        self.agent = agent
        self.run = run
        self.spec = ToolSpec(
            name=agent.name,
            description=agent.description or f"Delegate a task to the {agent.name} agent.",
            input_schema=freeze({
                "type": "object",
                "properties": {"message": {"type": "string", "description": "what to ask the agent"}},
                "required": ["message"],
            }),
        )

    async def call(self, arguments: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        try:
            return ToolOutput(await self.run(self.agent.name, arguments["message"], ctx))
        except RunError as exc:
            return ToolOutput(f"{self.agent.name} failed: {exc.message}", is_error=True)
