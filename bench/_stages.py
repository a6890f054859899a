"""Where a turn's server CPU goes, by stage: `python -m bench overhead --profile`.

`corral serve` (embedded store, tracing off) on the instant fake model of `bench.runtime`; after a
warm-up, `turns` fresh turns unprofiled (the server's CPU per turn from /proc), then the same number
under cProfile (started by SIGUSR1, `bench.runtime.serve_profiled`). Every function's own time is
given to a stage by the file it lives in (a C function by its name), then scaled to the unprofiled
CPU per turn: the profiler inflates Python calls more than C ones, so the milliseconds are an
estimate and the shares are the figures to compare before and after a change.
"""

from __future__ import annotations

import asyncio
import pstats
import re
import tempfile
import time
from pathlib import Path

from bench.runtime import _client, corral_turn, create_many, start_corral, start_fake, write_definitions

# (stage, pattern over "filename:function"), first match wins: the order matters
STAGES: list[tuple[str, str]] = [
    ("JSON encode/decode", r"(/json/|_json|orjson|msgspec)"),
    ("logging", r"/logging/|server/logs\.py"),
    ("pydantic validation", r"(pydantic|pydantic_core)"),
    ("HTTP in: uvicorn, httptools", r"(/uvicorn/|httptools)"),
    ("HTTP in: starlette routing, requests, responses", r"/starlette/"),
    ("HTTP in: our routes, guards, bodies", r"server/http/"),
    ("store: SQLite and our statements", r"(sqlite3|server/store/)"),
    ("HTTP client to the model: aiohttp (httpx before)",
     r"(/aiohttp/|/multidict/|/yarl/|/propcache/|/frozenlist/|/aiosignal/|/httpx/|/httpcore/|/h11/)"),
    ("model request build and answer parse", r"server/providers/"),
    ("events and their fan-out", r"(server/runtime/(events|streams)\.py|server/turn_events\.py)"),
    ("turn: admission, lifecycle, loop, context", r"(server/runtime/|server/service/|server/deployment/)"),
    ("metrics, ids, clock, messages", r"server/(metrics|ids|clock|messages|canonical|statuses)\.py"),
    ("tools, hooks, tracing (off)", r"server/(tools|tracing)/"),
    ("anyio, sniffio", r"(/anyio/|/sniffio/)"),
    ("event loop: asyncio, uvloop, sockets", r"(/asyncio/|uvloop|selectors|socket|epoll|select)"),
    ("other: stdlib and builtins", r""),
]


def stage_of(filename: str, function: str) -> str:
    key = f"{filename}:{function}"
    for stage, pattern in STAGES:
        if re.search(pattern, key):
            return stage
    return STAGES[-1][0]


def by_stage(path: Path) -> dict[str, float]:
    stats = pstats.Stats(str(path)).stats  # {(file, line, name): (cc, nc, tottime, cumtime, callers)}
    seconds: dict[str, float] = {}
    for (filename, _, function), (_, _, own, _, _) in stats.items():
        stage = stage_of(filename, function)
        seconds[stage] = seconds.get(stage, 0.0) + own
    return seconds


async def _turns(base: str, count: int) -> None:
    async with _client(base) as client:
        for conversation in await create_many(client, count):
            await corral_turn(client, conversation)


def profile(turns: int, top: int = 0, keep: Path | None = None) -> int:
    with tempfile.TemporaryDirectory(prefix="corral-bench-stages-") as tmp:
        work = Path(tmp)
        fake, fake_url = start_fake()
        try:
            out = work / "corral.prof"
            corral, base = start_corral(write_definitions(work / "defs", fake_url), work, out)
            try:
                asyncio.run(_turns(base, 200))  # warm-up
                plain = asyncio.run(_measured(corral, base, turns))
                started = time.perf_counter()
                asyncio.run(_measured(corral, base, turns, profiled=True))
                profiled_wall = time.perf_counter() - started
            finally:
                corral.stop()
        finally:
            fake.stop()
        seconds = by_stage(out)
        if keep is not None:
            keep.write_bytes(out.read_bytes())
        if top:
            _print_top(out, top)
    total = sum(seconds.values())
    print(f"\nwhere a fresh turn's server CPU goes ({turns} turns under cProfile, {profiled_wall:.1f} s; "
          f"unprofiled: {plain * 1000:.3f} ms CPU per turn)")
    print(f"  {'stage':50} {'share':>6} {'ms/turn':>8}")
    for stage, spent in sorted(seconds.items(), key=lambda kv: -kv[1]):
        share = spent / total
        print(f"  {stage:50} {share:6.1%} {share * plain * 1000:8.3f}")
    return 0


async def _measured(corral, base: str, turns: int, profiled: bool = False) -> float:
    """The server's CPU seconds per fresh turn, its conversations created before the window opens."""
    async with _client(base) as client:
        ids = await create_many(client, turns)
        if profiled:
            corral.start_profile()
        before = corral.cpu()
        for conversation in ids:
            await corral_turn(client, conversation)
        return (corral.cpu() - before) / turns


def _print_top(path: Path, count: int) -> None:
    stats = pstats.Stats(str(path)).stats
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:count]
    total = sum(v[2] for v in stats.values())
    print(f"\n  top {count} functions by own time")
    for (filename, line, function), (_, calls, own, cum, _) in rows:
        where = f"{filename.split('site-packages/')[-1].split('/work/main/')[-1]}:{line}:{function}"
        stage = stage_of(filename, function)
        print(f"  {own / total:6.1%} {cum / total:7.1%} {calls:8d}  {where[-90:]}  [{stage}]")
