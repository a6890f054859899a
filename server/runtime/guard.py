"""The guard every tool call passes: hooks and permissions, wrapped around a tool.

Order, as in Claude Code: `pre_tool_use` hooks may allow, ask, deny or
rewrite the input; the tool's own `permission` can only be tightened by them
(deny beats ask beats allow); `ask` waits for a person through the
`PermissionBroker`; then the tool runs; then `post_tool_use` hooks may add
context or tell the model the result was rejected. A refusal is a tool
result the model can read, not a failed turn. Every known secret value is
redacted from the tool's result, whatever kind of tool produced it, before
hooks, the transcript, the stream or a model see it.

Hooks know a tool by its `hook_name`, which is not always the name the model
calls it by: an MCP server's tool is `mcp__SERVER__TOOL` to hooks and their
matchers (as in Claude Code), `server__tool` to the model. Everything the
model or a person reads names the tool as the model knows it.

The hooks that guard a call get its execution key, as the tool does
(`ToolContext.execution_key`); the guard says whether a call may be replayed
as its tool does (`replay_safe`): hooks and permissions do not change what a
second run of the tool would do. Right before the tool runs (after its hooks
and a person's answer) the turn's lease is confirmed (`TurnChannel.confirm`;
`Hooks` confirm it before each hook runs): a replica that lost the turn
starts none of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .. import tracing
from ..tools.base import ToolContext, ToolOutput, ToolPort
from ..tools.confinement import NO_REDACTION, Redactor
from ..tracing import names

if TYPE_CHECKING:
    from .hooks import Hooks
    from .permissions import PermissionBroker

RANK = {"allow": 0, "ask": 1, "deny": 2}


class Guarded:
    def __init__(self, tool: ToolPort, permission: str, hooks: Hooks | None,
                 broker: PermissionBroker | None, redactor: Redactor = NO_REDACTION,
                 hook_name: str | None = None):
        self.tool = tool
        self.hook_name = hook_name or tool.spec.name
        self.redactor = redactor
        self.spec = tool.spec
        self.permission = permission
        self.hooks = hooks
        self.broker = broker

    @property
    def replay_safe(self) -> bool:
        return self.tool.replay_safe

    async def call(self, arguments: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        name = self.spec.name
        decision, reason, args = self.permission, None, dict(arguments)
        if self.hooks is not None:  # the hooks confirm the turn's lease before they run
            verdict = await self.hooks.run("pre_tool_use", {
                "tool_name": self.hook_name, "tool_input": args, "tool_use_id": ctx.call_id,
            }, execution_key=ctx.execution_key)
            if RANK[verdict.decision] > RANK[decision] or (verdict.decision == decision != "allow"):
                decision, reason = verdict.decision, verdict.reason
            if verdict.updated_input is not None:
                args = {**args, **verdict.updated_input}
        if decision == "deny":
            return ToolOutput(f"permission denied for {name}: {reason or 'this tool may not be used'}",
                              is_error=True)
        if decision == "ask":
            if self.broker is None:
                return ToolOutput(f"{name} needs a person's approval, and none can be asked here",
                                  is_error=True)
            with tracing.span(*names.permission(name, ctx.call_id)) as waited:
                allowed, why = await self.broker.request(ctx, name, args, reason)
                waited.outcome("allowed" if allowed else "denied")
            if not allowed:
                return ToolOutput(f"permission denied for {name}: {why}", is_error=True)
        await _confirm(ctx)  # after hooks and a person's answer: a paused replica may have lost the turn
        output = await self.tool.call(args, ctx)
        # before post_tool_use hooks see it: nothing downstream ever holds the raw value
        output = ToolOutput(self.redactor.text(output.content), is_error=output.is_error)
        return await self._after(args, output, ctx)

    async def _after(self, args: dict[str, Any], output: ToolOutput, ctx: ToolContext) -> ToolOutput:
        if self.hooks is None or not self.hooks.matching("post_tool_use", self.hook_name):
            return output
        verdict = await self.hooks.run("post_tool_use", {
            "tool_name": self.hook_name, "tool_input": args, "tool_use_id": ctx.call_id,
            "tool_response": {"content": output.content, "is_error": output.is_error},
        }, execution_key=ctx.execution_key)
        content = output.content
        if verdict.decision == "deny" and verdict.reason:
            content += f"\n\n[post_tool_use hook: {verdict.reason}]"
        for note in verdict.context:
            content += f"\n\n{note}"
        return ToolOutput(content, is_error=output.is_error or verdict.decision == "deny")


async def _confirm(ctx: ToolContext) -> None:
    """The turn still holds its lease (raises `LeaseLost` if not): checked right before each side
    effect, so a replica that lost the turn starts none (§9)."""
    if ctx.channel is not None:
        await ctx.channel.confirm()
