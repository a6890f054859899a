"""A real Corral for a test, on loopback: in this process, or as a `corral serve` child process.

    with corral_server(defs, state) as url:      # uvicorn on 127.0.0.1, a free port, in a thread
        ...

    app = corral_app(defs, state)                # white-box: the same, with the app at hand
    with serving(app) as url:
        app.state.service ...

    with ServerProcess(defs, state, env={"CORRAL_LOG_FORMAT": "json"}) as server:
        httpx.get(server.url + "/healthz")       # for what only a process shows: signals, logs, exits
        server.terminate()                       # SIGTERM, then wait (bounded) for the exit
    server.stderr                                # everything it logged

In process, the watcher is off unless a test asks (`watch=True`). The child
binds port 0; its address is read from uvicorn's "running on" line, so there
is no race for a free port. Its stderr is read by a thread that keeps every
line and wakes waiters, so every wait is on a condition, bounded. Leaving the
block kills the process if it is still alive.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from starlette.applications import Starlette

from server.http import create_app
from server.settings import Settings
from tests.fakes.uvicorn_thread import serve
from tests.support.trees import shipped_definitions

REPO = Path(__file__).resolve().parents[2]
# The repository's definitions/ as committed, copied once per test run (removed at exit): the tests
# that serve "the shipped definitions" never see what a user added to or changed in their checkout.
_SHIPPED = Path(tempfile.mkdtemp(prefix="corral-shipped-"))
atexit.register(shutil.rmtree, _SHIPPED, ignore_errors=True)
REPO_DEFINITIONS = shipped_definitions(REPO, _SHIPPED / "definitions")
RUNNING = re.compile(r"running on (http://[0-9.]+:\d+)")


def corral_app(definitions: Path, state_dir: Path, **settings: Any) -> Starlette:
    """Corral's ASGI app on `definitions` and `state_dir` (no watcher unless `watch=True`)."""
    return create_app(Settings(definitions=definitions, state_dir=state_dir, **({"watch": False} | settings)))


@contextmanager
def serving(app: Starlette, *, host: str = "127.0.0.1") -> Iterator[str]:
    """`app` on a real uvicorn on `host`, a free port, until the block ends; yields its base URL."""
    with serve(app, host=host, graceful_s=5.0) as base_url:
        yield base_url


@contextmanager
def corral_server(definitions: Path, state_dir: Path, *, host: str = "127.0.0.1",
                  **settings: Any) -> Iterator[str]:
    """A real Corral in this process (see `corral_app`, `serving`); yields its base URL."""
    with serving(corral_app(definitions, state_dir, host=host, **settings), host=host) as base_url:
        yield base_url


def clean_environ(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without any CORRAL_* setting (nor an OTEL_* one: a developer's own
    collector gets no test's spans), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "OTEL_"))}
    return env | {"PYTHONUNBUFFERED": "1"} | (extra or {})


class ServerProcess:
    """`corral serve DEFINITIONS` as a child process, its stderr kept line by line."""

    def __init__(self, definitions: Path, state_dir: Path, *, env: dict[str, str] | None = None,
                 args: Sequence[str] = ("--no-watch",), host: str = "127.0.0.1"):
        self.argv = [sys.executable, "-m", "server.cli", "serve", str(definitions),
                     "--host", host, "--port", "0", *args]
        self.env = clean_environ({"CORRAL_STATE_DIR": str(state_dir)} | (env or {}))
        self.lines: list[str] = []
        self.closed = False  # stderr reached its end
        self._changed = threading.Condition()
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    def launch(self) -> ServerProcess:
        """Start the process without waiting (several servers can then start side by side)."""
        self.proc = subprocess.Popen(self.argv, cwd=REPO, env=self.env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, daemon=True).start()
        return self

    def start(self, timeout_s: float = 30.0) -> ServerProcess:
        """Launch (unless launched) and wait for the address; raises if it exits first or takes too long."""
        if self.proc is None:
            self.launch()
        line = self.wait_for_line(lambda text: RUNNING.search(text) is not None, timeout_s)
        if line is None:
            self.kill()
            raise RuntimeError(f"corral serve did not start within {timeout_s}s:\n{self.stderr}")
        match = RUNNING.search(line)
        assert match is not None
        self.url = match.group(1).replace("0.0.0.0", "127.0.0.1")  # a wildcard bind is reached on loopback
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self.closed = True  # so waiters stop waiting
            self._changed.notify_all()

    @property
    def stderr(self) -> str:
        with self._changed:
            return "\n".join(self.lines)

    def wait_for_line(self, match: Callable[[str], bool], timeout_s: float) -> str | None:
        """The first stderr line `match` accepts; None if the stream ends or time runs out first."""
        seen = 0

        def found() -> bool:
            nonlocal seen
            while seen < len(self.lines):
                if match(self.lines[seen]):
                    return True
                seen += 1
            return self.closed

        with self._changed:
            ok = self._changed.wait_for(found, timeout_s)
            return self.lines[seen] if ok and seen < len(self.lines) else None

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout_s: float) -> int:
        assert self.proc is not None
        code = self.proc.wait(timeout_s)
        with self._changed:  # the reader thread has the last lines once the pipe closes
            self._changed.wait_for(lambda: self.closed, 5.0)
        return code

    def terminate(self, timeout_s: float = 15.0) -> int:
        self.signal(signal.SIGTERM)
        return self.wait(timeout_s)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> ServerProcess:
        return self if self.url else self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()
