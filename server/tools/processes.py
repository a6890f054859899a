"""Child processes: one argv, without a shell, whose whole process tree dies with the call.

`run_process` starts a program in a new session, writes `stdin` to it (or
gives it none), reads both pipes to the end while keeping a capped copy, and
waits at most `timeout_s`. When the program ends, times out, or the caller is
cancelled, everything it started is killed, children that left its process
group (`setsid`) included, and that also closes pipes a background child
still holds. On Linux the program runs under server/tools/reaper.py, a supervisor
that is a child subreaper and dies with the server, so the tree goes even
when the server is SIGKILLed; elsewhere (no /proc) it runs directly and only
its process group is killed.

It is not responsible for what the output means, for secrets, or for building
argv: command tools and hooks do that.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream, Process

REAPER = Path(__file__).resolve().with_name("reaper.py")
SUPERVISED = sys.platform == "linux" and Path("/proc/self/stat").exists()
STOP_GRACE_S = 2.0  # for the supervisor to kill the tree once asked; its group is SIGKILLed after


class StartFailed(Exception):
    """The program could not be started; the message names argv[0] and is safe to show.

    A control-flow signal: a command tool shows it as its error output, a hook as its failure."""


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
    process, status = await _start(argv, cwd, env, piped=stdin is not None)
    ended = False
    try:
        with anyio.move_on_after(timeout_s) as deadline:
            if status is not None:
                await _started(status, argv[0])
            async with anyio.create_task_group() as group:
                if stdin is not None and process.stdin is not None:
                    group.start_soon(_feed, process.stdin, stdin)
                group.start_soon(out.drain, process.stdout)
                group.start_soon(err.drain, process.stderr)
                await process.wait()
                # The supervisor has killed the tree by now; without one, this is what kills
                # whatever the leader left in its group (which also closes pipes it still holds).
                _kill_group(process.pid)
                ended = True
    finally:
        with anyio.CancelScope(shield=True):
            if status is not None:
                os.close(status)
            if not ended:  # timed out, cancelled, or it could not start
                await _stop(process, supervised=status is not None)
            await process.aclose()
    return Finished(None if deadline.cancelled_caught else process.returncode, out, err)


async def _feed(stream: ByteSendStream, data: bytes) -> None:
    # A program may exit, or close stdin, without reading it all: that is its right.
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        await stream.send(data)
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        await stream.aclose()


async def _start(argv: Sequence[str], cwd: Path, env: dict[str, str], *,
                 piped: bool) -> tuple[Process, int | None]:
    """The process and, when supervised, the read end of the supervisor's status pipe."""
    if not SUPERVISED:
        return await _open(argv, list(argv), cwd, env, piped=piped), None
    status, report = os.pipe()
    try:
        command = supervised(argv, env, str(report))
        process = await _open(argv, command, cwd, env, piped=piped, pass_fds=(report,))
    except BaseException:
        os.close(status)
        raise
    finally:
        os.close(report)  # the supervisor holds the only write end now: EOF is its answer
    return process, status


def supervised(argv: Sequence[str], env: dict[str, str], status: str = "-") -> list[str]:
    """`argv` run under the supervisor (reaper.py), by a process this one starts with `env`; `status` is
    the supervisor's STATUS_FD (`-`: none, a start failure is written to stderr)."""
    lc_ctype = f"LC_CTYPE={env['LC_CTYPE']}" if "LC_CTYPE" in env else ""
    return [sys.executable, "-I", "-S", str(REAPER), status, str(os.getpid()), lc_ctype, *argv]


def locate(program: str, path: str | None, cwd: Path) -> str:
    """Where `program` is, as an exec from `cwd` with PATH `path` finds it; the OSError that exec would
    raise when it is nowhere (for a caller that must say so before the supervisor starts)."""
    if os.sep in program:
        found = cwd / program
        if not found.is_file():
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
        if not os.access(found, os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)
        return str(found)
    found_on_path = shutil.which(program, path=path)
    if found_on_path is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
    return str(Path(found_on_path).absolute())


async def _open(argv: Sequence[str], command: list[str], cwd: Path, env: dict[str, str], *, piped: bool,
                pass_fds: tuple[int, ...] = ()) -> Process:
    try:
        return await anyio.open_process(
            command,
            stdin=subprocess.PIPE if piped else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=env,
            start_new_session=True,
            pass_fds=pass_fds,
        )
    except OSError as exc:
        raise _start_failed(argv[0], exc) from None


async def _started(status: int, program: str) -> None:
    """Returns once the supervisor has started the program; StartFailed with its reason if it could not."""
    os.set_blocking(status, False)
    report = b""
    while True:
        await anyio.wait_readable(status)
        try:
            chunk = os.read(status, 4096)
        except BlockingIOError:
            continue
        if not chunk:
            break
        report += chunk
    if report:
        number, _, reason = report.decode("utf-8", errors="replace").partition(" ")
        raise _start_failed(program, OSError(int(number), reason))


def _start_failed(program: str, exc: OSError) -> StartFailed:
    # OSError(errno, ...) is built as its subclass, so a supervisor's report maps as a direct start's does.
    if isinstance(exc, FileNotFoundError):
        return StartFailed(f"program not found: {program}")
    if isinstance(exc, PermissionError):
        return StartFailed(f"program is not executable: {program}")
    return StartFailed(f"cannot start {program}: {exc.strerror or exc}")


async def _stop(process: Process, *, supervised: bool) -> None:
    if supervised:
        # The supervisor kills the whole tree, setsid children included, which a group kill misses.
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        with anyio.move_on_after(STOP_GRACE_S):
            await process.wait()
    _kill_group(process.pid)


def _kill_group(pgid: int) -> None:
    # start_new_session made the process a session (and group) leader: its pid is the group id.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
