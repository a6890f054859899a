"""Replicas benchmark: Corral on SQLite, on PostgreSQL, and two PostgreSQL replicas behind nginx.

The processes and calls of `bench.runtime` (the instant fake OpenAI model in
a process of its own, `corral serve` on the one-agent tree that points at
it, CPU read from `/proc`), in one run, with four rows:

- the direct call to the fake (the baseline every ratio divides by);
- Corral on SQLite (the embedded default);
- Corral on PostgreSQL, one replica (a real PostgreSQL 15 started for the
  run, `tests.support.postgres`, durability off);
- Corral on PostgreSQL, two replicas on one database behind a round-robin
  nginx (`tests.support.nginx`, the README's configuration): the 50
  conversations and their turns spread over both replicas.

For each: server CPU per turn (the Corral processes' CPU over the measured
turns, divided by the turns; the PostgreSQL server's processes apart: the
postmaster, its live children and the children it reaped), at 50 concurrent
conversations and one turn at a time; turns/s with 50 conversations each
sending its next (non-streaming) message once the previous one was answered,
for `THROUGHPUT_S` after a warm-up; and the median turn one at a time. Each
setup's throughput runs alternate with direct runs of the same length
(`ROUNDS` of each, `bench.runtime.concurrently`, as the runtime benchmark
does, so the SQLite row reads like its figures), and its sequential turns are
taken in blocks alternating with direct calls, so a machine busy with
something else slows both sides alike: the ratios are the figures to read.
The PostgreSQL ratio to SQLite is of the Corral processes' CPU (the gated
figure), printed beside the ratio with the PostgreSQL server's CPU added.

Statements and transactions per turn are counted in-process, on the real
code path: a Corral app (`tests.support.servers.corral_app`) on each store,
served by uvicorn in a thread, `store.stats` read before and after a run of
turns (heartbeats out of the window: a long lease).

SSE across replicas: two replicas, no proxy; each conversation has one
`GET .../events` stream on replica A, which runs its turns, and one on B; for
`SSE_TURNS` turns the arrival time of every event on B minus its arrival on
A (both read by this process, on one clock) is the delay a second replica
adds.

Targets (issue 13): SQLite at least as fast as today (4.9 to 6.1 ms CPU a turn,
0.46 to 0.74x the direct throughput, median turn 3.7 to 4.0x the direct call),
PostgreSQL within 1.5x SQLite's CPU per turn, SSE on another replica adding
under 5 ms at the median. `--check` exits 1 when the PostgreSQL ratio or the
SSE median misses (the SQLite figures are machine-bound and only reported).
`--profile` runs every Corral server (SQLite, one replica, both replicas) under
cProfile from the warm-up on and prints their hotspots (the profiler inflates
every figure of that run). PostgreSQL or nginx missing: their rows are
skipped with the reason.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.runtime import (
    CONCURRENCY,
    Proc,
    _bind,
    _client,
    _raise_nofile,
    concurrently,
    corral_turn,
    create_conversation,
    create_many,
    direct_call,
    paired,
    print_profile,
    start_corral,
    start_fake,
    write_definitions,
)

ROUNDS = 2  # alternating direct / Corral throughput runs per setup
THROUGHPUT_S = 5.0  # per side and setup, split over the rounds
WARMUP_S = 1.0  # per side and setup, before the measured runs
LATENCY_PAIRS = 100  # sequential direct call / turn pairs per setup
SSE_TURNS = 200
SSE_CONVERSATIONS = 10
SSE_WARMUP_TURNS = 10
STATS_CONVERSATIONS, STATS_TURNS_EACH = 10, 5
STATS_LEASE_S = 3600.0  # no heartbeat or lease renewal inside the counted window
TODAY_CPU_MS = (4.9, 6.1)
TODAY_THROUGHPUT = (0.46, 0.74)
TODAY_LATENCY = (3.7, 4.0)
PG_CPU_TARGET = 1.5  # x SQLite's CPU per turn
SSE_TARGET_MS = 5.0  # added at the median
NGINX_CANDIDATES = ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx")


# --- CPU of a process tree (PostgreSQL, nginx) ------------------------------------------


def _stat(pid: int) -> list[str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2:].split()


class ProcessTree:
    """CPU seconds of a server that forks: the parent, its live children, the children it reaped."""

    def __init__(self, name: str, pid: int):
        self.name = name
        self.pid = pid
        self._tick = os.sysconf("SC_CLK_TCK")

    def cpu(self) -> float:
        fields = _stat(self.pid)
        ticks = sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime (reaped children)
        parent = str(self.pid)
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                child = _stat(int(entry.name))
            except (OSError, ValueError):
                continue  # gone meanwhile: its time is now in the parent's cutime
            if child[1] == parent:
                ticks += int(child[11]) + int(child[12])
        return ticks / self._tick

    def readable(self) -> str | None:
        """Why its CPU cannot be read, or None."""
        try:
            self.cpu()
        except (OSError, ValueError, IndexError) as exc:
            return f"/proc/{self.pid}/stat unreadable ({type(exc).__name__})"
        return None


def _cpu_of(procs: list) -> list[float]:
    return [p.cpu() for p in procs]


# --- one setup's measures ----------------------------------------------------------------


@dataclass
class Setup:
    label: str
    store: str  # "sqlite" or "postgres"
    base: str  # where the client sends (a replica, or nginx)
    corral: list[Proc]
    db: ProcessTree | None = None
    proxy: ProcessTree | None = None


@dataclass
class Measured:
    label: str
    store: str
    turns: int = 0
    wall: float = 0.0
    corral_cpu: float = 0.0
    db_cpu: float | None = None
    proxy_cpu: float | None = None
    fake_cpu: float = 0.0
    direct_calls: int = 0
    direct_wall: float = 0.0
    direct_fake_cpu: float = 0.0
    turn_seq: list[float] = field(default_factory=list)  # one at a time, paired
    direct_seq: list[float] = field(default_factory=list)
    seq_corral_cpu: float = 0.0  # over the sequential turns (only Corral turns run on Corral then)
    seq_db_cpu: float | None = None
    stmts: float | None = None
    txs: float | None = None

    @property
    def rps(self) -> float:
        return self.turns / self.wall

    @property
    def direct_rps(self) -> float:
        return self.direct_calls / self.direct_wall

    def per_turn(self, cpu: float | None) -> float | None:
        return None if cpu is None else cpu / self.turns


async def measure_setup(setup: Setup, fake: Proc, fake_url: str) -> Measured:
    m = Measured(setup.label, setup.store)
    async with _client(fake_url) as direct, _client(setup.base) as client:
        ids = await create_many(client, CONCURRENCY)
        singles = await create_many(client, LATENCY_PAIRS + 20)
        # warm-up: connections, caches, the server's first turns
        for conversation in singles[:20]:
            await direct_call(direct)
            await corral_turn(client, conversation)
        for proc in setup.corral:
            proc.start_profile()
        before_corral, before_db = _cpu_of(setup.corral), _cpu_of([setup.db] if setup.db else [])
        m.direct_seq, m.turn_seq = await paired([_bind(direct_call, direct)] * LATENCY_PAIRS,
                                                [_bind(corral_turn, client, c) for c in singles[20:]])
        m.seq_corral_cpu = sum(_cpu_of(setup.corral)) - sum(before_corral)
        if setup.db is not None:
            m.seq_db_cpu = setup.db.cpu() - before_db[0]
        await concurrently([_bind(direct_call, direct)] * CONCURRENCY, WARMUP_S)
        await concurrently([_bind(corral_turn, client, c) for c in ids], WARMUP_S)
        direct_workers = [_bind(direct_call, direct)] * CONCURRENCY
        corral_workers = [_bind(corral_turn, client, c) for c in ids]
        others = [p for p in (setup.db, setup.proxy) if p is not None]
        m.db_cpu = 0.0 if setup.db is not None else None
        m.proxy_cpu = 0.0 if setup.proxy is not None else None
        for _ in range(ROUNDS):
            before = fake.cpu()
            done, wall = await concurrently(direct_workers, THROUGHPUT_S / ROUNDS)
            m.direct_calls += done
            m.direct_wall += wall
            m.direct_fake_cpu += fake.cpu() - before
            before_corral, before_fake, before_others = _cpu_of(setup.corral), fake.cpu(), _cpu_of(others)
            done, wall = await concurrently(corral_workers, THROUGHPUT_S / ROUNDS)
            m.turns += done
            m.wall += wall
            m.corral_cpu += sum(_cpu_of(setup.corral)) - sum(before_corral)
            m.fake_cpu += fake.cpu() - before_fake
            used = [after - b for after, b in zip(_cpu_of(others), before_others, strict=True)]
            if setup.db is not None:
                m.db_cpu += used.pop(0)
            if setup.proxy is not None:
                m.proxy_cpu += used.pop(0)
    return m


# --- SSE across two replicas ------------------------------------------------------------------


class Follower:
    """One GET .../events stream; notes when each event (by id) arrived, on this process's clock."""

    def __init__(self, client: httpx.AsyncClient, conversation: str):
        self.client = client
        self.conversation = conversation
        self.arrived: dict[int, tuple[str, float]] = {}
        self.completed = 0
        self.opened = asyncio.Event()
        self.changed = asyncio.Event()
        self.status = 0

    async def follow(self) -> None:
        try:
            async with self.client.stream("GET", f"/v1/conversations/{self.conversation}/events") as r:
                self.status = r.status_code
                self.opened.set()
                event_id, name = None, None
                async for line in r.aiter_lines():
                    if line.startswith("id: "):
                        event_id = int(line[4:])
                    elif line.startswith("event: "):
                        name = line[7:]
                    elif not line and name is not None:
                        if event_id is not None:
                            self.arrived[event_id] = (name, time.perf_counter())
                        if name == "turn.completed":
                            self.completed += 1
                            self.changed.set()
                        event_id, name = None, None
        finally:
            self.opened.set()

    async def wait_completed(self, count: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while self.completed < count:
            self.changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise SystemExit(f"SSE: {self.client.base_url} saw {self.completed} of {count} turns of "
                                 f"{self.conversation} complete")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)


