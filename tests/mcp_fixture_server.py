"""A small MCP server for the client tests, written with the SDK's `MCPServer`.

    python tests/mcp_fixture_server.py [--variant-file PATH]            # stdio
    python tests/mcp_fixture_server.py --http PORT [--variant-file PATH]

or in-process: `serve(fixture_app(...))` from `tests.fakes.uvicorn_thread`.

Tools: `add(a, b)`, `echo(text)`, `hang()` (never returns), `pid()` (the
serving process id, so a test can kill it), `execution_key()` (the
`corral/execution_key` of the call's `_meta`, or "" without one; annotated
read-only), `traceparent()` (the same for `traceparent`) and `put(key,
value)` (keeps a value, answers the previous one; annotated idempotent, not
read-only). The variant file holds `1` or
`2` and is read at every `tools/list`; variant 2 gives `echo` another input
schema, so a test changes the catalog a server reports without touching its
definition (whose digest would change with it).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
from mcp.server.mcpserver import Context, MCPServer


def read_variant(path: str | Path | None) -> int:
    if not path:
        return 1
    try:
        return int(Path(path).read_text("utf-8").strip() or 1)
    except (OSError, ValueError):
        return 1


def add(a: float, b: float) -> str:
    total = a + b
    return str(int(total) if total == int(total) else total)


def echo(text: str) -> str:
    return text


def echo_loud(text: str, loud: bool = False) -> str:
    return text.upper() if loud else text


async def hang() -> str:
    await anyio.sleep_forever()
    return ""


def pid() -> str:
    return str(os.getpid())


def execution_key(ctx: Context) -> str:
    return str((ctx.request_context.meta or {}).get("corral/execution_key", ""))


def traceparent(ctx: Context) -> str:
    return str((ctx.request_context.meta or {}).get("traceparent", ""))


class Fixture(MCPServer):
    def __init__(self, variant_file: str | Path | None = None):
        super().__init__("fixture", version="1.0")
        self.variant_file = variant_file
        self.variant = 0
        self.add_tool(add, description="Add two numbers.")
        self.add_tool(hang, description="Never return.")
        self.add_tool(pid, description="The process id of this server.")
        self.add_tool(execution_key, description="The execution key this call carried.",
                      annotations=types.ToolAnnotations(read_only_hint=True))
        self.add_tool(traceparent, description="The W3C traceparent this call carried in its _meta.",
                      annotations=types.ToolAnnotations(read_only_hint=True))
        self.values: dict[str, str] = {}
        self.add_tool(self.put, description="Keep a value under a key; the previous value.",
                      annotations=types.ToolAnnotations(read_only_hint=False, idempotent_hint=True))
        self._use(read_variant(variant_file))

    def put(self, key: str, value: str) -> str:
        previous, self.values[key] = self.values.get(key, ""), value
        return previous

    def _use(self, variant: int) -> None:
        if variant == self.variant:
            return
        if self.variant:
            self.remove_tool("echo")
        if variant == 2:
            self.add_tool(echo_loud, name="echo", description="Echo the text back, maybe loudly.")
        else:
            self.add_tool(echo, description="Echo the text back.")
        self.variant = variant

    async def list_tools(self) -> Any:
        self._use(read_variant(self.variant_file))
        return await super().list_tools()


def fixture_app(variant_file: str | Path | None = None) -> Any:
    """The streamable HTTP app (at /mcp) of a fresh fixture server."""
    return Fixture(variant_file).streamable_http_app()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant-file")
    parser.add_argument("--http", type=int, metavar="PORT")
    args = parser.parse_args(argv)
    server = Fixture(args.variant_file)
    if args.http is None:
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.http)


if __name__ == "__main__":
    sys.exit(main())
