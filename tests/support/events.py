"""Server-sent events as a test reads them: a conversation's events, and the server's `/v1/events`.

    events = await read_events(client, conversation_id, ended(turn_id))   # replayed, then live

    async with server_events(client) as events:    # subscribed when the block starts
        write_atomic(defs / "edited.yaml", ...)
        report = (await events.wait(swap_reported())).data

A change the server announces (a swap, a rejected reload, a catalog drift)
is awaited on its event, never by polling the state it leaves behind.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
import httpx

SWAP_EVENTS = ("definitions.swapped", "definitions.rejected")


@dataclass(frozen=True)
class Event:
    id: int | None
    name: str
    data: Any


def sse(response: httpx.Response) -> AsyncIterator[Event]:
    """The events of a streaming response, as they arrive (comments and keep-alives skipped)."""
    return _parse(response.aiter_lines())


async def _parse(lines: AsyncIterator[str]) -> AsyncIterator[Event]:
    event_id, name, data = None, "message", []
    async for line in lines:
        if not line:
            if data:
                yield Event(event_id, name, json.loads("\n".join(data)))
            event_id, name, data = None, "message", []
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "id":
            event_id = int(value)
        elif field == "event":
            name = value
        elif field == "data":
            data.append(value)


def ended(turn_id: str | None = None) -> Callable[[Event], bool]:
    """A predicate: the end of `turn_id` (of any turn when None)."""
    names = ("turn.completed", "turn.failed", "turn.cancelled")
    return lambda e: e.name in names and turn_id in (None, e.data.get("turn_id"))


def named(name: str) -> Callable[[Event], bool]:
    return lambda e: e.name == name


def swap_reported(where: Callable[[dict[str, Any]], bool] = lambda report: True) -> Callable[[Event], bool]:
    """A predicate: a swap report (`definitions.swapped` or `.rejected`) that satisfies `where`."""
    return lambda e: e.name in SWAP_EVENTS and where(e.data)


# --- a conversation's events ---------------------------------------------------------------------


@asynccontextmanager
async def conversation_events(client: httpx.AsyncClient, conversation_id: str,
                              last_event_id: int | None = None) -> AsyncIterator[AsyncIterator[Event]]:
    """`GET .../events` (resuming after `last_event_id`), open while the block runs."""
    headers = {} if last_event_id is None else {"Last-Event-ID": str(last_event_id)}
    async with client.stream("GET", f"/v1/conversations/{conversation_id}/events", headers=headers) as r:
        assert r.status_code == 200, await r.aread()
        assert r.headers["content-type"].startswith("text/event-stream")
        yield sse(r)


async def read_events(client: httpx.AsyncClient, conversation_id: str, until: Callable[[Event], bool],
                      last_event_id: int | None = None) -> list[Event]:
    """`GET .../events` (resuming after `last_event_id`), up to and including the first `until` event."""
    seen: list[Event] = []
    async with conversation_events(client, conversation_id, last_event_id) as events:
        async for event in events:
            seen.append(event)
            if until(event):
                return seen
    raise AssertionError(f"the event stream ended before the awaited event: {seen}")


# --- the server's events -------------------------------------------------------------------------


class ServerEvents:
    """Every event of `GET /v1/events` since subscribing, in order; `wait` for the one a test needs."""

    def __init__(self) -> None:
        self.seen: list[Event] = []
        self.closed = False
        self._arrived = anyio.Event()

    def _add(self, event: Event | None) -> None:
        if event is None:
            self.closed = True
        else:
            self.seen.append(event)
        self._arrived.set()
        self._arrived = anyio.Event()

    async def wait(self, until: Callable[[Event], bool], *, after: int = 0) -> Event:
        """The first event from position `after` on that `until` accepts, waiting for it to come."""
        position = after
        while True:
            for event in self.seen[position:]:
                if until(event):
                    return event
            position = len(self.seen)
            if self.closed:
                raise AssertionError(f"the server's event stream ended before the awaited event: {self.seen}")
            await self._arrived.wait()


async def _follow(client: httpx.AsyncClient, *, task_status: anyio.abc.TaskStatus[ServerEvents]) -> None:
    events = ServerEvents()
    try:
        async with client.stream("GET", "/v1/events") as r:
            assert r.status_code == 200
            lines = r.aiter_lines()
            assert (await anext(lines)).startswith(":")  # the first keep-alive: subscribed from here
            task_status.started(events)
            async for event in _parse(lines):
                events._add(event)
    finally:
        events._add(None)


@asynccontextmanager
async def server_events(client: httpx.AsyncClient) -> AsyncIterator[ServerEvents]:
    """`GET /v1/events`, followed from before the block starts until it ends."""
    async with anyio.create_task_group() as tg:
        yield await tg.start(_follow, client)
        tg.cancel_scope.cancel()
