"""PostgreSQL drivers: asyncpg (what the store uses) against psycopg 3, on a real server on loopback.

Two figures decide whether the choice of driver matters for a turn:

- one small INSERT in its own transaction (what `append_event` is: one
  statement, an implicit transaction), median over many round trips;
- decoding a 50-row SELECT of the shape of an event page (int, text, text,
  float), median per query.

Both drivers run on one asyncio loop, alternating, against one
PostgreSQL server started for the purpose (`tests.support.postgres`) on
127.0.0.1 with durability off, so the figures are the drivers' and the
protocol's, not the disk's. psycopg is installed for this measurement only
(it is no dependency of Corral); without it, or without the PostgreSQL
binaries, the benchmark says why and skips.

No target: the ratio says whether asyncpg earns its place.
"""

from __future__ import annotations

import asyncio
import re
import statistics
import sys
import time
from collections.abc import Awaitable, Callable

INSERTS = 2000
SELECTS = 500
ROWS = 50
INSERT = "INSERT INTO events (conversation_id, seq, name, data, created_at) VALUES ($1, $2, $3, $4, $5)"
SELECT = "SELECT seq, name, data, created_at FROM events WHERE conversation_id = $1 ORDER BY seq LIMIT 50"
SCHEMA = ("CREATE TABLE events (conversation_id text NOT NULL, seq bigint NOT NULL, name text NOT NULL,"
          " data text NOT NULL, created_at double precision NOT NULL, PRIMARY KEY (conversation_id, seq))")


async def _median_us(call: Callable[[int], Awaitable[object]], times: int) -> float:
    samples = []
    for i in range(times):
        started = time.perf_counter()
        await call(i)
        samples.append((time.perf_counter() - started) * 1e6)
    return statistics.median(samples)


async def measure(url: str) -> dict[str, dict[str, float]]:
    import asyncpg
    import psycopg

    a = await asyncpg.connect(url)
    p = await psycopg.AsyncConnection.connect(url, autocommit=True, prepare_threshold=0)
    try:
        await a.execute(SCHEMA)
        data = '{"turn_id":"turn_01","delta":"' + "x" * 40 + '"}'
        await a.executemany(INSERT, [("page", n, "message.delta", data, time.time()) for n in range(ROWS)])
        psycopg_insert, psycopg_select = (re.sub(r"\$\d+", "%s", sql) for sql in (INSERT, SELECT))

        async def asyncpg_insert(i: int) -> None:
            await a.execute(INSERT, "a", i, "message.delta", data, time.time())

        async def psycopg_insert_one(i: int) -> None:
            await p.execute(psycopg_insert, ("p", i, "message.delta", data, time.time()), prepare=True)

        async def asyncpg_page(i: int) -> None:
            assert len(await a.fetch(SELECT, "page")) == ROWS

        async def psycopg_page(i: int) -> None:
            cursor = await p.execute(psycopg_select, ("page",), prepare=True)
            assert len(await cursor.fetchall()) == ROWS

        for warm in (asyncpg_page, psycopg_page):  # statements prepared, caches warm
            for i in range(20):
                await warm(i)
        results: dict[str, dict[str, float]] = {"insert": {}, "select": {}}
        # alternate in blocks, so neither driver gets a quieter moment of the machine
        inserts: dict[str, list[float]] = {"asyncpg": [], "psycopg": []}
        selects: dict[str, list[float]] = {"asyncpg": [], "psycopg": []}
        for block in range(10):
            base = block * INSERTS
            for driver, insert in (("asyncpg", asyncpg_insert), ("psycopg", psycopg_insert_one)):
                inserts[driver].append(await _median_us(lambda i, b=base, f=insert: f(b + i), INSERTS // 10))
            selects["asyncpg"].append(await _median_us(asyncpg_page, SELECTS // 10))
            selects["psycopg"].append(await _median_us(psycopg_page, SELECTS // 10))
        for driver in ("asyncpg", "psycopg"):
            results["insert"][driver] = statistics.median(inserts[driver])
            results["select"][driver] = statistics.median(selects[driver])
        return results
    finally:
        await a.close()
        await p.close()


def report(results: dict[str, dict[str, float]]) -> None:
    print("\nPostgreSQL drivers on 127.0.0.1 (asyncpg vs psycopg 3, one connection each, prepared)")
    labels = {"insert": f"one small INSERT transaction, median of {INSERTS}",
              "select": f"{ROWS}-row SELECT fetched and decoded, median of {SELECTS}"}
    for what, label in labels.items():
        a, p = results[what]["asyncpg"], results[what]["psycopg"]
        print(f"  {label:52} asyncpg {a:>7.1f} µs   psycopg {p:>7.1f} µs   psycopg/asyncpg x{p / a:.2f}")


def main(argv: list[str] | None = None) -> int:
    try:
        import asyncpg  # noqa: F401
        import psycopg  # noqa: F401
    except ImportError as exc:
        print(f"\nPostgreSQL drivers: skipped ({exc.name} is not installed:"
              " pip install asyncpg 'psycopg[binary]')")
        return 0
    from tests.support.postgres import PostgresServer, PostgresUnavailable

    try:
        server = PostgresServer()
    except PostgresUnavailable as exc:
        print(f"\nPostgreSQL drivers: skipped ({exc})")
        return 0
    with server:
        report(asyncio.run(measure(server.create_database())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
