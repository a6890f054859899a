"""MCP benchmark: an agent call through /mcp against the same turn through the HTTP API.

One `corral serve` subprocess, one scripted agent answering at once. In the
same run: the median latency of a turn via POST /v1/conversations/{id}/messages,
then via the official MCP client's `call_tool` (both protocol eras),
continuing one conversation each. Target: MCP <= 1.5x the HTTP API.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from mcp import Client

from bench.swap import start

TURNS = 200
TARGET = 1.5
AGENT = """\
kind: Model
name: quick
provider: scripted
script:
  - reply: "pong"
---
kind: Agent
name: quick
description: Answers pong at once.
model: quick
"""


async def http_turns(base: str) -> list[float]:
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        conversation = (await client.post("/v1/conversations", json={"agent": "quick"})).json()["id"]
        out = []
        for _ in range(TURNS):
            started = time.perf_counter()
            url = f"/v1/conversations/{conversation}/messages"
            response = await client.post(url, json={"content": "ping"})
            assert response.json()["output"] == "pong", response.text
            out.append((time.perf_counter() - started) * 1000)
    return out


async def mcp_turns(base: str, mode: str) -> list[float]:
    async with Client(f"{base}/mcp", mode=mode, read_timeout_seconds=30) as client:
        first = await client.call_tool("quick", {"message": "ping"})
        conversation = first.structured_content["conversation_id"]
        out = []
        for _ in range(TURNS):
            started = time.perf_counter()
            result = await client.call_tool("quick", {"message": "ping", "conversation_id": conversation})
            assert not result.is_error and result.content[0].text == "pong", result
            out.append((time.perf_counter() - started) * 1000)
    return out


def main(argv: list[str] | None = None) -> int:
    with tempfile.TemporaryDirectory(prefix="corral-bench-mcp-") as tmp:
        work = Path(tmp)
        (work / "defs").mkdir()
        (work / "defs" / "quick.yaml").write_text(AGENT)
        proc, base = start(work / "defs", work)
        try:
            http = statistics.median(asyncio.run(http_turns(base)))
            modern = statistics.median(asyncio.run(mcp_turns(base, "auto")))
            legacy = statistics.median(asyncio.run(mcp_turns(base, "legacy")))
        finally:
            proc.stop()
    print(f"\nMCP vs HTTP API ({TURNS} turns each, scripted agent, same server)")
    print(f"  {'HTTP API turn median':34} {http:>10.2f} ms   baseline")
    missed = False
    for label, value in (("MCP 2026-07-28 call median", modern), ("MCP 2025-11-25 call median", legacy)):
        ratio = value / http
        missed |= ratio > TARGET
        verdict = "PASS" if ratio <= TARGET else "MISS"
        print(f"  {label:34} {value:>10.2f} ms   x{ratio:.2f}   target <= x{TARGET}   {verdict}")
    return 1 if missed and "--check" in (argv or []) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
