"""Traces benchmark: server CPU per turn with tracing off, and with spans exported to a local receiver.

The same one-agent tree on the instant fake model of `bench.runtime`, served by two (or three)
`corral serve` processes side by side: `off` (no OTEL_* variables: no exporter is built), `on`
(OTEL_EXPORTER_OTLP_ENDPOINT naming a real OTLP/HTTP receiver on loopback, the one the tests use),
and, with `--baseline REV`, `REV` (that commit's tree, from `git archive`, run the same way: what
tracing off costs against the code before it). Sequential non-streaming turns are sent to each in
turn, `ROUND` at a time, round after round, so a machine busy with something else slows all alike;
each server's CPU (/proc) over its own turns, per turn, is the figure. Targets: `on` at most +15 %
over `off`; `off` within noise of the baseline (printed, not checked: noise on a shared machine is
wider than any target one could set).
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from bench.runtime import (
    ROOT,
    Proc,
    _client,
    corral_turn,
    create_many,
    start_corral,
    start_fake,
    write_definitions,
)

ROUNDS = 20
ROUND = 20  # turns sent to one server before the next gets its own
WARMUP = 20
ON_TARGET = 1.15


def baseline_tree(rev: str, into: Path) -> Path:
    """The repository at `rev`, unpacked (nothing in this checkout changes)."""
    archive = into / "baseline.tar"
    subprocess.run(["git", "archive", "--format=tar", "-o", str(archive), rev], cwd=ROOT, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")
    return into / "tree"


def start_at(tree: Path, definitions: Path, work: Path, name: str, env: dict[str, str]) -> tuple[Proc, str]:
    """`corral serve` from `tree`'s code (its cwd and PYTHONPATH), under `work/name`."""
    import bench.runtime as runtime

    (work / name).mkdir()
    original = runtime.ROOT  # start_corral runs the server from runtime.ROOT: here, from `tree`
    runtime.ROOT = tree
    try:
        return start_corral(definitions, work / name, None, name=name, env={"PYTHONPATH": str(tree), **env})
    finally:
        runtime.ROOT = original


async def measure(servers: dict[str, tuple[Proc, str]]) -> dict[str, float]:
    """CPU seconds per turn of each server, over alternated rounds of sequential turns."""
    clients = {name: _client(base) for name, (_, base) in servers.items()}
    conversations = {name: await create_many(client, ROUNDS * ROUND + WARMUP)
                     for name, client in clients.items()}
    for name, client in clients.items():
        for conversation in conversations[name][:WARMUP]:
            await corral_turn(client, conversation)
    used = dict.fromkeys(servers, 0.0)
    for round_ in range(ROUNDS):
        for name, (proc, _) in servers.items():
            mine = conversations[name][WARMUP + round_ * ROUND:WARMUP + (round_ + 1) * ROUND]
            before = proc.cpu()
            for conversation in mine:
                await corral_turn(clients[name], conversation)
            used[name] += proc.cpu() - before
    for client in clients.values():
        await client.aclose()
    return {name: seconds / (ROUNDS * ROUND) for name, seconds in used.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench traces", description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", metavar="REV", help="also run the code of this commit, tracing off")
    parser.add_argument("--check", action="store_true", help="exit 1 when `on` misses its target")
    args, _ = parser.parse_known_args(argv)
    sys.path.insert(0, str(ROOT))
    from tests.support.otlp import OtlpReceiver

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="corral-bench-traces-") as tmp, OtlpReceiver() as receiver:
        work = Path(tmp)
        fake, fake_url = start_fake()
        servers: dict[str, tuple[Proc, str]] = {}
        try:
            defs = write_definitions(work / "defs", fake_url)
            if args.baseline:
                tree = baseline_tree(args.baseline, work)
                servers[args.baseline] = start_at(tree, defs, work, "baseline", {})
            servers["off"] = start_at(ROOT, defs, work, "off", {})
            servers["on"] = start_at(ROOT, defs, work, "on", {
                "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "200"})
            per_turn = asyncio.run(measure(servers))
        finally:
            for proc, _ in servers.values():
                proc.stop()
            fake.stop()
        spans = len(receiver.spans)
    off, on = per_turn["off"], per_turn["on"]
    print(f"\ntraces benchmark: server CPU per sequential turn, {ROUNDS} alternated rounds of {ROUND}")
    for name, seconds in per_turn.items():
        ratio = f"{seconds / off:.2f}x off" if name != "off" else ""
        print(f"  {name:<12} {seconds * 1000:7.3f} ms  {ratio}")
    ok = on <= off * ON_TARGET
    print(f"  tracing on: {on / off - 1:+.0%} CPU per turn (target <= +{ON_TARGET - 1:.0%}): "
          f"{'PASS' if ok else 'MISS'}; {spans} spans received; "
          f"whole run {time.perf_counter() - started:.1f}s")
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
