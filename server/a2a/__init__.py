"""Corral's agents over A2A (Agent2Agent 1.0, and the 0.3 method names), with the official `a2a-sdk`.

Every agent is an A2A agent: `cards` (its card, version = digest), `routes`
(the card and the JSON-RPC endpoint at `/a2a/{ref}`), `handler` (the
methods, over the runtime's `Conversations`: contexts are conversations,
tasks are turns), `tasks` (turns and their events as A2A types), `listing`
(`ListTasks`), `failures` (Corral's errors as A2A's). A surface beside HTTP
and MCP: it runs nothing of its own.
"""

from .cards import is_card_path
from .routes import agent_card, jsonrpc, routes

__all__ = ["agent_card", "is_card_path", "jsonrpc", "routes"]