@dataclass
class Delivery:
    completed: list[float] = field(default_factory=list)  # B minus A, seconds, turn.completed
    every: list[float] = field(default_factory=list)  # every event both saw
    missing: int = 0  # events A saw that B did not


async def measure_sse(a: str, b: str) -> Delivery:
    result = Delivery()
    async with _client(a) as on_a, _client(a) as streams_a, _client(b) as streams_b:
        conversations = [await create_conversation(on_a) for _ in range(SSE_CONVERSATIONS)]
        pairs = [(Follower(streams_a, c), Follower(streams_b, c)) for c in conversations]
        tasks = [asyncio.create_task(f.follow()) for pair in pairs for f in pair]
        try:
            await asyncio.wait_for(asyncio.gather(*(f.opened.wait() for p in pairs for f in p)), 10)
            bad = [f.status for p in pairs for f in p if f.status != 200]
            if bad:
                raise SystemExit(f"SSE: GET .../events answered {bad[:5]}")
            await asyncio.sleep(0.2)  # both streams are following live before the first turn
            total = SSE_WARMUP_TURNS + SSE_TURNS
            marks: list[tuple[Follower, Follower, int]] = []  # after the warm-up: where to start counting
            for n in range(total):
                fa, fb = pairs[n % len(pairs)]
                if n == SSE_WARMUP_TURNS:
                    marks = [(x, y, max(x.arrived, default=0)) for x, y in pairs]
                await corral_turn(on_a, fa.conversation)
                expected = n // len(pairs) + 1
                await fa.wait_completed(expected)
                await fb.wait_completed(expected)
            for fa, fb, start in marks:
                for event_id, (name, at_a) in fa.arrived.items():
                    if event_id <= start:
                        continue
                    seen = fb.arrived.get(event_id)
                    if seen is None:
                        result.missing += 1
                        continue
                    delay = seen[1] - at_a
                    result.every.append(delay)
                    if name == "turn.completed":
                        result.completed.append(delay)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return result


