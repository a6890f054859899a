"""The tool port: a named callable with a JSON Schema input.

A tool is not responsible for validating its input against the schema (the
agent loop does that, and feeds errors back to the model), for permissions
or hooks (they wrap tools), or for time-outs of its caller. It is
responsible for its own time-out and output cap, and for turning every
failure into a `ToolOutput(is_error=True)` or a `ToolError` whose message is
safe to show the model (no secret values).

Two things let a turn resume after a crash (§9). `replay_safe` says whether a
call whose outcome is unknown (its start was committed, its result was not)
may simply run again. `ToolContext.execution_key` is the same for every
attempt of one tool call, and each kind of tool hands it to what it calls
(`CORRAL_EXECUTION_KEY`, an `Idempotency-Key` header, MCP `_meta`), so a
downstream system can recognize a repeat and do the work once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from ..deployment.vault import NO_VAULT, FileVault
from ..messages import ToolSpec
from ..turn_events import TurnEvent

MAX_OUTPUT_BYTES = 256 * 1024
EXECUTION_KEY_ENV = "CORRAL_EXECUTION_KEY"  # the one CORRAL_* variable a command tool or hook sees
EXECUTION_KEY_META = "corral/execution_key"  # its name in an MCP request's `_meta`


@dataclass(frozen=True, slots=True)
class ToolOutput:
    content: str
    is_error: bool = False


class TurnChannel(Protocol):
    """How a tool call talks back to its turn while it runs (permission requests)."""

    async def emit(self, event: TurnEvent) -> None: ...
    async def waiting(self, on: bool) -> None: ...  # the turn waits on a person, or no longer
    async def confirm(self) -> None: ...  # right before a side effect: raises LeaseLost if taken over


@dataclass(frozen=True)
class ToolContext:
    """What a running tool may know about the turn that called it."""

    conversation_id: str
    turn_id: str
    agent: str
    digest: str
    root: Path  # the definition directory: relative paths in specs start here
    environ: Mapping[str, str] = field(default_factory=dict)  # for ${VAR} secrets
    extra: Mapping[str, Any] = field(default_factory=dict)
    call_id: str = ""  # the model's id for this tool call
    channel: TurnChannel | None = None
    files: FileVault = NO_VAULT  # definition files as compiled (see `vault`)
    execution_key: str = ""  # stable across attempts of this call (`execution_key`); "" = none to pass


def execution_key(turn_id: str, call_id: str) -> str:
    """The execution key of one tool call, from the turn and the model's id for the call alone:
    an attempt that resumes the turn after a crash computes the same key without storing it, and
    calls get distinct keys as long as the model gave them distinct ids (as the transcript needs
    too). Hashed, so a downstream system sees an opaque token of one fixed shape."""
    return "ek_" + hashlib.sha256(f"{turn_id}/{call_id}".encode()).hexdigest()[:32]


def for_call(ctx: ToolContext, call_id: str) -> ToolContext:
    """The context of one tool call of the turn `ctx` runs: its call id and execution key.

    A sub-agent's turn runs on the context of the parent's call that started it (same turn id),
    and its model numbers its calls afresh; its keys derive from that call's key instead of the
    turn id, so they never collide with the parent's and stay stable across attempts as it does.
    """
    scope = ctx.execution_key or ctx.turn_id
    return replace(ctx, call_id=call_id, execution_key=execution_key(scope, call_id))


class ToolPort(Protocol):
    spec: ToolSpec  # name, description, input schema, as the model sees them

    @property
    def replay_safe(self) -> bool:
        """May a call cut off by a crash, its outcome unknown, run again? (If not, the model is told.)"""
        ...

    async def call(self, arguments: Mapping[str, Any], ctx: ToolContext) -> ToolOutput: ...


def cap_output(data: bytes, limit: int = MAX_OUTPUT_BYTES) -> str:
    """Decode tool output, cut to `limit` bytes with a visible marker."""
    if len(data) <= limit:
        return data.decode("utf-8", errors="replace")
    kept = data[:limit].decode("utf-8", errors="ignore")
    return kept + f"\n[output truncated: {len(data)} bytes, limit {limit}]"
