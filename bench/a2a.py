"""A2A benchmark: the server's CPU per turn for A2A `SendMessage` against the HTTP route's, in one run.

One `corral serve` subprocess, one scripted agent answering at once. Turns
alternate in blocks (ABBA, so machine noise hits both sides): `BLOCK` turns
through POST /v1/conversations/{id}/messages, then `BLOCK` through A2A
`SendMessage` at /a2a/quick with the official `a2a-sdk` client, each
continuing one conversation (one A2A context). The server's CPU (user +
system, every thread, from /proc, as `bench.replicas` reads it) over each
side's blocks, divided by its turns. Target (issue 24): A2A <= 1.2x the HTTP
route. `--check` exits 1 when it is missed.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
from a2a.client import ClientConfig, create_client
from a2a.helpers import get_artifact_text, new_text_message
from a2a.types.a2a_pb2 import ROLE_USER, SendMessageRequest

from bench.mcp import AGENT
from bench.replicas import ProcessTree
from bench.swap import start

BLOCK = 50
ROUNDS = 4  # of ABBA: each side runs 2 * ROUNDS blocks
TARGET = 1.2


async def measure(base: str, pid: int) -> tuple[float, float]:
    """(HTTP CPU ms per turn, A2A CPU ms per turn)."""
    tree = ProcessTree("corral", pid)
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        conversation = (await http.post("/v1/conversations", json={"agent": "quick"})).json()["id"]
        client = await create_client(f"{base}/a2a/quick", client_config=ClientConfig(httpx_client=http,
                                                                                     streaming=False))
        context = ""

        async def http_turn() -> None:
            reply = await http.post(f"/v1/conversations/{conversation}/messages", json={"content": "ping"})
            assert reply.json()["output"] == "pong", reply.text

        async def a2a_turn() -> None:
            nonlocal context
            message = new_text_message("ping", context_id=context or None, role=ROLE_USER)
            async for response in client.send_message(SendMessageRequest(message=message)):
                assert get_artifact_text(response.task.artifacts[0]) == "pong", response
                context = response.task.context_id

        await http_turn()  # warm both paths up
        await a2a_turn()
        spent = {"http": 0.0, "a2a": 0.0}
        order = [("http", http_turn), ("a2a", a2a_turn), ("a2a", a2a_turn), ("http", http_turn)] * ROUNDS
        for side, turn in order:
            spent[side] += await _block(tree, turn)
    turns = BLOCK * 2 * ROUNDS
    return spent["http"] * 1000 / turns, spent["a2a"] * 1000 / turns


async def _block(tree: ProcessTree, turn: Callable[[], Awaitable[None]]) -> float:
    before = tree.cpu()
    for _ in range(BLOCK):
        await turn()
    return tree.cpu() - before


def main(argv: list[str] | None = None) -> int:
    with tempfile.TemporaryDirectory(prefix="corral-bench-a2a-") as tmp:
        work = Path(tmp)
        (work / "defs").mkdir()
        (work / "defs" / "quick.yaml").write_text(AGENT)
        proc, base = start(work / "defs", work)
        try:
            http, a2a = asyncio.run(measure(base, proc.pid))
        finally:
            proc.stop()
    ratio = a2a / http
    verdict = "PASS" if ratio <= TARGET else "MISS"
    turns = BLOCK * 2 * ROUNDS
    print(f"\nA2A SendMessage vs HTTP API (server CPU per turn, {turns} turns each, scripted agent)")
    print(f"  {'HTTP API turn':34} {http:>10.2f} ms   baseline")
    print(f"  {'A2A SendMessage':34} {a2a:>10.2f} ms   x{ratio:.2f}   target <= x{TARGET}   {verdict}")
    return 1 if ratio > TARGET and "--check" in (argv or []) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
