"""Store benchmark: what running SQLite on the event loop costs, and what a thread hop would cost.

The SQLite store runs its statements synchronously inside `async def`
methods, on the event loop thread. This measures, in one process on a
temporary database:

- a small write (`append_event`) on the loop, against the same write sent
  to a worker thread (`anyio.to_thread.run_sync`, on a connection of its
  own): the ratio says whether a hop would pay for itself;
- the event loop's stall while a large transcript page is read on the loop
  (`list_messages`, 1,000 messages of 2 kB): a ticker task that wants to run
  every millisecond records the longest gap, which is how long every other
  conversation waits.

No target: the figures decide whether (and which) statements move off the
loop; the closing note of the structure issue gives them.
"""

from __future__ import annotations

import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

from server.messages import UserMessage
from server.store.base import ConversationRecord
from server.store.sqlite import SQLiteStore

WRITES = 500
PAGES = 20
MESSAGES, MESSAGE_BYTES = 5_000, 2_000


async def small_writes(store: SQLiteStore, path: Path) -> tuple[list[float], list[float]]:
    on_loop, hopped = [], []
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("PRAGMA busy_timeout = 5000")

    def write_in_thread(seq: int) -> None:
        other.execute("BEGIN IMMEDIATE")
        other.execute("INSERT INTO events (conversation_id, seq, name, data, created_at)"
                      " VALUES (?, ?, ?, ?, ?)", ("c-thread", seq, "bench", "{}", time.time()))
        other.execute("COMMIT")

    for i in range(WRITES):
        started = time.perf_counter()
        await store.append_event("c-loop", "bench", {"i": i}, time.time())
        on_loop.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        await anyio.to_thread.run_sync(write_in_thread, i + 1)
        hopped.append((time.perf_counter() - started) * 1000)
    other.close()
    return on_loop, hopped


async def page_stall(store: SQLiteStore) -> tuple[float, float]:
    """(median page read in ms, longest gap a 1 ms ticker saw in ms)."""
    longest = 0.0
    reads: list[float] = []

    async def ticker() -> None:
        nonlocal longest
        last = time.perf_counter()
        while True:
            await anyio.sleep(0.001)
            now = time.perf_counter()
            longest = max(longest, (now - last) * 1000)
            last = now

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        await anyio.sleep(0.01)
        for page in range(PAGES):
            started = time.perf_counter()
            await store.list_messages("c-loop", limit=1000, after=page * 200)
            reads.append((time.perf_counter() - started) * 1000)
            await anyio.sleep(0.005)
        tg.cancel_scope.cancel()
    return statistics.median(reads), longest


async def measure(directory: Path) -> None:
    path = directory / "bench.db"
    store = SQLiteStore(path)
    await store.open()
    for cid in ("c-loop", "c-thread"):
        record = ConversationRecord(id=cid, agent="a", agent_name="a", digest="sha256:0", pinned=False,
                                    created_at=time.time(), updated_at=time.time())
        await store.create_conversation(record)
    text = "x" * MESSAGE_BYTES
    for _ in range(0, MESSAGES, 500):
        await store.append_messages("c-loop", "t", [UserMessage(content=text)] * 500, time.time())
    on_loop, hopped = await small_writes(store, path)
    page_ms, stall_ms = await page_stall(store)
    await store.close()
    loop_ms, hop_ms = statistics.median(on_loop), statistics.median(hopped)
    print(f"\nSQLite on the event loop ({WRITES} small writes each, alternating; {MESSAGES} stored messages)")
    print(f"  {'append_event on the loop, median':44} {loop_ms:>8.3f} ms   baseline")
    print(f"  {'same write via a worker thread, median':44} {hop_ms:>8.3f} ms   x{hop_ms / loop_ms:.2f}")
    print(f"  {'list_messages page (1000 x 2 kB), median':44} {page_ms:>8.3f} ms")
    print(f"  {'longest event-loop stall meanwhile':44} {stall_ms:>8.3f} ms   (1 ms ticker)")


def main(argv: list[str] | None = None) -> int:
    with tempfile.TemporaryDirectory(prefix="corral-bench-store-") as tmp:
        anyio.run(measure, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
