"""One supervised connection to an external MCP server, over stdio or streamable HTTP.

A `Connection` serves one MCPServer definition (one digest). It is started
lazily: the first caller spawns an owner task (in the task group of
`MCPConnections.run`) that enters the SDK `Client`, lists the tools, and
stays inside until told to leave or until the transport fails; the SDK
requires a client to be entered and exited by the same task, while calls may
come from any task. A dead connection (the stdio process gone, the HTTP
server down, a lost session) is noticed by the next request, which marks it
down; the next use starts a new one. Failed starts back off exponentially,
and a caller inside the back-off gets the last error at once.

Not responsible for tool names, filtering or catalog drift (`connections`),
or for rendering results (`catalog`). Every error it reports as a
`ToolOutput` or `ServerUnavailable` is safe to show the model: no secret
values.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, TextIO

import anyio
import httpx2
import mcp.types as types
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, INVALID_REQUEST, REQUEST_TIMEOUT

from ... import __version__
from ...compiler.definitions import MCPServerDefinition
from ...compiler.templates import MissingSecret, resolve_secrets
from ...deployment.vault import FileVault
from ...tracing import trace_meta
from ..base import EXECUTION_KEY_META, ToolOutput
from ..confinement import Redactor, program_path
from ..processes import SUPERVISED, locate, supervised
from .catalog import render_result

log = logging.getLogger("corral.mcp")
STDERR_LOG = "corral.mcp.stderr"  # what stdio servers write to stderr: a record a line, at INFO

BACKOFF_MIN_S = 1.0
BACKOFF_MAX_S = 30.0
START_MIN_S = 10.0  # a start may take longer than one call (an interpreter loading its imports)
CALL_GRACE_S = 5.0  # beyond the SDK's own per-request time-out: a last guard against a hang
MAX_PAGES = 100
# The parent environment a stdio server gets; anything else (API keys...) only via its `env`.
INHERITED_ENV = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "LANG", "LC_ALL", "LC_CTYPE",
                 "TMPDIR", "TZ", "SYSTEMROOT")


class ServerUnavailable(Exception):
    """The MCP server could not be started or reached; the message is safe to show the model.

    A control-flow signal, not a public error: a call turns it into a tool error output, `corral lock`
    into `CatalogsUnavailable`. (A program a command tool or hook cannot start is
    `tools.processes.StartFailed`.)"""


def describe(exc: BaseException) -> str:
    """A short, secret-free account of why a connection failed."""
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return describe(exc.exceptions[0])
    if isinstance(exc, MissingSecret):
        return f"environment variable {exc.args[0]} is not set"
    if isinstance(exc, MCPError):
        return f"{exc.message} (MCP error {exc.code})"
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _lost(exc: MCPError) -> bool:
    """Whether an error means the connection is gone (a new one may work)."""
    return exc.code == CONNECTION_CLOSED or (exc.code == INVALID_REQUEST and "session" in exc.message.lower())


class _Start:
    """The outcome of one start attempt, awaited by the task that asked for it."""

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.client: Client | None = None
        self.error = ""

    def settle(self, client: Client | None = None, error: str = "") -> None:
        if not self.event.is_set():
            self.client, self.error = client, error
            self.event.set()


class Connection:
    """A lazily started, restartable client of one MCPServer definition."""

    def __init__(self, server: MCPServerDefinition, root: Path, environ: Mapping[str, str], files: FileVault,
                 spawn: Callable[..., Any], on_catalog: Callable[[Connection], None]):
        self.server, self.root, self.environ, self.files = server, root, environ, files
        self.catalog: list[types.Tool] | None = None  # as last listed
        self.refusal: str | None = None  # set by the owner of drift checks: calls are refused
        self.retired = False
        self.active = 0
        self._spawn = spawn
        self._on_catalog = on_catalog
        self._client: Client | None = None
        self._leave: anyio.Event | None = None
        self._lock = anyio.Lock()
        self._failures = 0
        self._retry_at = -math.inf
        self._last_error = ""

    @property
    def timeout(self) -> float:
        return float(self.server.timeout_s)

    @property
    def start_timeout(self) -> float:
        return max(self.timeout, START_MIN_S)

    # --- lifecycle -----------------------------------------------------------

    async def ensure(self) -> tuple[Client, bool]:
        """The live client and whether it was just started; ServerUnavailable when none can be."""
        async with self._lock:
            if self._client is not None:
                return self._client, False
            if anyio.current_time() < self._retry_at:
                raise ServerUnavailable(self._last_error)
            start = _Start()
            self._spawn(self._own, start)
            await start.event.wait()
            if start.client is None:
                self._failures += 1
                backoff = min(BACKOFF_MIN_S * 2 ** (self._failures - 1), BACKOFF_MAX_S)
                self._retry_at = anyio.current_time() + backoff
                self._last_error = f"MCP server {self.server.name} could not be started: {start.error}"
                raise ServerUnavailable(self._last_error)
            self._failures = 0
            return start.client, True

    def mark_down(self, client: Client) -> None:
        """`client` failed: leave it (once), so that the next use starts a new one."""
        if self._client is client:
            self._client = None
            if self._leave is not None:
                self._leave.set()

    def stop(self) -> None:
        if self._client is not None:
            self.mark_down(self._client)

    async def _own(self, start: _Start) -> None:
        leave = anyio.Event()
        try:
            with anyio.CancelScope(deadline=anyio.current_time() + self.start_timeout) as scope:
                async with self._open() as client:
                    self.catalog = await _list_tools(client)
                    scope.deadline = math.inf
                    self._client, self._leave = client, leave
                    self._on_catalog(self)
                    start.settle(client)
                    await leave.wait()
            if scope.cancelled_caught:
                start.settle(error=f"no answer within {self.start_timeout:g}s")
        except anyio.get_cancelled_exc_class():
            raise
        except BaseException as exc:  # transport failures arrive as (base) exception groups
            if not isinstance(exc, Exception | BaseExceptionGroup):
                raise
            if start.event.is_set():
                log.warning("MCP server %s disconnected: %s", self.server.name, describe(exc))
            start.settle(error=describe(exc))
        finally:
            if self._leave is leave:
                self._client = self._leave = None
            start.settle(error="shutting down")

    @asynccontextmanager
    async def _open(self) -> AsyncIterator[Client]:
        info = types.Implementation(name="corral", version=__version__)
        async with AsyncExitStack() as stack:
            if self.server.transport == "http":
                headers = {k: resolve_secrets(v, self.environ) for k, v in self.server.headers.items()}
                http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(self.timeout, read=300.0))
                await stack.enter_async_context(http)
                target: Any = streamable_http_client(str(self.server.url), http_client=http)
            else:
                env = self.server.env.values()
                secrets = Redactor(resolve_secrets(v, self.environ) for v in env if "${" in v)
                errlog = stack.enter_context(_stderr_to_log(self.server.name, secrets))
                target = stdio_client(self._stdio(), errlog=errlog)  # stderr to the log, not the terminal
            # The client's default covers the handshake; calls and listings carry the shorter `timeout_s`.
            client = Client(target, mode="legacy", read_timeout_seconds=self.start_timeout, client_info=info)
            yield await stack.enter_async_context(client)

    def _stdio(self) -> StdioServerParameters:
        files = self.server.files
        server = self.server

        def resolve(item: str) -> str:
            return str(self.files.resolve(self.root, item, files[item])) if item in files else item

        env = {k: os.environ[k] for k in INHERITED_ENV if k in os.environ}
        env["PATH"] = program_path(os.environ.get("PATH"))  # `python3` is the one Corral runs on
        env.update({k: resolve_secrets(v, self.environ) for k, v in server.env.items()})
        cwd = self.root / server.cwd if server.cwd else self.root
        argv = [resolve(str(server.command)), *(resolve(a) for a in server.args)]
        if SUPERVISED:  # under reaper.py, as command tools: the server's whole tree dies with Corral's
            argv = supervised([locate(argv[0], env.get("PATH"), cwd), *argv[1:]], env)
        return StdioServerParameters(command=argv[0], args=argv[1:], env=env, cwd=cwd)

    # --- requests ------------------------------------------------------------

    async def refresh(self) -> list[types.Tool]:
        """List the tools again (a liveness check too), restarting a dead connection once."""
        client, fresh = await self.ensure()
        if fresh:
            return self.catalog or []
        try:
            with anyio.fail_after(self.timeout):
                self.catalog = await _list_tools(client)
        except Exception as exc:
            log.info("MCP server %s did not answer (%s); restarting it", self.server.name, describe(exc))
            self.mark_down(client)
            await self.ensure()
        else:
            self._on_catalog(self)
        return self.catalog or []

    async def call(self, name: str, arguments: Mapping[str, Any], execution_key: str = "") -> ToolOutput:
        """Call one tool; every failure becomes an error output, never a hang. An execution key goes
        in the request's `_meta` (`corral/execution_key`), for a server that deduplicates calls."""
        try:
            client, _ = await self.ensure()
        except ServerUnavailable as exc:
            return ToolOutput(str(exc), is_error=True)
        if self.refusal:
            return ToolOutput(self.refusal, is_error=True)
        self.active += 1
        try:
            with anyio.fail_after(self.timeout + CALL_GRACE_S):
                result = await client.call_tool(name, dict(arguments), read_timeout_seconds=self.timeout,
                                                meta=_meta(execution_key))
        except MCPError as exc:
            return self._failed(client, name, exc)
        except Exception as exc:  # TimeoutError from the guard, a broken stream, an invalid result
            self.mark_down(client)
            return ToolOutput(f"{self._label(name)} failed: {describe(exc)}", is_error=True)
        finally:
            self.active -= 1
            if self.retired and not self.active:
                self.stop()
        return render_result(result)

    def _failed(self, client: Client, name: str, exc: MCPError) -> ToolOutput:
        if exc.code == REQUEST_TIMEOUT:
            return ToolOutput(f"{self._label(name)} timed out after {self.timeout:g}s", is_error=True)
        if _lost(exc):
            self.mark_down(client)
            return ToolOutput(f"{self._label(name)} failed: the connection to the MCP server was lost "
                              f"({describe(exc)}); it restarts on next use", is_error=True)
        return ToolOutput(f"{self._label(name)} failed: {describe(exc)}", is_error=True)

    def _label(self, name: str) -> str:
        return f"tool {name} of MCP server {self.server.name}"


