"""The socket `corral serve` listens on, bound before anything starts, so a taken port is one line.

uvicorn binds only after the app's lifespan has started (the whole service,
its recovery included) and reports a failure as log lines; binding here
first makes a taken or forbidden address a `CorralError` that `main` prints
as one `error:` line. uvicorn is then given the bound socket.
"""

from __future__ import annotations

import errno
import socket

from ..errors import CorralError

WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}  # reached on this machine by loopback


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (not yet listening: uvicorn does that); one clear error if not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: TIME_WAIT is no obstacle
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if exc.errno == errno.EADDRINUSE:
            raise CorralError(f"cannot listen on {where}: the address is already in use (another server "
                              "listens there: stop it, or pass --port / set CORRAL_PORT)",
                              code="in_use") from None
        raise CorralError(f"cannot listen on {where}: {exc.strerror or exc}",
                          code="invalid_request") from None
    return sock


def url_of(sock: socket.socket, *, reachable: bool = False) -> str:
    """The base URL of a bound socket; `reachable`: the one that reaches it from this machine (a
    wildcard address as loopback)."""
    host, port = sock.getsockname()[:2]
    if reachable:
        host = WILDCARDS.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
