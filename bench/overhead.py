"""Overhead benchmark: a turn's server CPU on every surface, against the floor, in one run.

The instant fake OpenAI model of `bench.runtime` (its own process) and `corral serve` on the one-agent
tree pointing at it (embedded SQLite store, tracing off), plus a second `corral serve` exporting spans
to a real OTLP/HTTP receiver on loopback (tracing on) and, with `--baseline REV`, a third running that
commit's code (the "before" of a change, in the same run). Each variant below is sent `ROUND`
sequential calls at a time, round after round, its order reversed every other round, so a machine
busy with something else slows all alike; a server's CPU (/proc: user + system, every thread) over a
variant's own calls, divided by them, is the figure.

- floor: a plain httpx call to the fake (its latency; the fake's own CPU per call);
- fresh: a turn on a conversation created beforehand (its first turn): the 2 ms target;
- history: a turn on one conversation already holding `HISTORY` turns (target <= 1.1x fresh);
- new conversation: POST /v1/conversations then POST .../messages, the work each surface below does
  in one call (each surface's base: target <= 1.2x);
- OpenAI route, MCP `tools/call` (the official client), A2A `SendMessage` (the a2a-sdk client): each
  call a new conversation and its turn;
- tracing on: `fresh` on the server exporting spans (issue 22: <= 1.15x).

Then throughput with `CONCURRENCY` callers, alternated in runs of `THROUGHPUT_S` / 2: the floor, the
HTTP route (a new conversation and its turn per call) and MCP. Targets: HTTP >= 0.8x the floor's
calls/s, MCP >= 0.8x the HTTP route's. `--sample` runs instead fresh turns (`--only history`: on a
long conversation; `--only tracing`: spans exported) under py-spy and prints where their CPU goes,
stage by stage (`bench/_sampled.py`; with `--baseline REV`, side by side); function by function,
`python -m bench runtime --profile` runs the server under cProfile. `--check` exits 1 when a target
is missed. PostgreSQL's figures are `python -m bench replicas`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.runtime import (
    CONCURRENCY,
    REPLY_TEXT,
    ROOT,
    Meter,
    Proc,
    _bind,
    _client,
    concurrently,
    corral_turn,
    create_conversation,
    create_many,
    direct_call,
    start_fake,
    write_definitions,
)

ROUNDS = 10
ROUND = 20
HISTORY = 200
THROUGHPUT_S = 6.0
CPU_TARGET_MS = 2.0
Call = Callable[[], Awaitable[None]]


@dataclass
class Server:
    """One `corral serve` and the clients of its surfaces (opened on first use)."""

    name: str
    proc: Proc
    base: str
    stack: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack)

    async def http(self) -> httpx.AsyncClient:
        if not hasattr(self, "_http"):
            self._http = await self.stack.enter_async_context(_client(self.base))
        return self._http

    async def mcp(self):
        from mcp import Client

        return await self.stack.enter_async_context(Client(f"{self.base}/mcp", read_timeout_seconds=30))

    async def a2a(self):
        from a2a.client import ClientConfig, create_client

        config = ClientConfig(httpx_client=await self.http(), streaming=False)
        return await create_client(f"{self.base}/a2a/bench", client_config=config)


# --- one call of each variant: `prepare(server, calls)` returns the call to repeat ---------------


async def fresh(server: Server, calls: int) -> Call:
    client = await server.http()
    ids = iter(await create_many(client, calls))
    return lambda: corral_turn(client, next(ids))


async def history(server: Server, calls: int) -> Call:
    client = await server.http()
    conversation = await create_conversation(client)
    for _ in range(HISTORY):
        await corral_turn(client, conversation)
    return lambda: corral_turn(client, conversation)


async def new_conversation(server: Server, calls: int) -> Call:
    client = await server.http()

    async def call() -> None:
        await corral_turn(client, await create_conversation(client))

    return call


async def openai_route(server: Server, calls: int) -> Call:
    client = await server.http()
    body = {"model": "bench", "messages": [{"role": "user", "content": "hi"}]}

    async def call() -> None:
        response = await client.post("/v1/chat/completions", json=body)
        if response.status_code != 200 or response.json()["choices"][0]["message"]["content"] != REPLY_TEXT:
            raise SystemExit(f"OpenAI route: {response.status_code} {response.text[:300]}")

    return call


async def mcp_call(server: Server, calls: int) -> Call:
    client = await server.mcp()

    async def call() -> None:
        result = await client.call_tool("bench", {"message": "hi"})
        if result.is_error or result.content[0].text != REPLY_TEXT:
            raise SystemExit(f"MCP: {result}")

    return call


async def a2a_send(server: Server, calls: int) -> Call:
    from a2a.helpers import get_artifact_text, new_text_message
    from a2a.types.a2a_pb2 import ROLE_USER, SendMessageRequest

    client = await server.a2a()

    async def call() -> None:
        request = SendMessageRequest(message=new_text_message("hi", role=ROLE_USER))
        async for response in client.send_message(request):
            if get_artifact_text(response.task.artifacts[0]) != REPLY_TEXT:
                raise SystemExit(f"A2A: {response}")

    return call


VARIANTS: dict[str, Callable[[Server, int], Awaitable[Call]]] = {
    "fresh": fresh, "history": history, "new conversation": new_conversation,
    "OpenAI route": openai_route, "MCP": mcp_call, "A2A": a2a_send,
}


# --- measuring --------------------------------------------------------------------------------


@dataclass
class Series:
    """CPU seconds and latencies of one variant on one server over its calls."""

    proc: Proc | None
    call: Call
    cpu: float = 0.0
    latencies: list[float] = field(default_factory=list)

    async def block(self, n: int) -> None:
        before = self.proc.cpu() if self.proc else 0.0
        for _ in range(n):
            started = time.perf_counter()
            await self.call()
            self.latencies.append(time.perf_counter() - started)
        if self.proc:
            self.cpu += self.proc.cpu() - before

    @property
    def per_call_ms(self) -> float:
        return self.cpu * 1000 / len(self.latencies)

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.latencies) * 1000


async def sequential(fake: Proc, direct: httpx.AsyncClient, servers: dict[str, Server]) -> dict[str, Series]:
    calls = ROUNDS * ROUND + ROUND  # one round of warm-up
    series = {"floor": Series(fake, lambda: direct_call(direct))}
    for name, server in servers.items():
        for variant, prepare in VARIANTS.items():
            if name == "tracing on" and variant != "fresh":
                continue
            label = variant if name == "off" else f"{variant} [{name}]"
            try:
                series[label] = Series(server.proc, await prepare(server, calls))
            except Exception as error:  # a baseline may lack a surface: its row says so
                print(f"  {label}: not measured ({type(error).__name__}: {error})", file=sys.stderr)
    for item in series.values():  # warm-up, not counted
        await item.call()
        for _ in range(ROUND - 1):
            await item.call()
        item.cpu, item.latencies = 0.0, []
    order = list(series.values())
    for round_ in range(ROUNDS):
        for item in order if round_ % 2 == 0 else reversed(order):
            await item.block(ROUND)
    return series


async def throughput(fake: Proc, fake_url: str, server: Server) -> dict[str, tuple[float, float, float]]:
    """calls/s and server CPU per call with `CONCURRENCY` callers: floor, HTTP route, MCP.

    Each caller has a client of its own, as each MCP session has: one httpx pool shared by 50
    callers costs this process more CPU than the server (it scans its connections per request)."""
    stack = contextlib.AsyncExitStack()
    try:
        return await _rates(fake, fake_url, server, stack)
    finally:
        with contextlib.suppress(Exception):  # an MCP session may fail to close cleanly: no figure lost
            await stack.aclose()


async def _rates(fake: Proc, fake_url: str, server: Server,
                 stack: contextlib.AsyncExitStack) -> dict[str, tuple[float, float, float]]:
    async def clients(url: str) -> list[httpx.AsyncClient]:
        return [await stack.enter_async_context(_client(url, 2)) for _ in range(CONCURRENCY)]

    sessions = [await stack.enter_async_context(_mcp_client(server.base)) for _ in range(CONCURRENCY)]
    workers = {
        "floor": ([_bind(direct_call, c) for c in await clients(fake_url)], fake),
        "HTTP route": ([_http_new(c) for c in await clients(server.base)], server.proc),
        "MCP": ([_mcp_new(s) for s in sessions], server.proc),
    }
    for calls, _ in workers.values():
        await asyncio.gather(*(c() for c in calls))  # warm-up
    totals = {name: [0, 0.0, 0.0, 0.0] for name in workers}
    for _ in range(2):
        for name, (calls, proc) in workers.items():
            meter = Meter(proc)
            done, wall = await concurrently(calls, THROUGHPUT_S / 2)
            (cpu,), client = meter.used()
            totals[name] = [a + b for a, b in zip(totals[name], (done, wall, cpu, client), strict=True)]
    return {name: (done / wall, cpu * 1000 / done, client / wall)
            for name, (done, wall, cpu, client) in totals.items()}


def _mcp_client(base: str):
    from mcp import Client

    return Client(f"{base}/mcp", read_timeout_seconds=30)


def _http_new(client: httpx.AsyncClient) -> Call:
    async def call() -> None:
        await corral_turn(client, await create_conversation(client))

    return call


def _mcp_new(client) -> Call:
    async def call() -> None:
        result = await client.call_tool("bench", {"message": "hi"})
        if result.is_error:
            raise SystemExit(f"MCP: {result}")

    return call


# --- reporting --------------------------------------------------------------------------------


TARGETS = {"history": ("fresh", 1.1), "OpenAI route": ("new conversation", 1.2),
           "MCP": ("new conversation", 1.2), "A2A": ("new conversation", 1.2),
           "fresh [tracing on]": ("fresh", 1.15)}


def report(series: dict[str, Series], rates: dict[str, tuple[float, float, float]] | None) -> list[str]:
    """Prints the table; returns the targets missed (of the variants measured)."""
    missed: list[str] = []
    print(f"\noverhead benchmark: server CPU per call, {ROUNDS} alternated rounds of {ROUND} sequential "
          "calls each")
    print(f"  {'variant':34} {'CPU/call':>10} {'p50':>10}  {'ratio':>22}  target")
    for label, item in series.items():
        ratio, verdict = "", ""
        if label == "floor":
            verdict = "(the fake's own CPU)"
        elif label == "fresh":
            verdict = _verdict(item.per_call_ms <= CPU_TARGET_MS, f"<= {CPU_TARGET_MS:g} ms", missed, label)
        elif label in TARGETS and TARGETS[label][0] in series:
            against, target = TARGETS[label]
            value = item.per_call_ms / series[against].per_call_ms
            ratio = f"{value:.2f}x {against}"
            verdict = _verdict(value <= target, f"<= {target:g}x", missed, label)
        elif " [" in label and label.split(" [")[0] in series:  # a baseline's row
            value = series[label.split(" [")[0]].per_call_ms / item.per_call_ms
            ratio = f"now {value:.2f}x this"
        print(f"  {label:34} {item.per_call_ms:7.3f} ms {item.p50_ms:7.2f} ms  {ratio:>22}  {verdict}")
    if rates:
        floor, http = rates["floor"][0], rates["HTTP route"][0]
        print(f"\n  throughput, {CONCURRENCY} concurrent callers, {THROUGHPUT_S:g} s in 2 alternated runs")
        for name, (rps, cpu, client) in rates.items():
            line = f"  {name:34} {rps:7.0f}/s {cpu:7.3f} ms CPU/call  (bench client busy {client:4.0%})"
            if name == "HTTP route":
                ok = rps >= 0.8 * floor
                line += f"  {rps / floor:.2f}x floor  " + _verdict(ok, ">= 0.8x", missed, "HTTP throughput")
            elif name == "MCP":
                ok = rps >= 0.8 * http
                line += f"  {rps / http:.2f}x HTTP   " + _verdict(ok, ">= 0.8x", missed, "MCP throughput")
            print(line)
    return missed


def _verdict(ok: bool, target: str, missed: list[str], label: str) -> str:
    if not ok:
        missed.append(label)
    return f"{target} {'PASS' if ok else 'MISS'}"


async def measure(fake: Proc, fake_url: str, procs: dict[str, tuple[Proc, str]], with_rates: bool):
    servers = {name: Server(name, proc, base) for name, (proc, base) in procs.items()}
    try:
        async with _client(fake_url) as direct:
            series = await sequential(fake, direct, servers)
        rates = await throughput(fake, fake_url, servers["off"]) if with_rates else None
        return series, rates
    finally:
        for server in servers.values():
            with contextlib.suppress(Exception):
                await server.stack.aclose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench overhead", description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", metavar="REV", help="also run the code of this commit")
    parser.add_argument("--only", metavar="VARIANT,...", help="measure only these variants (and the floor)")
    parser.add_argument("--no-throughput", action="store_true", help="sequential figures only")
    parser.add_argument("--sample", action="store_true", help="sample fresh turns with py-spy, by stage")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args, _ = parser.parse_known_args(argv)
    sys.path.insert(0, str(ROOT))
    if args.sample:
        from bench._sampled import sample

        only = args.only or ""
        return sample(history="history" in only, baseline=args.baseline, tracing="tracing" in only)
    from bench.traces import baseline_tree, start_at
    from tests.support.otlp import OtlpReceiver

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="corral-bench-overhead-") as tmp, OtlpReceiver() as receiver:
        work = Path(tmp)
        fake, fake_url = start_fake()
        procs: dict[str, tuple[Proc, str]] = {}
        try:
            defs = write_definitions(work / "defs", fake_url)
            procs["off"] = start_at(ROOT, defs, work, "off", {})
            # the batch processor's defaults (a batch every 5 s or 512 spans): what a deployment gets
            exporting = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url}
            procs["tracing on"] = start_at(ROOT, defs, work, "on", exporting)
            if args.baseline:
                tree = baseline_tree(args.baseline, work)
                procs[args.baseline] = start_at(tree, defs, work, "baseline", {})
            if args.only:
                for name in set(VARIANTS) - set(args.only.split(",")):
                    del VARIANTS[name]
            series, rates = asyncio.run(measure(fake, fake_url, procs, not args.no_throughput))
        finally:
            for proc, _ in procs.values():
                proc.stop()
            fake.stop()
    missed = report(series, rates)
    print(f"  whole run {time.perf_counter() - started:.1f} s; Python {sys.version.split()[0]}")
    if missed:
        print(f"  targets missed: {', '.join(missed)}")
    return 1 if missed and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
