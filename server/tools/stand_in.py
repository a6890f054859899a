"""A tool whose result is given, not produced: what an eval case's `tool_results` are (§12).

`StoodIn` wraps a tool: when the conversation its call belongs to has a
result given for that tool (`StandIns.results`), the call answers it and the
tool never runs, so an eval exercises an agent without touching the systems
its tools reach. Any other conversation's call goes to the tool unchanged.

Not responsible for which conversations have results given (the evals' runs
say, see `evals.stand_ins`), nor for hooks and permissions: the guard wraps
this as it wraps any tool, so an eval sees them as production would.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from .base import ToolContext, ToolOutput, ToolPort


class StandIns(Protocol):
    """Which results stand in for tools in a conversation (tool name as the model calls it -> text)."""

    async def results(self, conversation_id: str) -> Mapping[str, str] | None: ...


class StoodIn:
    def __init__(self, tool: ToolPort, stand_ins: StandIns):
        self.tool = tool
        self.stand_ins = stand_ins
        self.spec = tool.spec
        self.hook_name = getattr(tool, "hook_name", None)

    @property
    def replay_safe(self) -> bool:
        return self.tool.replay_safe

    async def call(self, arguments: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        given = await self.stand_ins.results(ctx.conversation_id)
        if given is not None and self.spec.name in given:
            return ToolOutput(given[self.spec.name])
        return await self.tool.call(arguments, ctx)
