"""The verbs that serve agents: `corral serve` (HTTP) and `corral mcp` (stdio); `corral chat` is `chat`'s."""

from __future__ import annotations

import argparse
import gc
import logging
import socket
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio

from .. import logs
from ..errors import CorralError
from ..settings import Settings, is_loopback
from .listening import listen, url_of

if TYPE_CHECKING:
    from ..store.ownership import Claim


def add_serve_verb(verbs: argparse._SubParsersAction,
              add_dir: Callable[[argparse.ArgumentParser], None]) -> None:
    serve = verbs.add_parser(
        "serve", help="serve a definition directory over HTTP (MCP at /mcp)",
        description="Serve a definition directory over HTTP, with hot reload.",
    )
    add_dir(serve)
    serve.add_argument("--host", help="bind address (default $CORRAL_HOST or 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default $CORRAL_PORT or 8420)")
    serve.add_argument("--no-watch", action="store_true", help="do not reload when files change")
    serve.add_argument("--locked", action="store_true", help="refuse digests that differ from corral.lock")
    serve.add_argument("--require-evals", action="store_true",
                       help="with --locked: also refuse an agent whose Evals corral.lock records no passing "
                            "run of (or set CORRAL_REQUIRE_EVALS=1)")
    serve.add_argument("--eval-on-swap", action="store_true",
                       help="run the affected Evals after each applied swap, in the background "
                            "(or set CORRAL_EVAL_ON_SWAP=1)")
    serve.add_argument("--insecure", action="store_true",
                       help="allow a non-loopback bind without CORRAL_API_KEYS (dangerous)")
    serve.set_defaults(func=cmd_serve)


def add_mcp_verb(verbs: argparse._SubParsersAction,
                 add_dir: Callable[[argparse.ArgumentParser], None]) -> None:
    mcp = verbs.add_parser(
        "mcp", help="serve the agents as an MCP server over stdio",
        description="Serve the agents as an MCP server over stdio (for Claude Desktop, Cursor, ...).",
    )
    add_dir(mcp)
    mcp.add_argument("--no-watch", action="store_true", help="do not reload when files change")
    mcp.set_defaults(func=cmd_mcp)


def settings_from(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    if getattr(args, "dir", None):
        overrides["definitions"] = args.dir
    for name in ("host", "port"):
        if getattr(args, name, None) is not None:
            overrides[name] = getattr(args, name)
    if getattr(args, "no_watch", False):
        overrides["watch"] = False
    for flag in ("locked", "require_evals", "eval_on_swap"):
        if getattr(args, flag, False):
            overrides[flag] = True
    try:
        return Settings(**overrides)
    except Exception as exc:  # pydantic's ValidationError: a bad CORRAL_* value
        raise CorralError(f"invalid settings: {exc}", code="invalid_request") from None


def cmd_serve(args: argparse.Namespace) -> int:
    from ..compiler.compiler import Compiler
    from ..store.ownership import claim

    settings = settings_from(args)
    definitions = Compiler(settings.definitions).compile()  # author errors plainly, before uvicorn
    if settings.locked:
        from ..deployment.swaps import check_locked

        check_locked(definitions, settings.require_evals)
    if not is_loopback(settings.host) and not settings.keys:
        if not args.insecure:  # a usage mistake: `main` prints it and exits with its status (2)
            raise CorralError(f"refusing to bind {settings.host} without CORRAL_API_KEYS "
                              "(set keys, or pass --insecure to accept the risk)", code="invalid_request")
        print(f"WARNING: serving {settings.host} WITHOUT authentication (--insecure)", file=sys.stderr)
    owned = claim(settings, "serve")  # a live owner of this state: `StateOwned`, one line, exit 3
    try:
        return _serve(settings, listen(settings.host, settings.port), owned)
    finally:
        if owned is not None:
            owned.release()


def _serve(settings: Settings, sock: socket.socket, owned: Claim | None) -> int:
    import uvicorn

    from ..http import create_app  # imported after the checks: it is slow (the mcp SDK), a refusal is not

    logs.configure(settings.log_level, settings.log_format)
    app = create_app(settings)
    config = uvicorn.Config(
        app, host=settings.host, port=settings.port, log_config=None,
        timeout_graceful_shutdown=int(settings.shutdown_grace_s) + 5, lifespan="on",
    )
    _draining_server(config, app, owned).run(sockets=[sock])
    service = getattr(app.state, "service", None)
    if service is not None and service.exit_code:
        print(f"error: {service.failed.message if service.failed else 'the server failed'}", file=sys.stderr)
        return service.exit_code
    return 0


def _settle_heap() -> None:
    """Leave what start-up made (modules, schemas, definitions: objects that live as long as the
    server) out of the garbage collector's full passes, which would otherwise walk them again and
    again while turns run: `gc.freeze`, 3 to 15 % less CPU per turn (`python -m bench overhead`).
    Garbage made later is collected as before; what start-up made and a swap later drops is freed by
    reference counting, only its cycles stay (once, the first set's). In the `corral serve` process
    only: tests that start many servers in one process must not pin theirs."""
    gc.collect()
    gc.freeze()


def _draining_server(config, app, owned: Claim | None):
    """uvicorn's server, telling Corral the moment SIGTERM/SIGINT arrives (not after connections close),
    and saying (in its log and in the state's owner record) where it listens once it does."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            _settle_heap()
            if sockets and self.started:  # uvicorn logs no address for sockets it was given
                if owned is not None:  # first: whoever sees the log line finds the URL recorded
                    owned.announce(url_of(sockets[0], reachable=True))
                logging.getLogger("uvicorn.error").info("Uvicorn running on %s (Press CTRL+C to quit)",
                                                        url_of(sockets[0]))

        def handle_exit(self, sig, frame) -> None:
            service = getattr(app.state, "service", None)
            if service is not None:
                service.begin_shutdown()
            super().handle_exit(sig, frame)

        async def on_tick(self, counter: int) -> bool:
            service = getattr(app.state, "service", None)
            if service is not None and service.exit_code is not None:
                return True  # the service gave up (its store died): stop, and exit with its code
            return await super().on_tick(counter)

    return DrainingServer(config)


def cmd_mcp(args: argparse.Namespace) -> int:
    # stdout is the JSON-RPC pipe: everything else goes to stderr
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from ..tools.mcp.connection import STDERR_LOG

    logging.getLogger(STDERR_LOG).setLevel(logging.INFO)  # what our MCP servers write to stderr, kept
    settings = settings_from(args)
    owned = _own_for_stdio(settings)
    try:
        return anyio.run(_serve_stdio, settings)
    finally:
        if owned is not None:
            owned.release()


def _own_for_stdio(settings: Settings) -> Claim | None:
    """`corral mcp` runs turns in this process, so it owns the state directory like a server, and
    refuses (one line, exit 3) when one owns it: running here would take that server's turns over,
    and the owner already serves the same agents over MCP at URL/mcp (pointed to)."""
    from ..errors import StateOwned
    from ..store.ownership import claim

    try:
        return claim(settings, "mcp")
    except StateOwned as exc:
        if exc.url:
            exc.message += f" (it serves these agents over MCP at {exc.url}/mcp)"
        raise


async def _serve_stdio(settings: Settings) -> int:
    from mcp.server.stdio import stdio_server

    from ..mcp.server import AgentsMCP
    from ..service import open_service

    async with open_service(settings) as service:
        agents = AgentsMCP(service)
        service.swapper.listeners.append(agents.on_swap)
        async with stdio_server() as (read_stream, write_stream):
            await agents.server.run(read_stream, write_stream, agents.server.create_initialization_options())
    return 0
