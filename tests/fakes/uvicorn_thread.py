"""Run an ASGI app with a real uvicorn on loopback, in a background thread.

    with serve(app) as base_url:
        ...  # http://127.0.0.1:PORT, already accepting connections

The socket is bound before the server starts (port 0, so no race for a free
port), startup is awaited on an event (never a fixed sleep), and leaving the
block stops the server: requests still running get `graceful_s` to finish and
are cancelled after that. Every wait is bounded; a server that fails to start
or to stop raises `RuntimeError` instead of hanging the test run.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn


class _Server(uvicorn.Server):
    """uvicorn's server, with an event set once startup has finished (or failed)."""

    def __init__(self, config: uvicorn.Config):
        super().__init__(config)
        self.ready = threading.Event()
        self.failure: BaseException | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.ready.set()

    def run_in_thread(self, sock: socket.socket) -> None:
        try:
            self.run(sockets=[sock])
        except BaseException as exc:  # uvicorn exits with SystemExit when the app's startup fails
            self.failure = exc
        finally:
            self.ready.set()


@contextmanager
def serve(
    app: Any,
    *,
    host: str = "127.0.0.1",
    startup_timeout_s: float = 10.0,
    graceful_s: float = 2.0,
    stop_timeout_s: float = 10.0,
    **config: Any,
) -> Iterator[str]:
    """Serve `app` on a free port of `host` until the block ends; yields the base URL."""
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted sockets only then (else ~40 ms a request)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    options: dict[str, Any] = {"log_config": None, "access_log": False, "lifespan": "auto"} | config
    server = _Server(
        uvicorn.Config(app, host=host, port=port, timeout_graceful_shutdown=graceful_s, **options)
    )
    thread = threading.Thread(target=server.run_in_thread, args=(sock,), name=f"uvicorn:{port}", daemon=True)
    thread.start()
    try:
        if not server.ready.wait(startup_timeout_s):
            raise RuntimeError(f"uvicorn on port {port} did not start within {startup_timeout_s}s")
        if not server.started:
            raise RuntimeError(f"uvicorn on port {port} failed to start") from server.failure
        yield f"http://{host}:{port}"
    finally:
        stopped = _stop(server, thread, stop_timeout_s)
        sock.close()
    if not stopped:
        raise RuntimeError(f"uvicorn on port {port} did not stop within {stop_timeout_s}s")


def _stop(server: _Server, thread: threading.Thread, timeout_s: float) -> bool:
    server.should_exit = True
    thread.join(timeout_s)
    if thread.is_alive():  # still waiting on connections: stop waiting
        server.force_exit = True
        thread.join(timeout_s)
    return not thread.is_alive()
