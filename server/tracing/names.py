"""Span names and attributes: the OpenTelemetry GenAI semantic conventions where they name a thing
(semantic-conventions 1.44.0, still marked Development upstream), `corral.*` for the rest.

    invoke_agent {agent}   one attempt of a turn; a sub-agent's turn, under its tool call
    chat {model}           one model request (each retry and each fallback its own)
    execute_tool {tool}    one tool call, its hooks and permission wait inside
    hook {name}            one hook run (`corral.hook.event`)
    permission {tool}      a tool call waiting on a person's answer
    compaction {strategy}  a compaction of the conversation's context
    corral.swap            a swap of the definition set (outside any turn)
"""

from __future__ import annotations

from typing import Any

OPERATION = "gen_ai.operation.name"
DIGEST = "corral.agent.digest"  # on every span of a turn: which agent ran, exactly


def invoke_agent(agent: str, digest: str, conversation_id: str, turn_id: str,
                 attempt: int | None = None) -> tuple[str, dict[str, Any]]:
    return f"invoke_agent {agent}", {
        OPERATION: "invoke_agent", "gen_ai.agent.name": agent, "gen_ai.agent.version": digest,
        DIGEST: digest, "gen_ai.conversation.id": conversation_id, "corral.turn.id": turn_id,
        "corral.attempt": attempt,
    }


def chat(provider: str, model: str, definition: str) -> tuple[str, dict[str, Any]]:
    return f"chat {model}", {OPERATION: "chat", "gen_ai.provider.name": provider,
                             "gen_ai.request.model": model, "corral.model": definition}


def execute_tool(name: str, call_id: str, kind: str, execution_key: str) -> tuple[str, dict[str, Any]]:
    return f"execute_tool {name}", {OPERATION: "execute_tool", "gen_ai.tool.name": name,
                                    "gen_ai.tool.call.id": call_id, "gen_ai.tool.type": kind,
                                    "corral.execution_key": execution_key or None}


def hook(name: str, event: str, kind: str) -> tuple[str, dict[str, Any]]:
    return f"hook {name}", {"corral.hook.name": name, "corral.hook.event": event, "corral.hook.type": kind}


def permission(tool: str, call_id: str) -> tuple[str, dict[str, Any]]:
    return f"permission {tool}", {"gen_ai.tool.name": tool, "gen_ai.tool.call.id": call_id}


def compaction(strategy: str) -> tuple[str, dict[str, Any]]:
    return f"compaction {strategy}", {"corral.compaction.strategy": strategy}


def swap(trigger: str, status: str, before: str, after: str, changes: int,
         busy: int) -> tuple[str, dict[str, Any]]:
    return "corral.swap", {"corral.swap.trigger": trigger, "corral.swap.status": status,
                           "corral.set_digest.before": before, "corral.set_digest.after": after,
                           "corral.swap.changes": changes, "corral.swap.busy": busy}
