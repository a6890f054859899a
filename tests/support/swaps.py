"""Definition swaps as a test sees them over the HTTP API: the served set, reloads, the history.

A swap the watcher makes is awaited on its `/v1/events` event (see
`tests.support.events.server_events`); `watcher_live` is the one wait that
must also write, because an edit made before the watcher subscribed is lost.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx

from tests.support.events import server_events, swap_reported
from tests.support.trees import write_atomic

PROBE = "kind: Model\nname: probe\ndescription: A change for the watcher to see.\nprovider: scripted\n"


async def set_digest(client: httpx.AsyncClient) -> str:
    """The digest of the definition set being served."""
    r = await client.get("/v1/definitions")
    assert r.status_code == 200, r.text
    return r.json()["digest"]


async def reload(client: httpx.AsyncClient) -> dict[str, Any]:
    """`POST /v1/definitions/reload`: its swap report."""
    r = await client.post("/v1/definitions/reload")
    assert r.status_code == 200, r.text
    return r.json()


async def swaps(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    """Every recorded swap report, newest first."""
    r = await client.get("/v1/definitions/history", params={"limit": 1000})
    assert r.status_code == 200, r.text
    return r.json()["items"]


async def watcher_live(client: httpx.AsyncClient, root: Path) -> dict[str, Any]:
    """Add a probe definition, and write it again until the watcher reports a swap; that report.

    The watcher starts with the server but may not have subscribed to the
    directory yet when the first request is answered; an edit made before it
    has would never be reported. From the first report on, edits are seen.
    Every write has the same content, so a write seen late reloads an
    unchanged set, which leaves no report (outside locked mode).
    """
    with anyio.fail_after(20):
        async with server_events(client) as events:
            while True:
                write_atomic(root / "probe.yaml", PROBE)
                with anyio.move_on_after(2.0):
                    return (await events.wait(swap_reported())).data
