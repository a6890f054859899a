"""Store health: a store that failed a write is probed until it writes again, or declared dead.

A storage failure fails the turn it hit (`storage_error`), never the server
(§7). One failed write may be passing (a full disk someone is clearing, a
lock held for a moment); a store that cannot be written at all must take the
server down, so that `/healthz` fails and a supervisor restarts it. So after
a failure the store is probed with a small write every `PROBE_INTERVAL_S`: the
first probe that succeeds makes it healthy again (and tells `on_recovered`,
which records what could not be recorded meanwhile); probes still failing
after `grace_s` make it dead, for good.

Not responsible for what the server does once the store is dead (`service`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio

from ..errors import StorageError
from .base import Lifecycle

log = logging.getLogger("corral.store")

PROBE_INTERVAL_S = 0.25


class StoreHealth:
    def __init__(self, store: Lifecycle, grace_s: float = 10.0):
        self.store = store
        self.grace_s = grace_s
        self.error: StorageError | None = None  # set once the store is dead
        self.dead = anyio.Event()
        self.on_recovered: list[Callable[[], Awaitable[None]]] = []
        self._suspect = anyio.Event()

    def suspect(self, exc: BaseException) -> None:
        """A write failed: probe the store (safe to call from any task, any number of times)."""
        self._suspect.set()

    async def run(self, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """Watch for failures until the store is dead or this task is cancelled."""
        task_status.started()
        while True:
            await self._suspect.wait()
            self._suspect = anyio.Event()
            failure = await self._probe()
            if failure is not None:
                self.error = failure
                log.critical("the store cannot be written (%s) for %gs: giving up", failure.message,
                             self.grace_s)
                self.dead.set()
                return
            for recovered in self.on_recovered:
                await recovered()

    async def _probe(self) -> StorageError | None:
        """None once a probe write succeeds; the last failure if none does within the grace."""
        deadline = anyio.current_time() + self.grace_s
        while True:
            try:
                await self.store.probe()
            except StorageError as exc:
                if anyio.current_time() >= deadline:
                    return exc
                log.warning("the store cannot be written (%s); probing again", exc.message)
                await anyio.sleep(PROBE_INTERVAL_S)
            else:
                log.info("the store is writable")
                return None
