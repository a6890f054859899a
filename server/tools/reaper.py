"""The supervisor every command tool and hook runs under on Linux: the tool's process tree dies with it.

    python -I -S reaper.py STATUS_FD PARENT_PID LC_CTYPE PROGRAM [ARG...]

server/tools/processes.py starts it (in a session of its own, cwd and environment
already the tool's). It makes itself a child subreaper, so every orphan of
the tree is re-parented to it, `setsid` or not, and asks for a signal when
its parent dies. It starts PROGRAM (PATH lookup in its own environment) on
its stdin, stdout and stderr, then lets go of them, so the pipes reach their
end once nothing of the tree is left. When PROGRAM exits, on SIGTERM, SIGINT
or SIGHUP, or when the server dies, it SIGKILLs every process below it until
none remains, then exits as PROGRAM did (a signal death is reproduced).

STATUS_FD is the write end of a pipe: a start failure is written to it as
"ERRNO STRERROR" (exit 127); it is closed once PROGRAM runs. It is `-` when
the caller cannot pass a pipe (an MCP stdio server, which the mcp SDK
spawns): a start failure is then a line on stderr. LC_CTYPE is
"LC_CTYPE=value" as the caller's environment had it, or empty when unset:
Python's start may set it (C locale coercion, PEP 538), and PROGRAM gets
the environment exactly as given.

It is not responsible for time-outs, output or the environment: the server
decides those. It is stdlib-only and imports only what loads fast (`_signal`,
`_ctypes`, not `signal` or `ctypes`, which pull in enum and more), because it
starts once per tool call; it must not import anything from this package.
"""

from __future__ import annotations

import _ctypes
import _signal
import os
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PARENT_DIED = _signal.SIGUSR1
STOP = {_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP}
WATCHED = {_signal.SIGCHLD, PARENT_DIED, *STOP}
# Python ignores these at start; the program gets them back at their default, as subprocess does.
RESTORED = (_signal.SIGPIPE, _signal.SIGXFSZ)
SWEEP_BOUND_S = 5.0  # a descendant it may not kill (setuid) is left behind rather than waited on forever
RESCAN_S = 0.05  # a process forked while the tree was being killed shows up at the next scan


def main(argv: list[str]) -> None:
    status_fd = None if argv[1] == "-" else int(argv[1])
    parent, lc_ctype, program = int(argv[2]), argv[3], argv[4:]
    # Blocked from the start, so none of them is lost before it is waited on.
    _signal.pthread_sigmask(_signal.SIG_BLOCK, WATCHED)
    prctl = _prctl()
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    prctl(PR_SET_PDEATHSIG, PARENT_DIED)
    if os.getppid() != parent:  # the server died before the death signal was armed
        os._exit(1)
    leader = _start(program, _environment(lc_ctype), status_fd)
    if leader is None:
        os._exit(127)
    _let_go_of_stdio()
    status = _sweep(leader, _watch(leader, parent))
    prctl(PR_SET_DUMPABLE, 0)  # re-raising SIGSEGV or SIGABRT must not leave a core of this interpreter
    _exit_as(status)


class _Int(_ctypes._SimpleCData):
    _type_ = "i"


class _ULong(_ctypes._SimpleCData):  # prctl reads its arguments as unsigned long
    _type_ = "L"


class _LibcFunction(_ctypes.CFuncPtr):
    """prctl(option, value); -1 on failure, which leaves a best effort (no subreaper, no death signal)."""

    _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
    _restype_ = _Int
    _argtypes_ = (_Int, _ULong)


def _prctl() -> _LibcFunction:
    return _LibcFunction(_ctypes.dlsym(_ctypes.dlopen(None, os.RTLD_NOW), "prctl"))


def _environment(lc_ctype: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("LC_CTYPE", None)
    if lc_ctype:
        env["LC_CTYPE"] = lc_ctype.partition("=")[2]
    return env


def _start(program: list[str], env: dict[str, str], status_fd: int | None) -> int | None:
    if status_fd is not None:
        os.set_inheritable(status_fd, False)  # the program must not hold it: its end is the "started" signal
    try:
        return os.posix_spawnp(program[0], program, env, setsigmask=(), setsigdef=RESTORED)
    except OSError as exc:
        if status_fd is None:
            os.write(2, f"cannot start {program[0]}: {exc.strerror or exc}\n".encode())
        else:
            os.write(status_fd, f"{exc.errno or 0} {exc.strerror or exc}".encode())
        return None
    finally:
        if status_fd is not None:
            os.close(status_fd)


def _let_go_of_stdio() -> None:
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


def _watch(leader: int, parent: int) -> int | None:
    """The leader's wait status once it exits; None when told to stop or when the server is gone."""
    while True:
        signo = _signal.sigwaitinfo(WATCHED).si_signo
        if signo in STOP:
            return None
        if signo == PARENT_DIED:
            if os.getppid() != parent:
                return None
            continue  # only the server thread that started it ended: the server lives on
        status, _ = _reap(leader, None)
        if status is not None:
            return status


def _reap(leader: int, status: int | None) -> tuple[int | None, bool]:
    """Collect every exited child; the leader's status (or `status`), and whether any child is left."""
    while True:
        try:
            pid, code = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return status, False
        if pid == 0:
            return status, True
        if pid == leader:
            status = code


def _sweep(leader: int, status: int | None) -> int | None:
    # Every descendant descends from a child of this subreaper: with no child left, nothing is left.
    status, left = _reap(leader, status)
    deadline = time.monotonic() + SWEEP_BOUND_S
    while left and time.monotonic() < deadline:
        for pid in _descendants(os.getpid()):
            try:  # noqa: SIM105 -- contextlib would add its imports to every tool call's start
                os.kill(pid, _signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        _signal.sigtimedwait({_signal.SIGCHLD}, RESCAN_S)
        status, left = _reap(leader, status)
    return status


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                # The name in parentheses may hold spaces or ")": the fields after the last ")" are safe.
                ppid = int(stat.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append(int(name))
    found, todo = [], [root]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def _exit_as(status: int | None) -> None:
    if status is None:  # the leader outlived the sweep: it could not be killed
        os._exit(1)
    if os.WIFSIGNALED(status):
        signo = os.WTERMSIG(status)
        if signo != _signal.SIGKILL:  # which cannot be handled, so is at its default already
            _signal.signal(signo, _signal.SIG_DFL)
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, {signo})
        os.kill(os.getpid(), signo)
        os._exit(128 + signo)  # a signal whose default is not to terminate
    os._exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main(sys.argv)
