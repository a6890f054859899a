"""Where a turn's server CPU goes, by stage, from py-spy's samples: `python -m bench overhead --sample`.

`corral serve` (embedded store, tracing off) on the instant fake model of `bench.runtime` answers
fresh turns one after the other (or, with `--only history`, turns on one conversation that already
had `HISTORY`) while py-spy samples it (`SAMPLE_S` seconds at `RATE` Hz, idle
time not counted). A sample goes to a stage by its whole stack, the deepest subsystem winning (a
SQLite statement run by the runtime, itself called by the HTTP route, counts for the store), so the
stages say what the CPU did, not which module was on top. Unlike cProfile, sampling does not
inflate Python calls, so the shares times the CPU per turn (read from /proc over the same run)
are the milliseconds. Needs the `py-spy` executable (`pip install py-spy`, in the test extra) and
permission to trace the server (ptrace); without them `--sample` says so and exits 2. With
`--baseline REV`, that commit's server is sampled the same way first: the two tables side by side.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.runtime import (
    ROOT,
    _client,
    corral_turn,
    create_conversation,
    start_fake,
    write_definitions,
)

SAMPLE_S = 10
FRESH = 4000  # conversations made before sampling: more than 10 s of turns use
HISTORY = 200
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


async def _load(base: str, ready: asyncio.Event, stop: asyncio.Event, history: bool) -> None:
    """Turns one after the other until `stop`: each the first of a conversation made before sampling
    began, or (`history`) each on one conversation that already had `HISTORY` turns."""
    async with _client(base) as client:
        if history:
            conversation = await create_conversation(client)
            for _ in range(HISTORY):
                await corral_turn(client, conversation)
            ready.set()
            while not stop.is_set():
                await corral_turn(client, conversation)
            return
        ids = [await create_conversation(client) for _ in range(FRESH)]
        ready.set()
        for conversation in ids:
            if stop.is_set():
                return
            await corral_turn(client, conversation)
        raise SystemExit(f"{FRESH} conversations were not enough for {SAMPLE_S} s of turns")



async def _sampled(py_spy: str, base: str, pid: int, out: Path, history: bool) -> None:
    ready, stop = asyncio.Event(), asyncio.Event()
    load = asyncio.create_task(_load(base, ready, stop, history))
    await ready.wait()
    spy = await asyncio.create_subprocess_exec(
        py_spy, "record", "--pid", str(pid), "--duration", str(SAMPLE_S), "--rate", str(RATE),
        "--format", "raw", "--output", str(out), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, err = await spy.communicate()
    stop.set()
    await load
    if spy.returncode != 0:
        raise SystemExit(f"py-spy failed ({spy.returncode}): {err.decode()[-500:]}")


def sample(history: bool = False, baseline: str | None = None, tracing: bool = False) -> int:
    """Samples this code's server (and `baseline`'s, one after the other) and prints both tables;
    `tracing`: the servers export their spans to a local OTLP receiver."""
    from bench.traces import baseline_tree, start_at
    from tests.support.otlp import OtlpReceiver

    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).exists():
        print("py-spy is not installed (pip install py-spy)", file=sys.stderr)
        return 2
    columns: dict[str, tuple[float, dict[str, int]]] = {}
    with tempfile.TemporaryDirectory(prefix="corral-bench-sampled-") as tmp, OtlpReceiver() as receiver:
        work = Path(tmp)
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url} if tracing else {}
        fake, fake_url = start_fake()
        try:
            defs = write_definitions(work / "defs", fake_url)
            trees = {"now": ROOT}
            if baseline:
                trees = {baseline: baseline_tree(baseline, work), **trees}
            for name, tree in trees.items():
                corral, base = start_at(tree, defs, work, f"sampled-{len(columns)}", env)
                try:
                    cpu = asyncio.run(_per_turn(base, corral))
                    asyncio.run(_sampled(py_spy, base, corral.pid, work / f"{name}.txt", history))
                finally:
                    corral.stop()
                columns[name] = (cpu, by_stage((work / f"{name}.txt").read_text()))
        finally:
            fake.stop()
    _print(columns, ("history" if history else "fresh") + (", tracing on," if tracing else ""))
    return 0


def _print(columns: dict[str, tuple[float, dict[str, int]]], kind: str) -> None:
    print(f"\nwhere a {kind} turn's server CPU goes (py-spy, {SAMPLE_S} s at {RATE} Hz each; ms = share x "
          "the CPU per fresh turn read from /proc just before)")
    heads = "".join(f" {name + ' share':>16} {'ms':>6}" for name in columns)
    print(f"  {'stage':46}{heads}")
    stages = sorted({s for _, counts in columns.values() for s in counts},
                    key=lambda s: -columns[list(columns)[-1]][1].get(s, 0))
    for stage in [*stages, "total"]:
        cells = ""
        for cpu, counts in columns.values():
            share = 1.0 if stage == "total" else counts.get(stage, 0) / sum(counts.values())
            cells += f" {share:16.1%} {share * cpu * 1000:6.3f}"
        print(f"  {stage:46}{cells}")


async def _per_turn(base: str, corral, turns: int = 1000) -> float:
    async with _client(base) as client:
        ids = [await create_conversation(client) for _ in range(turns + 100)]
        for conversation in ids[:100]:
            await corral_turn(client, conversation)
        before = corral.cpu()
        for conversation in ids[100:]:
            await corral_turn(client, conversation)
        return (corral.cpu() - before) / turns
