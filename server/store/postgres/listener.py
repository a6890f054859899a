"""The notices other replicas send: one dedicated connection LISTENing on the `corral` channel.

Not in the pool: LISTEN belongs to one session, and a pooled connection
would stop listening when returned. The connection's callback parses each
notice, drops this replica's own (every session on the channel hears every
NOTIFY, its own too) and calls every handler, in order, on the event loop
(asyncpg calls listeners there).

A listener can lose its connection (the server restarted, a network cut, a
half-open TCP connection that nothing reports). A supervising task notices:
asyncpg's termination callback for a closed connection, a keepalive query
that fails or times out for a silent one. It then reconnects with backoff
and, once listening again, delivers `{"t": "resync"}` once: notices sent
meanwhile are lost, so handlers look again at what they care about.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

import asyncpg

from ..records import Notice
from .pool import CHANNEL

log = logging.getLogger("corral.store")

KEEPALIVE_S = 5.0  # how often an idle listener checks its connection still answers
BACKOFF_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0)  # between reconnection attempts; the last repeats


class Listener:
    def __init__(self, connect: Callable[[], Any], replica: str, *, keepalive_s: float = KEEPALIVE_S):
        self._connect = connect  # a coroutine function returning a new asyncpg connection
        self.replica = replica
        self.keepalive_s = keepalive_s
        self.handlers: list[Callable[[Notice], None]] = []
        self._connection: asyncpg.Connection | None = None
        self._lost = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def backend_pid(self) -> int | None:
        """The server process of the listening session (tests cut it to check the reconnection)."""
        return None if self._connection is None else self._connection.get_server_pid()

    async def start(self) -> None:
        """Listen now (a failure propagates: the store does not open), then keep listening."""
        self._connection = await self._listen()
        self._task = asyncio.create_task(self._supervise(), name="corral-listener")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._drop()

    async def _listen(self) -> asyncpg.Connection:
        connection = await self._connect()
        try:
            self._lost = asyncio.Event()
            connection.add_termination_listener(self._terminated)
            await connection.add_listener(CHANNEL, self._arrived)
        except BaseException:
            connection.terminate()
            raise
        return connection

    async def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None or connection.is_closed():
            return
        connection.remove_termination_listener(self._terminated)
        try:
            await asyncio.wait_for(connection.close(), timeout=2.0)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            connection.terminate()

    def _terminated(self, connection: asyncpg.Connection) -> None:
        if connection is self._connection:
            self._lost.set()

    def _arrived(self, connection: Any, pid: int, channel: str, payload: str) -> None:
        try:
            notice = json.loads(payload)
        except ValueError:
            log.warning("ignored a notice that is not JSON on channel %s", channel)
            return
        if not isinstance(notice, dict) or notice.get("r") == self.replica:
            return
        self.deliver(notice)

    def deliver(self, notice: Notice) -> None:
        for handler in list(self.handlers):
            try:
                handler(notice)
            except Exception:
                log.exception("a notice handler failed")

    async def _supervise(self) -> None:
        while True:
            await self._watch()
            log.warning("the notice listener lost its connection to PostgreSQL; reconnecting")
            await self._drop()
            await self._reconnect()
            log.info("the notice listener is listening again")
            self.deliver({"t": "resync"})

    async def _watch(self) -> None:
        """Return once the connection is gone or no longer answers."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._lost.wait(), timeout=self.keepalive_s)
                return
            connection = self._connection
            if connection is None or connection.is_closed():
                return
            try:
                await connection.execute("SELECT 1", timeout=self.keepalive_s)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                return

    async def _reconnect(self) -> None:
        attempt = 0
        while True:
            try:
                self._connection = await self._listen()
                return
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                delay = BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)]
                log.debug("the notice listener could not reconnect (%s); again in %gs",
                          type(exc).__name__, delay)
                attempt += 1
                await asyncio.sleep(delay)
