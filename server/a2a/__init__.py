"""Corral's agents over A2A (Agent2Agent 1.0, and the 0.3 method names), with the official `a2a-sdk`.

Every agent is an A2A agent: `cards` (its card, version = digest), `routes`
(the card and the JSON-RPC endpoint at `/a2a/{ref}`), `handler` (the
methods, over the runtime's `Conversations`: contexts are conversations,
tasks are turns), `tasks` (turns and their events as A2A types), `listing`
(`ListTasks`), `failures` (Corral's errors as A2A's). A surface beside HTTP
and MCP: it runs nothing of its own.

The SDK opens OpenTelemetry spans around every call whenever the OTel API is
importable (the `mcp` package brings it), even with no tracer configured:
about a twentieth of an A2A turn's CPU (bench/a2a.py). Off unless
`OTEL_INSTRUMENTATION_A2A_SDK_ENABLED=true` asks for them; read once, when
the SDK is first imported, hence before the imports below.
"""

import os

os.environ.setdefault("OTEL_INSTRUMENTATION_A2A_SDK_ENABLED", "false")

from .cards import is_card_path  # after the setting above
from .routes import agent_card, jsonrpc, routes

__all__ = ["agent_card", "is_card_path", "jsonrpc", "routes"]
