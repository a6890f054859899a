"""Hot-swap benchmark: how fast an edit goes live, and what a swap costs running turns.

On a 100-definition set served by `corral serve` (a subprocess, watcher on):

- edit -> live: 50 times, rewrite one agent's file and poll GET /v1/definitions
  until the set digest changes; p50 and p95 of that delay (targets: 150 ms
  and 300 ms). It includes the watcher's 50 ms quiet period.
- swap cost: the latency of short turns (scripted model, no tools) measured
  with no swaps, then again while another task edits a file and reloads
  every 100 ms; the ratio of the medians (target: no measurable difference,
  read here as <= 1.2x).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.runtime import Proc, start_corral

EDITS = 50
TURNS = 150
MODELS, TOOLS, AGENTS = 10, 40, 50
P50_TARGET_MS, P95_TARGET_MS, SWAP_COST_TARGET = 150.0, 300.0, 1.2


def generate(root: Path) -> list[Path]:
    """10 scripted models, 40 command tools, 50 agents: one agent per file."""
    root.mkdir(parents=True)
    models = "\n---\n".join(
        f"kind: Model\nname: m{i}\nprovider: scripted\nscript:\n  - when: ping\n    reply: pong {i}\n"
        for i in range(MODELS))
    (root / "models.yaml").write_text(models)
    tools = "\n---\n".join(
        f"kind: Tool\nname: t{i}\ndescription: tool {i}\ncommand: {{argv: [echo, '{i}']}}\n"
        for i in range(TOOLS))
    (root / "tools.yaml").write_text(tools)
    files = []
    for i in range(AGENTS):
        path = root / "agents" / f"a{i}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(_agent(i, 0))
        files.append(path)
    return files


def _agent(i: int, version: int) -> str:
    return (f"kind: Agent\nname: a{i}\ndescription: agent {i} version {version}\nmodel: m{i % MODELS}\n"
            f"tools: [t{i % TOOLS}, t{(i + 1) % TOOLS}]\n")


def start(definitions: Path, work: Path) -> tuple[Proc, str]:
    """`corral serve` with its file watcher on."""
    return start_corral(definitions, work, None, watch=True)


async def edit_to_live(client: httpx.AsyncClient, files: list[Path]) -> list[float]:
    delays = []
    for n in range(1, EDITS + 1):
        before = (await client.get("/v1/definitions")).json()["digest"]
        path = files[n % len(files)]
        started = time.perf_counter()
        path.write_text(_agent(n % len(files), n))
        while True:
            if (await client.get("/v1/definitions")).json()["digest"] != before:
                break
            if time.perf_counter() - started > 5:
                raise SystemExit(f"edit {n} did not go live within 5 s")
            await asyncio.sleep(0.002)
        delays.append((time.perf_counter() - started) * 1000)
        await asyncio.sleep(0.12)  # let the watcher settle, so each edit is a swap of its own
    return delays


async def turn_latencies(client: httpx.AsyncClient, conversation: str) -> list[float]:
    out = []
    for _ in range(TURNS):
        started = time.perf_counter()
        response = await client.post(f"/v1/conversations/{conversation}/messages", json={"content": "ping"})
        assert response.status_code == 200 and response.json()["status"] == "completed", response.text
        out.append((time.perf_counter() - started) * 1000)
    return out


async def swapping(client: httpx.AsyncClient, files: list[Path], stop: asyncio.Event) -> int:
    n = 1000
    while not stop.is_set():
        n += 1
        files[n % len(files)].write_text(_agent(n % len(files), n))
        await client.post("/v1/definitions/reload")
        await asyncio.sleep(0.1)
    return n - 1000


async def run(base: str, files: list[Path]) -> dict[str, float]:
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        delays = await edit_to_live(client, files)
        conversation = (await client.post("/v1/conversations", json={"agent": "a0"})).json()["id"]
        quiet = await turn_latencies(client, conversation)
        stop = asyncio.Event()
        swapper = asyncio.create_task(swapping(client, files, stop))
        busy = await turn_latencies(client, conversation)
        stop.set()
        swaps = await swapper
    q = statistics.quantiles(delays, n=20)
    return {"p50": statistics.median(delays), "p95": q[18], "quiet": statistics.median(quiet),
            "busy": statistics.median(busy), "swaps": swaps}


def main(argv: list[str] | None = None) -> int:
    with tempfile.TemporaryDirectory(prefix="corral-bench-swap-") as tmp:
        work = Path(tmp)
        files = generate(work / "defs")
        proc, base = start(work / "defs", work)
        try:
            v = asyncio.run(run(base, files))
        finally:
            proc.stop()
    ratio = v["busy"] / v["quiet"]
    rows = [
        ("edit -> live p50", f"{v['p50']:.0f} ms", f"<= {P50_TARGET_MS:.0f} ms", v["p50"] <= P50_TARGET_MS),
        ("edit -> live p95", f"{v['p95']:.0f} ms", f"<= {P95_TARGET_MS:.0f} ms", v["p95"] <= P95_TARGET_MS),
        ("turn median, no swaps", f"{v['quiet']:.2f} ms", "baseline", True),
        (f"turn median, {v['swaps']:.0f} swaps running", f"{v['busy']:.2f} ms (x{ratio:.2f})",
         f"<= x{SWAP_COST_TARGET}", ratio <= SWAP_COST_TARGET),
    ]
    print(f"\nhot swap ({MODELS + TOOLS + AGENTS} definitions, {EDITS} edits, {TURNS} turns each way)")
    for name, value, target, ok in rows:
        print(f"  {name:34} {value:>22}   target {target:>10}   {'PASS' if ok else 'MISS'}")
    missed = not all(ok for *_, ok in rows)
    return 1 if missed and "--check" in (argv or []) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