# --- statements and transactions per turn, in-process ------------------------------------------


def count_statements(definitions: Path, state: Path, database_url: str | None) -> tuple[float, float]:
    """(statements, transactions) per turn, on the real server code path, in this process."""
    from tests.support.servers import corral_app, serving

    os.environ.setdefault("BENCH_KEY", "sk-bench")
    app = corral_app(definitions, state, database_url=database_url, lease_s=STATS_LEASE_S,
                     log_level="warning")
    with serving(app) as base, httpx.Client(base_url=base, timeout=30.0) as client:
        store = app.state.service.store
        ids = []
        for _ in range(STATS_CONVERSATIONS):
            response = client.post("/v1/conversations", json={"agent": "bench"})
            response.raise_for_status()
            ids.append(response.json()["id"])
        _sync_turn(client, ids[0])  # warm-up, on a conversation of its own
        ids = ids[1:]
        time.sleep(0.2)  # writes after the answer (if any) land before the count starts
        before = (store.stats.statements, store.stats.transactions)
        turns = 0
        for _ in range(STATS_TURNS_EACH):
            for conversation in ids:
                _sync_turn(client, conversation)
                turns += 1
        time.sleep(0.2)
        after = (store.stats.statements, store.stats.transactions)
    return (after[0] - before[0]) / turns, (after[1] - before[1]) / turns


