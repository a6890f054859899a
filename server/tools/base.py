"""The tool port: a named callable with a JSON Schema input.

A tool is not responsible for validating its input against the schema (the
agent loop does that, and feeds errors back to the model), for permissions
or hooks (they wrap tools), or for time-outs of its caller. It is
responsible for its own time-out and output cap, and for turning every
failure into a `ToolOutput(is_error=True)` or a `ToolError` whose message is
safe to show the model (no secret values).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..deployment.vault import NO_VAULT, FileVault
from ..messages import ToolSpec

MAX_OUTPUT_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class ToolOutput:
    content: str
    is_error: bool = False


class TurnChannel(Protocol):
    """How a tool call talks back to its turn while it runs (permission requests)."""

    async def emit(self, name: str, data: dict[str, Any]) -> None: ...
    async def waiting(self, on: bool) -> None: ...  # the turn waits on a person, or no longer


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


class ToolPort(Protocol):
    spec: ToolSpec  # name, description, input schema, as the model sees them

    async def call(self, arguments: Mapping[str, Any], ctx: ToolContext) -> ToolOutput: ...


def cap_output(data: bytes, limit: int = MAX_OUTPUT_BYTES) -> str:
    """Decode tool output, cut to `limit` bytes with a visible marker."""
    if len(data) <= limit:
        return data.decode("utf-8", errors="replace")
    kept = data[:limit].decode("utf-8", errors="ignore")
    return kept + f"\n[output truncated: {len(data)} bytes, limit {limit}]"
