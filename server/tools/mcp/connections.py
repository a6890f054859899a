"""Tools of MCPServer definitions: the runtime's `MCPToolSource`.

`MCPConnections` keeps one supervised connection (`connection`)
per MCPServer *digest*: an edited definition gets a new connection, and the
old one is closed once no call is running on it. Connections start on first
use and live in the task group of `MCPConnections.run`, which runs for the
service's lifetime; when it ends, every connection is closed and every stdio
server terminated.

Each time a connection lists its tools (at start, and when a turn is built,
which doubles as a liveness check) the catalog digest is compared with the
one in `corral.lock`. A difference is reported once per observed digest
through `on_drift`; in locked mode the server's tools then refuse every call.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
from anyio.abc import TaskGroup, TaskStatus

from ...canonical import freeze
from ...compiler.definitions import DefinitionSet, MCPServerDefinition
from ...deployment.vault import NO_VAULT, FileVault
from ...messages import ToolSpec
from ..base import ToolContext, ToolOutput, ToolPort
from .catalog import catalog_digest_of, catalog_of, hook_name, replay_safe, tool_name
from .connection import Connection, ServerUnavailable

DriftCallback = Callable[[str, str, str], None]  # (server name, expected digest, observed digest)
DRIFT_REFUSAL = "MCP server {name}: catalog drifted from corral.lock ({expected} -> {observed})"

log = logging.getLogger("corral.mcp")


class MCPTool:
    """One tool of an MCP server, as a `ToolPort`; `hook_name` is its name to hooks (`mcp__server__tool`)."""

    def __init__(self, connection: Connection, tool: types.Tool):
        self.connection = connection
        self.tool = tool.name
        server = connection.server
        description = tool.description or f"{tool.name} (MCP server {server.name})"
        schema = freeze(dict(tool.input_schema or {"type": "object"}))
        self.spec = ToolSpec(tool_name(server.name, tool.name), description, schema)
        self.hook_name = hook_name(server.name, tool.name)
        self.replay_safe = replay_safe(tool)  # the server's annotations, as listed

    async def call(self, arguments: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        return await self.connection.call(self.tool, arguments, ctx.execution_key)


class Unavailable:
    """Stands in for tools of a server that could not be reached: calling it says why.

    Named after the one tool asked for (`server/tool`), or `{server}__unavailable`;
    with `retry`, a call tries to start the server again (past its back-off).
    """

    replay_safe = False  # its annotations are unknown: a call cut off by a crash is not repeated

    def __init__(self, connection: Connection, tool: str | None, error: str, *, retry: bool = True):
        self.connection, self.tool, self.error, self.retry = connection, tool, error, retry
        name = connection.server.name
        self.spec = ToolSpec(tool_name(name, tool or "unavailable"),
                             f"MCP server {name} is unavailable: {error}", freeze({"type": "object"}))
        self.hook_name = hook_name(name, tool or "unavailable")

    async def call(self, arguments: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        if self.tool is None or not self.retry:
            return ToolOutput(self.error, is_error=True)
        return await self.connection.call(self.tool, arguments, ctx.execution_key)


class MCPConnections:
    """Supervised connections to the MCP servers of the current definitions."""

    def __init__(self, *, environ: Mapping[str, str] | None = None, expected: Mapping[str, str] | None = None,
                 locked: bool = False, on_drift: DriftCallback | None = None,
                 files: FileVault = NO_VAULT):
        self.files = files
        self.environ = os.environ if environ is None else environ
        self.expected = dict(expected or {})
        self.locked = locked
        self.on_drift = on_drift
        self._unavailable: dict[str, str] = {}  # server digest -> the failure last logged
        self._connections: dict[tuple[str, Path], Connection] = {}  # by (digest, definition root)
        self._reported: dict[str, str] = {}  # digest of a definition -> last drifted catalog reported
        self._tg: TaskGroup | None = None

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Hold the connections' task group until cancelled; closes every connection on the way out."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            task_status.started()
            try:
                await anyio.sleep_forever()
            finally:
                self._tg = None
                for connection in self._connections.values():
                    connection.stop()
                self._connections.clear()

    # --- MCPToolSource -------------------------------------------------------

    async def tools(self, server: MCPServerDefinition, root: Path,
                    only: str | None = None) -> Sequence[ToolPort]:
        connection = self._connection(server, root)
        try:
            catalog = await connection.refresh()
        except ServerUnavailable as exc:
            self._report_unavailable(server, str(exc))
            if connection.catalog is None or only:
                return [Unavailable(connection, only, str(exc))]
            catalog = connection.catalog  # the last one seen: its calls retry and say why they fail
        ports: list[ToolPort] = [
            MCPTool(connection, t)
            for t in catalog
            if server.exposes(t.name) and (only is None or t.name == only)
        ]
        if only and not ports:
            ports.append(Unavailable(connection, only, f"MCP server {server.name} offers no tool {only!r}",
                                     retry=False))
        return ports

    def _report_unavailable(self, server: MCPServerDefinition, error: str) -> None:
        """Say plainly, once per server and reason, that a server's tools are missing from a turn."""
        if self._unavailable.get(server.digest) != error:
            self._unavailable[server.digest] = error
            log.warning("MCP server %s could not be used: %s (its tools are unavailable)", server.name, error)

    async def catalog(self, server: MCPServerDefinition, root: Path) -> list[dict[str, Any]]:
        """The server's exposed tools as `{name, description, input_schema}`, sorted; ServerUnavailable."""
        return catalog_of(server, await self._connection(server, root).refresh())

    async def catalog_digest(self, server: MCPServerDefinition, root: Path) -> str:
        return catalog_digest_of(server, await self._connection(server, root).refresh())

    # --- connections ---------------------------------------------------------

    def _connection(self, server: MCPServerDefinition, root: Path) -> Connection:
        key = (server.digest, root)
        connection = self._connections.get(key)
        if connection is None:
            connection = Connection(server, root, self.environ, self.files, self._spawn, self._observed)
            self._connections[key] = connection
            self._retire_others(connection)
        return connection

    def _retire_others(self, current: Connection) -> None:
        name = current.server.name
        self._retire(lambda old: old is not current and old.server.name == name)

    def retain(self, digests: set[str]) -> None:
        """After a swap: close connections of servers no longer defined (a later use reopens one)."""
        self._retire(lambda old: old.server.digest not in digests)

    def _retire(self, doomed: Callable[[Connection], bool]) -> None:
        for key, old in list(self._connections.items()):
            if doomed(old):
                del self._connections[key]
                old.retired = True
                if not old.active:
                    old.stop()

    def _spawn(self, func: Callable[..., Any], *args: Any) -> None:
        if self._tg is None:
            raise ServerUnavailable("MCP connections are not running")
        self._tg.start_soon(func, *args)

    def _observed(self, connection: Connection) -> None:
        """A catalog was listed: compare it with the lock."""
        server = connection.server
        expected = self.expected.get(server.name)
        observed = catalog_digest_of(server, connection.catalog or [])
        if expected is None or observed == expected:
            connection.refusal = None
            return
        if self._reported.get(server.digest) != observed:
            self._reported[server.digest] = observed
            if self.on_drift is not None:
                self.on_drift(server.name, expected, observed)
        connection.refusal = (DRIFT_REFUSAL.format(name=server.name, expected=expected, observed=observed)
                              if self.locked else None)