def _sync_turn(client: httpx.Client, conversation: str) -> None:
    response = client.post(f"/v1/conversations/{conversation}/messages", json={"content": "hi"})
    if response.status_code != 200 or response.json().get("status") != "completed":
        raise SystemExit(f"a turn did not complete: {response.status_code} {response.text[:300]}")


# --- what is installed ------------------------------------------------------------------------


def _postgres() -> tuple[object | None, str | None]:
    """A PostgresServer (not started), or why there is none."""
    try:
        import asyncpg  # noqa: F401
    except ImportError:
        return None, "asyncpg is not installed (pip install corral[postgres])"
    from tests.support.postgres import PostgresServer, PostgresUnavailable

    try:
        return PostgresServer(), None
    except PostgresUnavailable as exc:
        return None, str(exc)


def _nginx() -> str | None:
    return shutil.which("nginx") or next((c for c in NGINX_CANDIDATES if os.access(c, os.X_OK)), None)


# --- reporting --------------------------------------------------------------------------------


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.2f}"


def _ms_unit(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.2f} ms"


def _x(value: float) -> str:
    return f"{value:.2f}x"


def _table(heads: list[str], body: list[list[str]]) -> Iterator[str]:
    widths = [max(len(row[i]) for row in [heads, *body]) for i in range(len(heads))]

    def line(row: list[str]) -> str:
        return "  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(row))

    yield line(heads)
    yield "  ".join("-" * w for w in widths)
    yield from (line(row) for row in body)


def _p95(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=20)[-1] if len(samples) >= 2 else samples[0]


def _within(value: float, span: tuple[float, float], lower_is_better: bool = True) -> str:
    low, high = span
    if low <= value <= high:
        return "within today's range"
    better = value < low if lower_is_better else value > high
    return "better than today" if better else "worse than today"


