"""Child processes: one argv, without a shell, in a process group of its own.

`run_process` starts a program in a new session, writes `stdin` to it (or
gives it none), reads both pipes to the end while keeping a capped copy, and
waits at most `timeout_s`. When the program ends, times out, or the caller is
cancelled, the whole process group is killed, so nothing it started outlives
the call (that also closes pipes a background child still holds).

It is not responsible for what the output means, for secrets, or for building
argv: command tools and hooks do that.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream, Process


class StartFailed(Exception):
    """The program could not be started; the message names argv[0] and is safe to show."""


@dataclass
class Capture:
    """What one pipe carried: the first `limit` bytes, the last `tail` bytes, the total."""

    limit: int
    tail: int = 0
    head: bytearray = field(default_factory=bytearray)
    last: bytes = b""
    total: int = 0

    async def drain(self, stream: ByteReceiveStream) -> None:
        # Read to the end even past the cap: a writer blocked on a full pipe would never exit.
        async for chunk in stream:
            self.total += len(chunk)
            if len(self.head) < self.limit:
                self.head += chunk[: self.limit - len(self.head)]
            if self.tail:
                self.last = (self.last + chunk)[-self.tail :]

    def text(self) -> str:
        if self.total <= self.limit:
            return bytes(self.head).decode("utf-8", errors="replace")
        kept = bytes(self.head).decode("utf-8", errors="ignore")
        return kept + f"\n[output truncated: {self.total} bytes, limit {self.limit}]"

    def tail_text(self) -> str:
        cut = "[...]\n" if self.total > len(self.last) else ""
        return cut + self.last.decode("utf-8", errors="replace").strip()


@dataclass(frozen=True)
class Finished:
    """How a process ended: its exit code (None if it timed out) and what it printed."""

    returncode: int | None
    stdout: Capture
    stderr: Capture

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    @property
    def status(self) -> str:
        code = self.returncode
        return f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"


async def run_process(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: dict[str, str],
    timeout_s: float,
    output_limit: int,
    stderr_tail: int = 0,
    stdin: bytes | None = None,
) -> Finished:
    """Run `argv` to its end or `timeout_s`; raises StartFailed if it cannot start."""
    out = Capture(output_limit)
    err = Capture(output_limit, tail=stderr_tail)
    process = await _start(argv, cwd, env, piped=stdin is not None)
    swept = False
    try:
        with anyio.move_on_after(timeout_s) as deadline:
            async with anyio.create_task_group() as group:
                if stdin is not None and process.stdin is not None:
                    group.start_soon(_feed, process.stdin, stdin)
                group.start_soon(out.drain, process.stdout)
                group.start_soon(err.drain, process.stderr)
                await process.wait()
                # The leader is done: whatever it left behind in its group goes too,
                # which also closes pipes a background child still holds.
                _kill_group(process.pid)
                swept = True
    finally:
        with anyio.CancelScope(shield=True):
            if not swept:  # timed out or cancelled
                _kill_group(process.pid)
            await process.aclose()
    return Finished(None if deadline.cancelled_caught else process.returncode, out, err)


async def _feed(stream: ByteSendStream, data: bytes) -> None:
    # A program may exit, or close stdin, without reading it all: that is its right.
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        await stream.send(data)
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        await stream.aclose()


async def _start(argv: Sequence[str], cwd: Path, env: dict[str, str], *, piped: bool) -> Process:
    try:
        return await anyio.open_process(
            list(argv),
            stdin=subprocess.PIPE if piped else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
    except FileNotFoundError:
        raise StartFailed(f"program not found: {argv[0]}") from None
    except PermissionError:
        raise StartFailed(f"program is not executable: {argv[0]}") from None
    except OSError as exc:
        raise StartFailed(f"cannot start {argv[0]}: {exc.strerror or exc}") from None


def _kill_group(pgid: int) -> None:
    # start_new_session made the program a session (and group) leader: its pid is the group id.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
