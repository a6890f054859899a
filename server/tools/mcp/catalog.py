"""What an MCP server's tools look like to Corral: names, catalogs, results.

- A tool reaches the model as `{server}__{tool}`, cut to what every provider
  accepts (`^[A-Za-z0-9_-]{1,64}$`); a name that had to change gets a short
  hash of the original, so two tools never end up with one name. Hooks and
  their matchers know it as Claude Code does, `mcp__{server}__{tool}` with
  the tool's original name (`hook_name`).
- A server's catalog is the list of the tools its definition exposes (after
  `tools.include` / `tools.exclude`), each `{name, description,
  input_schema}`, sorted by name; `corral.lock` records its digest.
- A tool result becomes text: text blocks joined, other blocks summarized,
  structured content as JSON when there is no text.
- Whether a call may run again after a crash left its outcome unknown
  (`replay_safe`) follows the server's annotations, since an MCPServer
  definition does not say: a tool that declares itself read-only or
  idempotent may; one that declares nothing may not.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from typing import Any

import mcp.types as types

from ...canonical import digest_of
from ...compiler.definitions import MCPServerDefinition
from ..base import ToolOutput, cap_output

MAX_NAME = 64
_INVALID = re.compile(r"[^A-Za-z0-9_-]")
_VALID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def tool_name(server: str, tool: str) -> str:
    """The name the model sees for `tool` of `server`."""
    name = f"{server}__{tool}"
    if _VALID.match(name):
        return name
    suffix = hashlib.sha256(name.encode()).hexdigest()[:8]
    return _INVALID.sub("_", name)[: MAX_NAME - len(suffix) - 1] + "_" + suffix


def hook_name(server: str, tool: str) -> str:
    """The name hooks and their matchers know `tool` of `server` by, as in Claude Code."""
    return f"mcp__{server}__{tool}"


def entry(tool: types.Tool) -> dict[str, Any]:
    """One catalog entry: what the model is shown of a tool."""
    return {
        "name": tool.name,
        "description": tool.description or "",
        "input_schema": dict(tool.input_schema or {"type": "object"}),
    }


def replay_safe(tool: types.Tool) -> bool:
    """Whether the server says calling `tool` twice does no more than calling it once."""
    hints = tool.annotations
    return hints is not None and (hints.read_only_hint is True or hints.idempotent_hint is True)


def catalog_of(server: MCPServerDefinition, tools: Iterable[types.Tool]) -> list[dict[str, Any]]:
    """The exposed tools of `server`, as catalog entries sorted by name."""
    return sorted((entry(t) for t in tools if server.exposes(t.name)), key=lambda e: e["name"])


def catalog_digest_of(server: MCPServerDefinition, tools: Iterable[types.Tool]) -> str:
    return digest_of(catalog_of(server, tools))


def _block_text(block: Any) -> str | None:
    kind = getattr(block, "type", "")
    if kind == "text":
        return block.text
    if kind == "resource":
        resource = block.resource
        text = getattr(resource, "text", None)
        return text if text is not None else f"[resource {resource.uri}]"
    if kind == "resource_link":
        return f"[resource {block.uri}]"
    if kind in ("image", "audio"):
        return f"[{kind} {getattr(block, 'mime_type', '')}]".replace(" ]", "]")
    return f"[{kind or 'content'}]"


def render_result(result: types.CallToolResult) -> ToolOutput:
    """A tool result as the text the model reads; `is_error` passes through."""
    parts = [_block_text(block) for block in result.content]
    has_text = any(getattr(block, "type", "") == "text" for block in result.content)
    text = "\n".join(p for p in parts if p)
    if not has_text and result.structured_content is not None:
        data = json.dumps(result.structured_content, ensure_ascii=False, sort_keys=True)
        text = f"{text}\n{data}" if text else data
    return ToolOutput(cap_output(text.encode("utf-8")), is_error=bool(result.is_error))
