"""Runtime benchmark: Corral's overhead over a model that answers instantly.

A fake OpenAI chat-completions server (tests/fakes, answering every request
at once with the same short reply) and a Corral server (`corral serve` on a
one-agent tree pointing at the fake) each run in their own process, so the
CPU time of each is read apart from the other's and from this client's
(`/proc/PID/stat`). One run measures:

- direct baseline: median latency of a direct httpx call to the fake's
  /v1/chat/completions, non-streaming and streaming, and its throughput with
  50 concurrent callers;
- Corral: median latency of a non-streaming turn (POST
  /v1/conversations/{id}/messages on a conversation created beforehand),
  and its ratio to the direct call (target <= 4x); throughput with 50
  concurrent conversations, as a share of the direct throughput (target >=
  50%); server CPU per turn, persistence included (target <= 2 ms); RSS of
  the idle server after one turn (target <= 100 MB);
- 1,000 concurrent SSE streams (GET /v1/conversations/{id}/events) held by
  the one server process: all open (HTTP 200 and `corral_active_streams`),
  live events still delivered while they are, RSS with them open.

Direct calls and Corral turns are measured in alternation (latency samples
in pairs, throughput in alternating runs of `THROUGHPUT_S` / 2 seconds), so a
machine busy with something else slows both sides alike; the ratios are the
figures to read. The client, Corral and the fake share the machine's cores:
throughput is a same-run ratio, not a capacity, and the fake's CPU per
request (same uvicorn and Starlette, no work) is the floor any Python HTTP
server here pays. `--check` exits 1 when a target is missed; `--profile`
runs the Corral process under cProfile from the warm-up on and prints its
hotspots (the profiler inflates every figure of that run).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import json
import os
import pstats
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
CONCURRENCY = 50
LATENCY_SAMPLES = 200
THROUGHPUT_S = 5.0  # each throughput run: as many calls as fit, then the ones in flight finish
STREAMS = 1000
STREAMS_PER_CLIENT = 50  # httpx's pool scans every connection per request: many small pools, not one
LIVE_CHECKS = 20  # conversations that run a turn while every stream is open
LATENCY_TARGET = 4.0  # x the direct call
THROUGHPUT_TARGET = 0.5  # share of the direct throughput
CPU_TARGET_MS = 2.0
RSS_TARGET_MB = 100.0
REPLY_TEXT = "Hello from the fake model."
START_TIMEOUT_S = 30.0


# --- the two server processes ------------------------------------------------------


def _fake_app() -> Any:
    from tests.fakes.openai_server import FakeOpenAI
    from tests.fakes.scenarios import Reply

    reply = Reply(REPLY_TEXT, chunks=3)

    class InstantOpenAI(FakeOpenAI):
        """Every request gets the same reply at once; nothing is scripted, queued or recorded."""

        async def take(self, request):
            try:
                body = json.loads(await request.body())
            except ValueError:
                body = None
            return body, reply

    return InstantOpenAI().app


def serve_fake() -> int:
    """`--serve-fake`: serve the instant fake on a free loopback port, printed first on stdout."""
    import uvicorn

    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted sockets only when the listener says TCP;
    # without it a response's header and body writes meet Nagle and delayed ACKs (~40 ms a call)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(4096)  # connections wait in the backlog until uvicorn has started
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(_fake_app(), log_config=None, access_log=False, lifespan="off", backlog=4096)
    with contextlib.suppress(KeyboardInterrupt):  # how `Proc.stop` ends it
        uvicorn.Server(config).run(sockets=[sock])
    return 0


def serve_profiled(out: str, argv: list[str]) -> int:
    """`--profiled-server OUT ARGV...`: run `corral ARGV`, under cProfile from SIGUSR1 on; stats to OUT."""
    from server.cli import main as corral

    profiler = cProfile.Profile()
    # start-up (imports, schemas) would drown the turns: the bench signals once it has warmed up
    signal.signal(signal.SIGUSR1, lambda *_: profiler.enable())
    try:
        return corral(argv)
    finally:
        profiler.disable()
        profiler.dump_stats(out)


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path | None = None
    profiled: bool = False

    def start_profile(self) -> None:
        if self.profiled:
            self.popen.send_signal(signal.SIGUSR1)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def cpu(self) -> float:
        """User + system CPU seconds of the process so far (every thread)."""
        stat = Path(f"/proc/{self.pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGINT)
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)

    def failure(self) -> str:
        tail = self.log.read_text()[-2000:] if self.log and self.log.exists() else ""
        return f"{self.name} (pid {self.pid}) exited with {self.popen.poll()}\n{tail}"


def start_fake() -> tuple[Proc, str]:
    popen = subprocess.Popen([sys.executable, "-m", "bench.runtime", "--serve-fake"], cwd=ROOT,
                             stdout=subprocess.PIPE, text=True, env=_env())
    proc = Proc("fake", popen)
    assert popen.stdout is not None
    line = popen.stdout.readline().strip()  # the port, printed once the socket is bound
    if not line.isdigit():
        proc.stop()
        raise SystemExit(f"the fake model server did not start: {line!r}")
    return proc, f"http://127.0.0.1:{line}"


def write_definitions(root: Path, fake_url: str) -> Path:
    root.mkdir(parents=True)
    (root / "bench.yaml").write_text(textwrap.dedent(f"""\
        kind: Model
        name: fast
        provider: openai
        model: m
        base_url: {fake_url}/v1
        api_key: ${{BENCH_KEY}}
        ---
        kind: Agent
        name: bench
        description: Answers through the instant fake; no tools.
        model: fast
        instructions: Answer briefly.
        """))
    return root


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def start_corral(definitions: Path, work: Path, profile_out: Path | None,
                 watch: bool = False, *, name: str = "corral",
                 env: dict[str, str] | None = None) -> tuple[Proc, str]:
    """`corral serve` on a free loopback port, its state under `work` (`env`: more CORRAL_* settings)."""
    port = _free_port()
    argv = ["serve", str(definitions), "--port", str(port), *([] if watch else ["--no-watch"])]
    if profile_out is None:
        command = [sys.executable, "-m", "server.cli", *argv]
    else:
        command = [sys.executable, "-m", "bench.runtime", "--profiled-server", str(profile_out), *argv]
    log = work / f"{name}.log"
    environ = _env(**{"CORRAL_STATE_DIR": str(work / "state"), "CORRAL_LOG_LEVEL": "warning",
                      "BENCH_KEY": "sk-bench", **(env or {})})
    with log.open("w") as sink:
        popen = subprocess.Popen(command, cwd=ROOT, env=environ, stdout=sink, stderr=subprocess.STDOUT)
    proc = Proc(name, popen, log, profiled=profile_out is not None)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            raise SystemExit(proc.failure())
        try:
            if httpx.get(f"{base}/readyz", timeout=1.0).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    proc.stop()
    raise SystemExit(f"corral did not become ready within {START_TIMEOUT_S:g}s\n{proc.failure()}")


# --- calls -----------------------------------------------------------------------


def _client(base_url: str, connections: int = CONCURRENCY + 10) -> httpx.AsyncClient:
    # idle connections expire here before uvicorn's 5 s keep-alive closes them under a request
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections,
                          keepalive_expiry=2.0)
    return httpx.AsyncClient(base_url=base_url, limits=limits, timeout=httpx.Timeout(30.0))


DIRECT_BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4096}
STREAM_BODY = {**DIRECT_BODY, "stream": True, "stream_options": {"include_usage": True}}


async def direct_call(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/chat/completions", json=DIRECT_BODY)
    if response.json()["choices"][0]["message"]["content"] != REPLY_TEXT:
        raise SystemExit(f"unexpected answer from the fake: {response.text[:200]}")


async def direct_stream(client: httpx.AsyncClient) -> None:
    async with client.stream("POST", "/v1/chat/completions", json=STREAM_BODY) as response:
        body = await response.aread()
    if not body.endswith(b"data: [DONE]\n\n"):
        raise SystemExit(f"unexpected stream from the fake: {body[-200:]!r}")


async def create_conversation(client: httpx.AsyncClient) -> str:
    response = await client.post("/v1/conversations", json={"agent": "bench"})
    if response.status_code != 201:
        raise SystemExit(f"creating a conversation: {response.status_code} {response.text[:300]}")
    return response.json()["id"]


async def corral_turn(client: httpx.AsyncClient, conversation: str) -> None:
    response = await client.post(f"/v1/conversations/{conversation}/messages", json={"content": "hi"})
    body = response.json() if response.status_code == 200 else {}
    if body.get("status") != "completed" or body.get("output") != REPLY_TEXT:
        raise SystemExit(f"a turn did not complete: {response.status_code} {response.text[:300]}")


async def corral_stream_turn(client: httpx.AsyncClient, conversation: str) -> None:
    body = {"content": "hi", "stream": True}
    async with client.stream("POST", f"/v1/conversations/{conversation}/messages", json=body) as response:
        raw = await response.aread()
    if b"event: turn.completed" not in raw:
        raise SystemExit(f"a streamed turn did not complete: {response.status_code} {raw[-300:]!r}")


async def create_many(client: httpx.AsyncClient, count: int) -> list[str]:
    ids: list[str] = []

    async def worker(n: int) -> None:
        for _ in range(n):
            ids.append(await create_conversation(client))

    share = [count // CONCURRENCY + (i < count % CONCURRENCY) for i in range(CONCURRENCY)]
    await asyncio.gather(*(worker(n) for n in share))
    return ids


async def paired(a: list[Callable[[], Awaitable[None]]], b: list[Callable[[], Awaitable[None]]],
                 block: int = 10) -> tuple[list[float], list[float]]:
    """Latencies of the calls of `a` and of `b`, `block` of one then `block` of the other.

    Both series see the same machine load; in blocks, not one by one, so that what
    a server still does after answering slows the other series' calls less.
    """
    samples: tuple[list[float], list[float]] = ([], [])
    for first in range(0, len(a), block):
        for calls, series in zip((a, b), samples, strict=True):
            for call in calls[first:first + block]:
                start = time.perf_counter()
                await call()
                series.append(time.perf_counter() - start)
    return samples


async def concurrently(workers: list[Callable[[], Awaitable[None]]], seconds: float) -> tuple[int, float]:
    """All workers at once, each calling one after the other until `seconds` have passed.

    Returns the calls made and the wall seconds until the last one ended.
    """
    start = time.perf_counter()
    deadline = start + seconds
    done = 0

    async def loop(call: Callable[[], Awaitable[None]]) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await call()
            done += 1

    await asyncio.gather(*(loop(w) for w in workers))
    return done, time.perf_counter() - start


# --- the measures ------------------------------------------------------------------


@dataclass
class Results:
    values: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


class Meter:
    """CPU seconds of the server processes over one phase."""

    def __init__(self, *procs: Proc):
        self.procs = procs
        self.start = [p.cpu() for p in procs]
        self.client = time.process_time()

    def used(self) -> tuple[list[float], float]:
        return [p.cpu() - s for p, s in zip(self.procs, self.start, strict=True)], \
            time.process_time() - self.client


async def measure_latency(direct: httpx.AsyncClient, client: httpx.AsyncClient, res: Results,
                          corral: Proc, fake: Proc) -> None:
    """Direct calls and Corral turns one after the other, so that both see the same load."""
    n = LATENCY_SAMPLES
    ids = await create_many(client, 2 * n + 20)
    for conversation in ids[:20]:  # warm-up
        await direct_call(direct)
        await direct_stream(direct)
        await corral_turn(client, conversation)
    corral.start_profile()
    meter = Meter(corral, fake)  # only the non-streaming turns run on Corral meanwhile
    plain, turns = await paired([_bind(direct_call, direct)] * n,
                                [_bind(corral_turn, client, c) for c in ids[20:20 + n]])
    (server_cpu, fake_cpu), _ = meter.used()
    res.values["cpu_seq"] = server_cpu / n
    res.values["fake_cpu_seq"] = fake_cpu / (2 * n)  # n direct calls, n from Corral
    streamed, stream_turns = await paired([_bind(direct_stream, direct)] * n,
                                          [_bind(corral_stream_turn, client, c) for c in ids[20 + n:]])
    for key, samples in (("direct", plain), ("turn", turns), ("direct_stream", streamed),
                         ("turn_stream", stream_turns)):
        res.values[f"{key}_p50"] = statistics.median(samples)
        res.values[f"{key}_p90"] = statistics.quantiles(samples, n=10)[-1]
    v = res.values
    res.notes.append(f"latency p90 ({n} each, interleaved): direct {_ms(v['direct_p90'])}, corral turn "
                     f"{_ms(v['turn_p90'])}; streaming: direct {_ms(v['direct_stream_p90'])}, "
                     f"corral {_ms(v['turn_stream_p90'])}")


@dataclass
class Tally:
    """Calls, wall seconds and CPU seconds (per server process, and this client's) over some runs."""

    calls: int = 0
    wall: float = 0.0
    cpu: list[float] = field(default_factory=lambda: [0.0, 0.0])
    client_cpu: float = 0.0

    def add(self, calls: int, wall: float, meter: Meter) -> None:
        cpu, client_cpu = meter.used()
        self.calls += calls
        self.wall += wall
        self.cpu = [total + more for total, more in zip(self.cpu, [*cpu, 0.0], strict=False)]
        self.client_cpu += client_cpu


async def measure_throughput(direct: httpx.AsyncClient, client: httpx.AsyncClient, res: Results,
                             corral: Proc, fake: Proc, rounds: int = 2) -> None:
    """Direct and through Corral, `rounds` alternating runs of each, `THROUGHPUT_S` in all per side."""
    ids = await create_many(client, CONCURRENCY)
    sides = {
        "direct": ([_bind(direct_call, direct)] * CONCURRENCY, (fake,)),
        "corral": ([_bind(corral_turn, client, c) for c in ids], (corral, fake)),
    }
    tallies = {name: Tally() for name in sides}
    for _ in range(rounds):
        for name, (workers, procs) in sides.items():
            meter = Meter(*procs)
            done, wall = await concurrently(workers, THROUGHPUT_S / rounds)
            tallies[name].add(done, wall, meter)
    t = tallies["direct"]
    res.values["direct_rps"] = t.calls / t.wall
    res.values["direct_fake_cpu"] = t.cpu[0] / t.calls
    res.notes.append(f"direct throughput: {t.calls} calls in {t.wall:.2f}s; CPU fake {t.cpu[0]:.2f}s, "
                     f"client {t.client_cpu:.2f}s")
    t = tallies["corral"]
    res.values["turn_rps"] = t.calls / t.wall
    res.values["cpu_conc"] = t.cpu[0] / t.calls
    res.values["fake_cpu_conc"] = t.cpu[1] / t.calls
    res.notes.append(f"corral throughput: {t.calls} turns ({CONCURRENCY} conversations) in {t.wall:.2f}s; "
                     f"CPU corral {t.cpu[0]:.2f}s, fake {t.cpu[1]:.2f}s, client {t.client_cpu:.2f}s")


def _bind(fn: Callable[..., Awaitable[None]], *args: Any) -> Callable[[], Awaitable[None]]:
    return lambda: fn(*args)


async def _active_streams(client: httpx.AsyncClient) -> int:
    text = (await client.get("/metrics")).text
    for line in text.splitlines():
        if line.startswith("corral_active_streams "):
            return int(float(line.split()[1]))
    return -1


async def _wait_for(predicate: Callable[[], Awaitable[bool]], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(0.1)
    return False


class StreamHolder:
    """Holds one GET /events stream open and notes the turns it saw complete."""

    def __init__(self, client: httpx.AsyncClient, conversation: str):
        self.client = client
        self.conversation = conversation
        self.opened = asyncio.Event()
        self.status = 0
        self.completed = asyncio.Event()

    async def hold(self) -> None:
        try:
            async with self.client.stream("GET", f"/v1/conversations/{self.conversation}/events") as r:
                self.status = r.status_code
                self.opened.set()
                async for line in r.aiter_lines():
                    if line == "event: turn.completed":
                        self.completed.set()
        finally:
            self.opened.set()


async def measure_streams(base: str, res: Results, corral: Proc) -> None:
    async with _client(base) as client, contextlib.AsyncExitStack() as stack:
        ids = await create_many(client, STREAMS)
        pools = [await stack.enter_async_context(_client(base, STREAMS_PER_CLIENT + 5))
                 for _ in range(0, STREAMS, STREAMS_PER_CLIENT)]
        holders = [StreamHolder(pools[n // STREAMS_PER_CLIENT], c) for n, c in enumerate(ids)]
        meter = Meter(corral)
        start = time.perf_counter()
        tasks = [asyncio.create_task(h.hold()) for h in holders]
        try:
            await asyncio.wait_for(asyncio.gather(*(h.opened.wait() for h in holders)), 60)
            res.values["streams_open_s"] = time.perf_counter() - start
            (opening_cpu,), _ = meter.used()
            res.values["streams_ok"] = sum(h.status == 200 for h in holders)
            await _wait_for(lambda: _is(_active_streams(client), STREAMS), 10)
            res.values["streams_gauge"] = await _active_streams(client)
            res.values["streams_rss"] = corral.rss_mb()
            await _live_check(client, holders[:: STREAMS // LIVE_CHECKS][:LIVE_CHECKS], res)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        closed = await _wait_for(lambda: _is(_active_streams(client), 0), 10)
        after = await _active_streams(client)
    res.notes.append(f"{STREAMS} streams opened in {res.values['streams_open_s']:.2f}s "
                     f"({opening_cpu * 1000 / STREAMS:.2f} ms server CPU each); corral_active_streams after "
                     f"closing: {after}" + ("" if closed else " (did not return to 0 within 10s)"))


async def _is(value: Awaitable[int], expected: int) -> bool:
    return await value == expected


async def _live_check(client: httpx.AsyncClient, holders: list[StreamHolder], res: Results) -> None:
    """A turn on a few of the conversations: their open streams must see it complete."""
    await asyncio.gather(*(corral_turn(client, h.conversation) for h in holders))
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*(h.completed.wait() for h in holders)), 10)
    res.values["live_ok"] = sum(h.completed.is_set() for h in holders)
    res.values["live_total"] = len(holders)


# --- reporting -----------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    measure: str
    value: str
    baseline: str = ""
    ratio: str = ""
    target: str = ""
    ok: bool | None = None  # None: no target

    @property
    def status(self) -> str:
        return "" if self.ok is None else ("PASS" if self.ok else "MISS")


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def rows(v: dict[str, float]) -> list[Row]:
    lat_ratio = v["turn_p50"] / v["direct_p50"]
    tput_ratio = v["turn_rps"] / v["direct_rps"]
    per_stream_kb = (v["streams_rss"] - v["idle_rss"]) * 1024 / STREAMS
    return [
        Row("direct call p50 (non-streaming)", _ms(v["direct_p50"]), ratio="", target=""),
        Row("direct call p50 (streaming)", _ms(v["direct_stream_p50"])),
        Row(f"direct throughput ({CONCURRENCY} callers)", f"{v['direct_rps']:.0f} req/s"),
        Row("corral turn p50 (non-streaming)", _ms(v["turn_p50"]), _ms(v["direct_p50"]),
            f"{lat_ratio:.2f}x", f"<= {LATENCY_TARGET:g}x", lat_ratio <= LATENCY_TARGET),
        Row("corral turn p50 (streaming SSE)", _ms(v["turn_stream_p50"]), _ms(v["direct_stream_p50"]),
            f"{v['turn_stream_p50'] / v['direct_stream_p50']:.2f}x"),
        Row(f"corral throughput ({CONCURRENCY} conversations)", f"{v['turn_rps']:.0f} turns/s",
            f"{v['direct_rps']:.0f} req/s", f"{tput_ratio:.0%}", f">= {THROUGHPUT_TARGET:.0%}",
            tput_ratio >= THROUGHPUT_TARGET),
        Row("server CPU per turn (sequential)", _ms(v["cpu_seq"]), _ms(v["fake_cpu_seq"]) + " fake",
            target=f"<= {CPU_TARGET_MS:g} ms", ok=v["cpu_seq"] * 1000 <= CPU_TARGET_MS),
        Row(f"server CPU per turn ({CONCURRENCY} concurrent)", _ms(v["cpu_conc"]),
            _ms(v["fake_cpu_conc"]) + " fake", target=f"<= {CPU_TARGET_MS:g} ms",
            ok=v["cpu_conc"] * 1000 <= CPU_TARGET_MS),
        Row("fake CPU per direct call (50 callers)", _ms(v["direct_fake_cpu"])),
        Row("server RSS, idle after one turn", f"{v['idle_rss']:.1f} MB", target=f"<= {RSS_TARGET_MB:g} MB",
            ok=v["idle_rss"] <= RSS_TARGET_MB),
        Row(f"SSE streams open ({STREAMS} held)", f"{v['streams_ok']:.0f} ok, gauge {v['streams_gauge']:.0f}",
            target=f"{STREAMS}", ok=v["streams_ok"] == STREAMS and v["streams_gauge"] == STREAMS),
        Row("live turns seen on open streams", f"{v['live_ok']:.0f}/{v['live_total']:.0f}",
            target="all", ok=v["live_ok"] == v["live_total"]),
        Row(f"server RSS with {STREAMS} streams open", f"{v['streams_rss']:.1f} MB",
            f"{v['idle_rss']:.1f} MB", f"+{per_stream_kb:.0f} kB/stream"),
    ]


def report(table: list[Row], notes: list[str], out: io.TextIOBase) -> None:
    heads = ("measure", "value", "baseline", "ratio", "target", "status")
    cells = [heads, *((r.measure, r.value, r.baseline, r.ratio, r.target, r.status) for r in table)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(heads))]
    print(f"\nruntime benchmark: Corral over an instant fake model ({os.cpu_count()} cores, client, "
          "Corral and the fake in 3 processes)", file=out)
    for n, c in enumerate(cells):
        print("  ".join(c[i].ljust(widths[i]) if i == 0 else c[i].rjust(widths[i]) for i in range(6)),
              file=out)
        if n == 0:
            print("  ".join("-" * w for w in widths), file=out)
    for note in notes:
        print(f"  {note}", file=out)


def print_profile(path: Path, out: io.TextIOBase, top: int = 30) -> None:
    buf = io.StringIO()
    stats = pstats.Stats(str(path), stream=buf)
    stats.sort_stats("tottime").print_stats(top)
    body = buf.getvalue()
    print(f"\n--- cProfile of the Corral process from warm-up on: top {top} by own time ---", file=out)
    print(body[body.find("   ncalls"):].rstrip(), file=out)
    buf = io.StringIO()
    stats.stream = buf
    stats.sort_stats("cumulative").print_stats(top)
    body = buf.getvalue()
    print(f"\n--- top {top} by cumulative time ---", file=out)
    print(body[body.find("   ncalls"):].rstrip(), file=out)


# --- the run -------------------------------------------------------------------------


def _raise_nofile(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


async def run(fake: Proc, fake_url: str, corral: Proc, base: str) -> Results:
    res = Results()
    async with _client(base) as client:  # one turn, then the idle footprint
        await corral_turn(client, await create_conversation(client))
    res.values["idle_rss"] = corral.rss_mb()
    async with _client(fake_url) as direct, _client(base) as client:
        await measure_latency(direct, client, res, corral, fake)
        await measure_throughput(direct, client, res, corral, fake)
    await measure_streams(base, res, corral)
    return res


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--serve-fake"]:
        return serve_fake()
    if argv[:1] == ["--profiled-server"]:
        return serve_profiled(argv[1], argv[2:])
    parser = argparse.ArgumentParser(prog="python -m bench runtime", description=__doc__.split("\n")[0])
    parser.add_argument("--profile", action="store_true", help="run Corral under cProfile, print hotspots")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    out = sys.stdout
    _raise_nofile(4 * STREAMS + 1024)  # inherited by both servers
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as tmp:
        work = Path(tmp)
        profile_out = work / "corral.prof" if args.profile else None
        fake, fake_url = start_fake()
        try:
            corral, base = start_corral(write_definitions(work / "defs", fake_url), work, profile_out)
            try:
                res = asyncio.run(run(fake, fake_url, corral, base))
            finally:
                corral.stop()
        finally:
            fake.stop()
        table = rows(res.values)
        res.notes.append(f"whole run {time.perf_counter() - started:.1f}s; Python {sys.version.split()[0]}")
        report(table, res.notes, out)
        if profile_out is not None and profile_out.exists():
            print_profile(profile_out, out)
    missed = [r.measure for r in table if r.ok is False]
    if missed:
        print(f"\ntargets missed: {', '.join(missed)}", file=out)
    return 1 if missed and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