class CatalogsUnavailable(Exception):
    """Some MCP servers could not be reached to observe their catalogs."""

    def __init__(self, failures: Mapping[str, str]):
        self.failures = dict(failures)
        super().__init__("; ".join(f"{name}: {error}" for name, error in sorted(self.failures.items())))


async def observe_catalogs(definitions: DefinitionSet,
                           environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Connect to every MCPServer of `definitions` once: server name -> catalog digest.

    Each connection is bounded by its server's time-outs; any server that
    cannot be reached raises `CatalogsUnavailable` naming them all.
    """
    servers = [s for s in definitions.of_kind("MCPServer") if isinstance(s, MCPServerDefinition)]
    digests: dict[str, str] = {}
    failures: dict[str, str] = {}
    connections = MCPConnections(environ=environ)

    async def observe(server: MCPServerDefinition) -> None:
        try:  # bounded inside: a start by its time-out, a listing by `timeout_s`
            digests[server.name] = await connections.catalog_digest(server, definitions.root)
        except ServerUnavailable as exc:
            failures[server.name] = str(exc)

    async with anyio.create_task_group() as tg:
        await tg.start(connections.run)
        async with anyio.create_task_group() as each:
            for server in servers:
                each.start_soon(observe, server)
        tg.cancel_scope.cancel()
    if failures:
        raise CatalogsUnavailable(failures)
    return dict(sorted(digests.items()))
