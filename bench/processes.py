"""Process benchmark: what the supervisor (server/tools/reaper.py) adds to every command tool and hook call.

In one process: the median wall time of `run_process(["true"])`, started
directly (the fallback where the supervisor is not available) and through
the supervisor, 200 calls each, measured in alternation so a machine busy
with something else slows both alike. The supervisor is one more
interpreter start (`python -I -S`) per call; target: at most 40 ms more than
the direct start, the ratio printed for reading.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

from server.tools import processes

CALLS = 200
ADDED_TARGET_MS = 40.0


async def one_call(cwd: Path, *, supervised: bool) -> float:
    processes.SUPERVISED = supervised
    started = time.perf_counter()
    finished = await processes.run_process(["true"], cwd=cwd, env={"PATH": "/usr/bin:/bin"}, timeout_s=30,
                                           output_limit=1000)
    took = (time.perf_counter() - started) * 1000
    assert finished.returncode == 0, finished
    return took


async def measure(cwd: Path) -> tuple[list[float], list[float]]:
    direct: list[float] = []
    supervised: list[float] = []
    for _ in range(5):  # warm-up: page cache, first imports
        await one_call(cwd, supervised=True)
        await one_call(cwd, supervised=False)
    for _ in range(CALLS):
        direct.append(await one_call(cwd, supervised=False))
        supervised.append(await one_call(cwd, supervised=True))
    return direct, supervised


def main(argv: list[str] | None = None) -> int:
    if not processes.SUPERVISED:
        print("\nprocesses: no supervisor on this platform (no /proc); nothing to compare")
        return 0
    try:
        with tempfile.TemporaryDirectory(prefix="corral-bench-processes-") as tmp:
            direct, supervised = anyio.run(measure, Path(tmp))
    finally:
        processes.SUPERVISED = True
    base, with_reaper = statistics.median(direct), statistics.median(supervised)
    added = with_reaper - base
    verdict = "PASS" if added <= ADDED_TARGET_MS else "MISS"
    print(f"\nrun_process(['true']) ({CALLS} calls each, alternating, same process)")
    print(f"  {'direct start median':34} {base:>10.2f} ms   baseline")
    print(f"  {'supervised start median':34} {with_reaper:>10.2f} ms   x{with_reaper / base:.2f}   "
          f"+{added:.2f} ms   target <= +{ADDED_TARGET_MS:g} ms   {verdict}")
    return 1 if verdict == "MISS" and "--check" in (argv or []) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
