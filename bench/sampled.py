"""Where a turn's server CPU goes, by stage, from py-spy's samples: `python -m bench overhead --sample`.

`corral serve` (embedded store, tracing off) on the instant fake model of `bench.runtime` answers
fresh turns one after the other while py-spy samples it (`SAMPLE_S` seconds at `RATE` Hz, idle
time not counted). A sample goes to a stage by its whole stack, the deepest subsystem winning (a
SQLite statement run by the runtime, itself called by the HTTP route, counts for the store), so the
stages say what the CPU did, not which module was on top. Unlike cProfile, sampling does not
inflate Python calls, so the shares times the CPU per turn (read from /proc over the same run)
are the milliseconds. Needs the `py-spy` executable (`pip install py-spy`, in the test extra) and
permission to trace the server (ptrace); without them `--sample` says so and exits 2.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.runtime import (
    _client,
    corral_turn,
    create_conversation,
    start_corral,
    start_fake,
    write_definitions,
)

SAMPLE_S = 20
RATE = 400
# A frame reads `function (path/relative/to/its/root.py:line)`. The deep stages go first, by priority:
# the first any frame of the stack matches wins (a statement the route runs through the runtime counts
# for the store). A stack in none of them goes to the stage of its leaf-most frame among the others.
DEEP: list[tuple[str, str]] = [
    ("logging", r"\((logging|server/logs\.py)"),
    ("store: SQLite statements, rows, transactions", r"\(server/store/"),
    ("model HTTP client (aiohttp; httpx before)", r"\((aiohttp|multidict|yarl|httpx|httpcore|h11)/"),
    ("model request build, answer parse", r"\(server/providers/"),
    ("events: journal batching, hub fan-out",
     r"\(server/runtime/(events|streams)\.py|\(server/turn_events\.py|^Journal\."),
    ("admission, leases", r"\(server/runtime/(admission|elsewhere|idempotency|patience)\.py"),
    ("turn plan: tools, hooks, model chain", r"\(server/runtime/(plans|hooks)\.py|\(server/tools/"),
    ("context window, transcript", r"\(server/runtime/(context|context_window|context_views|token_ledger|"
                                   r"transcripts|compaction)\.py"),
]
LEAF: list[tuple[str, str]] = [
    ("JSON encode/decode", r"\(json/"),
    ("turn lifecycle, loop, results", r"\(server/(runtime|service|deployment)/"),
    ("tracing (off)", r"\(server/tracing/"),
    ("our routes, guards, bodies, responses", r"\(server/"),
    ("HTTP in/out: starlette", r"\(starlette/"),
    ("HTTP in/out: uvicorn, httptools", r"\((uvicorn|httptools)/"),
    ("anyio: task groups, cancel scopes, streams", r"\((anyio|sniffio)/"),
    ("event loop: asyncio, uvloop, sockets", r"\((asyncio|uvloop)/"),
]
OTHER = "other"


def stage_of(stack: list[str]) -> str:
    for stage, pattern in DEEP:
        compiled = _compiled(pattern)
        if any(compiled.search(frame) for frame in stack):
            return stage
    for frame in reversed(stack):
        for stage, pattern in LEAF:
            if _compiled(pattern).search(frame):
                return stage
    return OTHER


_CACHE: dict[str, re.Pattern] = {}


def _compiled(pattern: str) -> re.Pattern:
    if pattern not in _CACHE:
        _CACHE[pattern] = re.compile(pattern)
    return _CACHE[pattern]


def by_stage(raw: str) -> dict[str, int]:
    """Samples per stage, from py-spy's `raw` (collapsed stacks: `frame;frame;... COUNT`)."""
    counts: dict[str, int] = {}
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        stage = stage_of(stack.split(";"))
        counts[stage] = counts.get(stage, 0) + int(count)
    return counts


async def _load(base: str, stop: asyncio.Event, history: bool) -> None:
    """Turns one after the other until `stop`: each in a new conversation, or (`history`) all in one."""
    async with _client(base) as client:
        conversation = await create_conversation(client)
        while not stop.is_set():
            await corral_turn(client, conversation if history else await create_conversation(client))


async def _sampled(py_spy: str, base: str, corral, out: Path, history: bool) -> None:
    stop = asyncio.Event()
    load = asyncio.create_task(_load(base, stop, history))
    spy = await asyncio.create_subprocess_exec(
        py_spy, "record", "--pid", str(corral.pid), "--duration", str(SAMPLE_S), "--rate", str(RATE),
        "--format", "raw", "--output", str(out), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, err = await spy.communicate()
    stop.set()
    await load
    if spy.returncode != 0:
        raise SystemExit(f"py-spy failed ({spy.returncode}): {err.decode()[-500:]}")


def sample(history: bool = False) -> int:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).exists():
        print("py-spy is not installed (pip install py-spy)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="corral-bench-sampled-") as tmp:
        work = Path(tmp)
        fake, fake_url = start_fake()
        try:
            corral, base = start_corral(write_definitions(work / "defs", fake_url), work, None)
            try:
                cpu = asyncio.run(_per_turn(base, corral))
                started = time.perf_counter()
                asyncio.run(_sampled(py_spy, base, corral, work / "raw.txt", history))
                wall = time.perf_counter() - started
            finally:
                corral.stop()
        finally:
            fake.stop()
        raw = (work / "raw.txt").read_text()
        counts = by_stage(raw)
    total = sum(counts.values())
    print(f"\nwhere a fresh turn's server CPU goes: {total} py-spy samples over {wall:.0f} s of sequential "
          f"fresh turns; {cpu * 1000:.3f} ms CPU per turn (/proc, measured just before)")
    print(f"  {'stage':48} {'share':>6} {'ms/turn':>8}")
    for stage, count in sorted(counts.items(), key=lambda kv: -kv[1]):
        print(f"  {stage:48} {count / total:6.1%} {count / total * cpu * 1000:8.3f}")
    return 0


async def _per_turn(base: str, corral, turns: int = 1000) -> float:
    async with _client(base) as client:
        ids = [await create_conversation(client) for _ in range(turns + 100)]
        for conversation in ids[:100]:
            await corral_turn(client, conversation)
        before = corral.cpu()
        for conversation in ids[100:]:
            await corral_turn(client, conversation)
        return (corral.cpu() - before) / turns