@dataclass
class Report:
    measured: list[Measured] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    sse: Delivery | None = None
    misses: list[str] = field(default_factory=list)

    def print(self) -> None:
        print(f"\nreplicas benchmark: Corral on SQLite and PostgreSQL, one replica and two behind nginx, "
              f"over an instant fake model ({os.cpu_count()} cores; client, fake, Corral, PostgreSQL"
              " and nginx share them)")
        if self.measured:
            self._rows()
        for reason in self.skipped:
            print(f"  skipped: {reason}")
        self._targets()
        for note in self.notes:
            print(f"  {note}")

    def _rows(self) -> None:
        all_seq = [s for m in self.measured for s in m.direct_seq]
        calls = sum(m.direct_calls for m in self.measured)
        wall = sum(m.direct_wall for m in self.measured)
        fake_cpu = sum(m.direct_fake_cpu for m in self.measured)
        heads = ["setup", f"CPU/turn @{CONCURRENCY}", "postgres", "CPU/turn 1-by-1", "postgres",
                 f"turns/s @{CONCURRENCY}", "x direct", "p50 turn 1-by-1", "x direct", "stmts/turn",
                 "tx/turn"]
        body = [["direct call to the fake model", _ms_unit(fake_cpu / calls) + " (fake)", "", "", "",
                 f"{calls / wall:.0f}", "1.00x", _ms_unit(statistics.median(all_seq)), "1.00x", "", ""]]
        for m in self.measured:
            seq = statistics.median(m.turn_seq)
            pg = m.store == "postgres"
            body.append([
                m.label, _ms_unit(m.per_turn(m.corral_cpu)), _ms_unit(m.per_turn(m.db_cpu)) if pg else "",
                _ms_unit(m.seq_corral_cpu / len(m.turn_seq)),
                _ms_unit(None if m.seq_db_cpu is None else m.seq_db_cpu / len(m.turn_seq)) if pg else "",
                f"{m.rps:.0f}", _x(m.rps / m.direct_rps),
                _ms_unit(seq), _x(seq / statistics.median(m.direct_seq)),
                "n/a" if m.stmts is None else f"{m.stmts:.1f}", "n/a" if m.txs is None else f"{m.txs:.1f}",
            ])
        for row in _table(heads, body):
            print(f"  {row}")
        print(f"  CPU/turn: the Corral processes' CPU over the measured turns (@{CONCURRENCY}: the"
              f" {CONCURRENCY} concurrent conversations' {THROUGHPUT_S:g} s; 1-by-1: {LATENCY_PAIRS}"
              " sequential turns), the PostgreSQL server's apart; each setup's ratios divide by its own"
              " alternating direct runs; stmts and tx per turn counted in-process, one replica")

    def _targets(self) -> None:
        print("  targets (issue 13):")
        sqlite = next((m for m in self.measured if m.store == "sqlite"), None)
        if sqlite is not None:
            base = sqlite.per_turn(sqlite.corral_cpu)
            base_seq = sqlite.seq_corral_cpu / len(sqlite.turn_seq)
            share = sqlite.rps / sqlite.direct_rps
            lat = statistics.median(sqlite.turn_seq) / statistics.median(sqlite.direct_seq)
            for what, value, unit, today, lower in (
                    (f"SQLite CPU/turn @{CONCURRENCY}", base * 1000, " ms", TODAY_CPU_MS, True),
                    ("SQLite CPU/turn 1-by-1", base_seq * 1000, " ms", TODAY_CPU_MS, True),
                    (f"SQLite throughput @{CONCURRENCY}", share, "x direct", TODAY_THROUGHPUT, False),
                    ("SQLite median turn 1-by-1", lat, "x direct", TODAY_LATENCY, True)):
                print(f"    {what:32} {value:6.2f}{unit:9}  today {today[0]} to {today[1]}{unit}:"
                      f" {_within(value, today, lower)}")
            for m in self.measured:
                if m.store != "postgres":
                    continue
                ratio = m.per_turn(m.corral_cpu) / base
                ratio_seq = m.seq_corral_cpu / len(m.turn_seq) / base_seq
                ok = ratio <= PG_CPU_TARGET
                with_db = ""
                if m.db_cpu is not None and m.seq_db_cpu is not None:
                    total = (m.corral_cpu + m.db_cpu) / m.turns / base
                    total_seq = (m.seq_corral_cpu + m.seq_db_cpu) / len(m.turn_seq) / base_seq
                    with_db = f"; Corral + postgres {total:.2f}x, 1-by-1 {total_seq:.2f}x"
                print(f"    {m.label + ' CPU/turn / SQLite:':49} {ratio:.2f}x   target <= {PG_CPU_TARGET}x:"
                      f" {'PASS' if ok else 'MISS'}   (1-by-1 {ratio_seq:.2f}x{with_db})")
                if not ok:
                    self.misses.append(f"{m.label} CPU/turn {ratio:.2f}x SQLite's")
        if self.sse is not None:
            d = self.sse
            median = statistics.median(d.completed) * 1000
            ok = median < SSE_TARGET_MS
            p95 = _p95(d.completed) * 1000
            verdict = "PASS" if ok else "MISS"
            print(f"    SSE on replica B vs A, turn.completed ({len(d.completed)} turns):"
                  f" median +{median:.2f} ms, p95 +{p95:.2f} ms"
                  f"   target median < {SSE_TARGET_MS:g} ms: {verdict}")
            print(f"    SSE on replica B vs A, every event ({len(d.every)}): median "
                  f"+{statistics.median(d.every) * 1000:.2f} ms, p95 +{_p95(d.every) * 1000:.2f} ms"
                  + (f"; {d.missing} events never reached B" if d.missing else ""))
            if not ok:
                self.misses.append(f"SSE added median {median:.2f} ms")