def _meta(execution_key: str) -> types.RequestParamsMeta | None:
    meta: dict[str, Any] = {EXECUTION_KEY_META: execution_key} if execution_key else {}
    meta.update(trace_meta())  # the call's span, as `traceparent`
    return meta or None  # type: ignore[return-value]


async def _list_tools(client: Client) -> list[types.Tool]:
    tools: list[types.Tool] = []
    cursor: str | None = None
    for _ in range(MAX_PAGES):
        page = await client.list_tools(cursor=cursor, cache_mode="refresh")
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


@contextmanager
def _stderr_to_log(name: str, secrets: Redactor) -> Iterator[TextIO]:
    """A pipe for a stdio server's stderr, read by a thread that logs each line (to the log, never
    to the terminal of `corral chat`), with the server's secret values redacted."""
    read_fd, write_fd = os.pipe()
    errlog = os.fdopen(write_fd, "w")
    logger = logging.getLogger(STDERR_LOG)

    def pump() -> None:
        with open(read_fd, encoding="utf-8", errors="replace") as lines:
            for line in lines:
                logger.info("MCP server %s: %s", name, secrets.text(line.rstrip()))

    threading.Thread(target=pump, name=f"mcp-stderr-{name}", daemon=True).start()
    try:
        yield errlog
    finally:
        errlog.close()  # the thread ends once the server (and what it started) closed theirs too
