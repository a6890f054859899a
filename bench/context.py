"""Context benchmark: what a turn costs in a long conversation, against a short one.

Context accounting must be incremental (issue 15): each message is estimated
once, into running sums, and a compacted view is reused, so a turn of a
500-turn conversation should cost about what a turn of a 5-turn one does
(target: within 1.5x). One `corral` service runs in this process on a fresh
SQLite state directory, serving one agent on the offline `scripted` model
with a `context_window` (so every turn is managed, and the long conversation
is compacted along the way, its summaries written by the same model).

Figures, CPU time of this process per turn (a machine busy with other work
slows wall time far more than CPU time), medians over every turn of 30
5-turn conversations and over the last `--sample` turns of one 500-turn
conversation:
- the whole turn (`send` to its result: admission, the store's writes, the
  loop, the model), and the ratio long / short;
- the context work alone within it (the turn's window: syncing the ledger,
  counting the request, building the view), measured the same way.

The window (2,000 tokens) keeps the long conversation's view near the size
of a short conversation's (5 to 14 turns between compactions), so the
ratio shows what the conversation's length costs, not what a bigger request
costs.

`--check` exits 1 when the whole-turn ratio is above the target.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

TARGET = 1.5
SHORT, LONG = 5, 500
SHORT_CONVERSATIONS = 30  # 5-turn conversations: every turn of each is a sample
SAMPLE = 100  # the long conversation's last turns
WORDS = "lorem ipsum dolor sit amet " * 8  # about 220 characters a message: 55 tokens
WINDOW = 2000  # tokens: a view of about 5 to 14 turns, compacted every 8 turns or so

DEFINITIONS = f"""
kind: Model
name: offline
provider: scripted
context_window: {WINDOW}
max_output_tokens: 200
default: "noted: {WORDS.strip()}"
---
kind: Agent
name: bench
model: offline
instructions: Answer briefly.
context: {{ threshold: 0.8, keep_recent_turns: 2 }}
"""


class Timed:
    """CPU seconds spent in the wrapped coroutine functions, per call, in order."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    def wrap(self, function: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.process_time()
            try:
                return await function(*args, **kwargs)
            finally:
                self.calls.append(time.process_time() - started)

        return timed


class Turns:
    """Runs turns in one service, timing each (CPU seconds of this process) and its context work."""

    def __init__(self, service: Any):
        from server.runtime import context_window as context_module

        self.conversations = service.conversations
        self.window, self.prepare = Timed(), Timed()
        contexts = self.conversations.contexts
        contexts.window = self.window.wrap(contexts.window)
        self.restore = context_module.ContextWindow.prepare
        context_module.ContextWindow.prepare = self.prepare.wrap(self.restore)  # type: ignore[method-assign]

    def close(self) -> None:
        from server.runtime import context_window as context_module

        context_module.ContextWindow.prepare = self.restore  # type: ignore[method-assign]

    async def conversation(self, turns: int) -> tuple[list[float], list[float], int]:
        """Every turn's CPU seconds, its context work's, and the compactions at the end."""
        record = await self.conversations.create("bench", None, {})
        whole: list[float] = []
        context: list[float] = []
        for n in range(turns):
            windows, prepares = len(self.window.calls), len(self.prepare.calls)
            started = time.process_time()
            turn = await self.conversations.send(record.id, f"message {n}: {WORDS}")
            result = await self.conversations.result(turn)
            whole.append(time.process_time() - started)
            assert result.completed, result.error
            context.append(sum(self.window.calls[windows:]) + sum(self.prepare.calls[prepares:]))
        return whole, context, (await self.conversations.context(record.id))["compactions"]


async def measure(root: Path, sample: int) -> dict[str, Any]:
    from server.service import open_service
    from server.settings import Settings

    (root / "defs").mkdir(parents=True)
    (root / "defs" / "bench.yaml").write_text(DEFINITIONS)
    settings = Settings(definitions=root / "defs", state_dir=root / "state", watch=False)
    async with open_service(settings) as service:
        turns = Turns(service)
        try:
            await turns.conversation(SHORT)  # warm-up: imports, caches, the first statements
            short_whole: list[float] = []
            short_context: list[float] = []
            for _ in range(SHORT_CONVERSATIONS):
                whole, context, _ = await turns.conversation(SHORT)
                short_whole += whole
                short_context += context
            long_whole, long_context, compactions = await turns.conversation(LONG)
        finally:
            turns.close()
    return {"short": (statistics.median(short_whole), statistics.median(short_context)),
            "long": (statistics.median(long_whole[-sample:]), statistics.median(long_context[-sample:])),
            "compactions": compactions}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench context", description=__doc__.split("\n")[0])
    parser.add_argument("--sample", type=int, default=SAMPLE, help="the long conversation's last turns timed")
    parser.add_argument("--check", action="store_true", help="exit 1 when the target is missed")
    args, _ = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory(prefix="corral-bench-context-") as tmp:
        figures = anyio.run(measure, Path(tmp), args.sample)
    (short_turn, short_context), (long_turn, long_context) = figures["short"], figures["long"]
    ratio = long_turn / short_turn
    print(f"\nContext accounting (scripted model, context_window {WINDOW}; CPU per turn, medians: every "
          f"turn of {SHORT_CONVERSATIONS} {SHORT}-turn conversations, the last {args.sample} of a "
          f"{LONG}-turn one)")
    print(f"  {f'turn of a {SHORT}-turn conversation':44} {short_turn * 1000:>8.3f} ms   baseline")
    print(f"  {f'turn of a {LONG}-turn conversation':44} {long_turn * 1000:>8.3f} ms   x{ratio:.2f}"
          f"   (target <= x{TARGET}; compacted {figures['compactions']} times)")
    print(f"  {'  of which context work, short':44} {short_context * 1000:>8.3f} ms")
    print(f"  {'  of which context work, long':44} {long_context * 1000:>8.3f} ms"
          f"   x{long_context / max(short_context, 1e-9):.2f}")
    missed = ratio > TARGET
    if missed:
        print(f"\ntarget missed: a long conversation's turn costs x{ratio:.2f} a short one's")
    return 1 if missed and args.check else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