# --- the run ------------------------------------------------------------------------------


def _setup_note(m: Measured) -> str:
    parts = [f"{m.turns} turns in {m.wall:.2f}s", f"Corral CPU {m.corral_cpu:.2f}s",
             f"fake {m.fake_cpu / m.turns * 1000:.2f} ms/turn"]
    if m.db_cpu is not None:
        parts.append(f"postgres {m.db_cpu:.2f}s")
    if m.proxy_cpu is not None:
        parts.append(f"nginx {m.proxy_cpu / m.turns * 1000:.2f} ms/turn")
    parts.append(f"its alternating direct runs {m.direct_rps:.0f} req/s,"
                 f" p50 {_ms(statistics.median(m.direct_seq))} ms 1-by-1")
    return f"{m.label}: " + "; ".join(parts)


class Run:
    """One run: the processes it started (stopped in reverse order), what it measured."""

    def __init__(self, work: Path, profile: bool):
        self.work = work
        self.profile = profile
        self.report = Report()
        self.profiles: list[tuple[str, Path]] = []
        self._stops: list[Callable[[], None]] = []
        self.fake: Proc
        self.fake_url = ""
        self.defs = work / "defs"
        self.db: ProcessTree | None = None

    def __enter__(self) -> Run:
        return self

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        if exc is not None:
            self._dump_logs()
        while self._stops:
            with contextlib.suppress(Exception):
                self._stops.pop()()

    def _dump_logs(self) -> None:
        for log in sorted(self.work.glob("*.log")):  # what the servers said, before the directory goes
            tail = log.read_text(errors="replace")[-3000:].strip()
            if tail:
                print(f"\n--- {log.name} (tail) ---\n{tail}", file=sys.stderr)

    def corral(self, name: str, env: dict[str, str]) -> tuple[Proc, str]:
        out = self.work / f"{name}.prof" if self.profile else None
        proc, base = start_corral(self.defs, self.work, out, name=name,
                                  env={"CORRAL_STATE_DIR": str(self.work / name), **env})
        self._stops.append(proc.stop)
        if out is not None:
            self.profiles.append((name, out))
        return proc, base

    def measure(self, setup: Setup) -> None:
        self.report.measured.append(asyncio.run(measure_setup(setup, self.fake, self.fake_url)))

    def all(self) -> Report:
        self.fake, self.fake_url = start_fake()
        self._stops.append(self.fake.stop)
        write_definitions(self.defs, self.fake_url)
        postgres, why_not = _postgres()
        proc, base = self.corral("sqlite", {"CORRAL_DATABASE_URL": ""})
        self.measure(Setup("SQLite", "sqlite", base, [proc]))
        proc.stop()
        counts = {"sqlite": count_statements(self.defs, self.work / "stats-sqlite", None)}
        if postgres is None:
            self.report.skipped.append(f"Corral on PostgreSQL (both rows), SSE across replicas: {why_not}")
        else:
            postgres.start()
            self._stops.append(postgres.stop)
            self.db = ProcessTree("postgres", int((postgres.data / "postmaster.pid").read_text().split()[0]))
            unreadable = self.db.readable()
            if unreadable:
                self.report.notes.append(f"postgres CPU: n/a ({unreadable})")
                self.db = None
            self.on_postgres(postgres)
            url = postgres.create_database()
            counts["postgres"] = count_statements(self.defs, self.work / "stats-pg", url)
        for m in self.report.measured:
            m.stmts, m.txs = counts.get(m.store, (None, None))
        self.report.notes.extend(_setup_note(m) for m in self.report.measured)
        return self.report

    def on_postgres(self, postgres) -> None:
        url = postgres.create_database()
        proc, base = self.corral("pg-1", {"CORRAL_DATABASE_URL": url, "CORRAL_REPLICA_ID": "solo"})
        self.measure(Setup("PostgreSQL, 1 replica", "postgres", base, [proc], db=self.db))
        proc.stop()
        url = postgres.create_database()
        a, base_a = self.corral("pg-a", {"CORRAL_DATABASE_URL": url, "CORRAL_REPLICA_ID": "a"})
        b, base_b = self.corral("pg-b", {"CORRAL_DATABASE_URL": url, "CORRAL_REPLICA_ID": "b"})
        if _nginx() is None:
            self.report.skipped.append("Corral on PostgreSQL, 2 replicas behind nginx: nginx is not installed"
                                       " (Debian: apt-get install nginx)")
        else:
            self.behind_nginx(a, base_a, b, base_b)
        self.report.sse = asyncio.run(measure_sse(base_a, base_b))
        a.stop()
        b.stop()

    def behind_nginx(self, a: Proc, base_a: str, b: Proc, base_b: str) -> None:
        from tests.support.nginx import NginxProxy

        proxy = NginxProxy([base_a, base_b])
        proxy.start()
        self._stops.append(lambda: proxy.__exit__(None, None, None))
        tree = ProcessTree("nginx", proxy.proc.pid)
        self.measure(Setup("PostgreSQL, 2 replicas + nginx", "postgres", proxy.url, [a, b], db=self.db,
                           proxy=None if tree.readable() else tree))
        spread = ", ".join(f"{'a' if address in base_a else 'b'} {count}"
                           for address, count in sorted(proxy.served_by().items()))
        self.report.notes.append(f"nginx spread the requests over the replicas: {spread}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m bench replicas", description=__doc__.split("\n")[0])
    parser.add_argument("--profile", action="store_true",
                        help="run every Corral server under cProfile, print their hotspots")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    _raise_nofile(4096)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="corral-bench-replicas-") as tmp:
        with Run(Path(tmp), args.profile) as run:
            report = run.all()
        profiles = run.profiles
        took = time.perf_counter() - started
        report.notes.append(f"whole run {took:.1f}s; Python {sys.version.split()[0]}")
        report.print()
        for name, path in profiles:
            if path.exists():
                print(f"\n=== profile: {name} ===")
                print_profile(path, sys.stdout, top=25)
    if report.misses:
        print(f"\ntargets missed: {'; '.join(report.misses)}")
    return 1 if report.misses and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
