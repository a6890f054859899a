"""Watch the definition directory and reload when it changes.

watchfiles groups changes: it yields once no new change has arrived for
`STEP_MS` (and at most every `DEBOUNCE_MS`), so an editor's
write-rename-delete dance or a `git checkout` of many files becomes one
reload of the final state. Hidden paths and editor leftovers are ignored;
`corral.lock` is not, since in locked mode a new lock can make a rejected set
acceptable.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import watchfiles

log = logging.getLogger("corral.watcher")

STEP_MS = 50
DEBOUNCE_MS = 1600
_EDITOR_LEFTOVERS = ("~", ".swp", ".swx", ".tmp", ".part")


def relevant(change: watchfiles.Change, path: str) -> bool:
    parts = Path(path).parts
    return not any(p.startswith(".") for p in parts[-4:]) and not path.endswith(_EDITOR_LEFTOVERS)


async def watch(root: Path, reload: Callable[[str, set[str]], Awaitable[object]],
                ready: Callable[[], None] | None = None) -> None:
    """Call `reload("watch", paths)` after each settled batch of changes under `root`, forever."""
    stop = anyio.Event()
    watcher = watchfiles.awatch(root, watch_filter=relevant, step=STEP_MS, debounce=DEBOUNCE_MS,
                                stop_event=stop, recursive=True, yield_on_timeout=False)
    if ready is not None:
        ready()
    async with anyio.create_task_group() as tg:
        tg.start_soon(_stop_when_cancelled, stop)
        async for changes in watcher:
            log.debug("%d change(s) under %s", len(changes), root)
            await reload("watch", {path for _, path in changes})
        tg.cancel_scope.cancel()


async def _stop_when_cancelled(stop: anyio.Event) -> None:
    # awatch waits for changes in a thread that a cancellation cannot interrupt, only `stop`
    # can (checked every step): without this, shutting down would wait out its 5 s timeout.
    try:
        await anyio.sleep_forever()
    finally:
        stop.set()
