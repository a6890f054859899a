"""A store that outlasts a short outage: what a running turn writes and reads through.

A running turn's write that fails because the store could not be reached
(`StoreUnreachable`: a PostgreSQL restart or fail-over, connections lost or
refused) is tried again, with a growing pause, until the storage grace has
passed since the first failure; so a store back within the grace fails no
turn and loses no tool result (§7). Any other failure (a constraint, a full
disk, a lost lease) is raised at once, as is the last one once the grace is
spent: the turn then fails with `storage_error` as before.

Not responsible for telling the store's health (`store.health` probes it
and declares it dead after the same grace) or for reconnecting (the store's
pool opens new connections on its own).
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

from ..errors import StoreUnreachable

log = logging.getLogger("corral.turns")
T = TypeVar("T")
FIRST_PAUSE_S = 0.1
LONGEST_PAUSE_S = 1.0


async def patiently(call: Callable[[], Awaitable[T]], grace_s: float) -> T:
    """`call()`, tried again while the store is unreachable, until `grace_s` has passed."""
    deadline: float | None = None
    pause = FIRST_PAUSE_S
    while True:
        try:
            return await call()
        except StoreUnreachable as exc:
            now = anyio.current_time()
            deadline = now + grace_s if deadline is None else deadline
            if now + pause > deadline:
                raise
            log.warning("the store is unreachable (%s); trying again for up to %.0fs", exc.message,
                        deadline - now)
        await anyio.sleep(pause)
        pause = min(pause * 2, LONGEST_PAUSE_S)


class PatientStore:
    """The store, each of its coroutine methods called `patiently` (every other attribute as it is)."""

    def __init__(self, store: Any, grace_s: float):
        self._store = store
        self.grace_s = grace_s

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._store, name)
        if not inspect.iscoroutinefunction(value):
            return value

        @functools.wraps(value)
        async def patient(*args: Any, **kwargs: Any) -> Any:
            return await patiently(lambda: value(*args, **kwargs), self.grace_s)

        return patient
