"""Conversations as a test drives them over the HTTP API: create one, send to it, read what came back.

    conversation, answer = await talk(client, "echo", "hello")   # a new conversation, one turn
    conversation = await Conversation.create(client, "gated")
    answer = await conversation.say("hello")                     # answered 200: the turn's result
    reply = await conversation.send("hello", key="k", if_busy="enqueue")   # the response as it came
    events = await conversation.stream("hello")                  # every event of a streamed turn

Every reply is kept in `conversation.replies`, in the order the replies came
back, so a test that sends from several tasks reads them all afterwards.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx

from tests.support.events import Event, named, read_events, sse


class Conversation:
    """One conversation of the HTTP API, and the replies to the messages sent in it."""

    def __init__(self, client: httpx.AsyncClient, created: dict[str, Any]):
        self.client = client
        self.created = created  # the body `POST /v1/conversations` answered
        self.id: str = created["id"]
        self.path = f"/v1/conversations/{self.id}"
        self.replies: list[httpx.Response] = []
        self.lost: list[httpx.HTTPError] = []  # sends the server never answered (see `try_send`)

    @classmethod
    async def create(cls, client: httpx.AsyncClient, agent: str, **fields: Any) -> Conversation:
        """A new conversation with `agent` (`fields`: title, metadata); answered 201."""
        r = await client.post("/v1/conversations", json={"agent": agent, **fields})
        assert r.status_code == 201, r.text
        return cls(client, r.json())

    def through(self, client: httpx.AsyncClient) -> Conversation:
        """The same conversation, reached through `client` (a server restarted on the same state)."""
        return Conversation(client, self.created)

    async def send(self, content: str, *, key: str | None = None, **fields: Any) -> httpx.Response:
        """`POST .../messages` (`fields`: if_busy, stream); the response, whatever its status."""
        headers = {"Idempotency-Key": key} if key else {}
        reply = await self.client.post(f"{self.path}/messages", json={"content": content, **fields},
                                       headers=headers)
        self.replies.append(reply)
        return reply

    async def try_send(self, content: str, **fields: Any) -> httpx.Response | httpx.HTTPError:
        """`send` for a turn whose answer may never come (the server goes away): the reply, or the error."""
        try:
            return await self.send(content, **fields)
        except httpx.HTTPError as exc:
            self.lost.append(exc)
            return exc

    async def say(self, content: str, *, bound: float | None = None, **fields: Any) -> dict[str, Any]:
        """One turn, answered 200 (within `bound` seconds if given); its result once it has ended."""
        with anyio.fail_after(bound):
            reply = await self.send(content, **fields)
        assert reply.status_code == 200, reply.text
        return reply.json()

    @asynccontextmanager
    async def streaming(self, content: str, *, key: str | None = None,
                        **fields: Any) -> AsyncIterator[AsyncIterator[Event]]:
        """A streamed turn, answered 200 with an event stream, open while the block runs."""
        headers = {"Idempotency-Key": key} if key else {}
        body = {"content": content, "stream": True, **fields}
        async with self.client.stream("POST", f"{self.path}/messages", json=body, headers=headers) as r:
            assert r.status_code == 200, await r.aread()
            assert r.headers["content-type"].startswith("text/event-stream")
            yield sse(r)

    async def stream(self, content: str, **fields: Any) -> list[Event]:
        """Every event of a streamed turn (the server ends the stream with the turn)."""
        async with self.streaming(content, **fields) as events:
            return [event async for event in events]

    async def events(self, until: Callable[[Event], bool], last_event_id: int | None = None) -> list[Event]:
        """The conversation's events up to and including the first `until` event (see `read_events`)."""
        return await read_events(self.client, self.id, until, last_event_id)

    async def started(self) -> str:
        """The id of the first turn to reach a tool (waiting for it to get there)."""
        events = await self.events(named("tool.started"))
        return next(e.data["turn_id"] for e in events if e.name == "turn.started")

    async def get(self) -> dict[str, Any]:
        r = await self.client.get(self.path)
        assert r.status_code == 200, r.text
        return r.json()

    async def turns(self) -> list[dict[str, Any]]:
        return await self._items("/turns")

    async def messages(self) -> list[dict[str, Any]]:
        return await self._items("/messages")

    async def _items(self, tail: str) -> list[dict[str, Any]]:
        r = await self.client.get(self.path + tail, params={"limit": 1000})
        assert r.status_code == 200, r.text
        return r.json()["items"]


async def talk(client: httpx.AsyncClient, agent: str, content: str, *,
               bound: float = 15) -> tuple[Conversation, dict[str, Any]]:
    """A new conversation with `agent` and one message in it; the conversation and the turn's result."""
    conversation = await Conversation.create(client, agent)
    return conversation, await conversation.say(content, bound=bound)
