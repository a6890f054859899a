"""A small MCP server for the client tests, written with the SDK's `MCPServer`.

    python tests/mcp_fixture_server.py [--variant-file PATH]            # stdio
    python tests/mcp_fixture_server.py --http PORT [--variant-file PATH]

or in-process: `serve(fixture_app(...))` from `tests.fakes.uvicorn_thread`.

Tools: `add(a, b)`, `echo(text)`, `hang()` (never returns), `pid()` (the
serving process id, so a test can kill it). The variant file, read once at
start, holds `1` or `2`; variant 2 gives `echo` another input schema, so a
test can change the catalog a server reports without touching its
definition (whose digest would change with it).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import anyio
from mcp.server.mcpserver import MCPServer


def read_variant(path: str | None) -> int:
    if not path:
        return 1
    try:
        return int(Path(path).read_text("utf-8").strip() or 1)
    except (OSError, ValueError):
        return 1


def build(variant: int = 1) -> MCPServer:
    server = MCPServer("fixture", version="1.0")

    @server.tool(description="Add two numbers.")
    def add(a: float, b: float) -> str:
        total = a + b
        return str(int(total) if total == int(total) else total)

    if variant == 2:

        @server.tool(description="Echo the text back, maybe loudly.")
        def echo(text: str, loud: bool = False) -> str:
            return text.upper() if loud else text

    else:

        @server.tool(description="Echo the text back.")
        def echo(text: str) -> str:
            return text

    @server.tool(description="Never return.")
    async def hang() -> str:
        await anyio.sleep_forever()
        return ""

    @server.tool(description="The process id of this server.")
    def pid() -> str:
        return str(os.getpid())

    return server


def fixture_app(variant_file: str | None = None):
    """The streamable HTTP app (at /mcp) of a fresh fixture server."""
    return build(read_variant(variant_file)).streamable_http_app()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant-file")
    parser.add_argument("--http", type=int, metavar="PORT")
    args = parser.parse_args(argv)
    server = build(read_variant(args.variant_file))
    if args.http is None:
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.http)


if __name__ == "__main__":
    sys.exit(main())
