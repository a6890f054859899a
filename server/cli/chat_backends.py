"""Where `corral chat` runs its turns: in this process (`Local`) or on a server (`Remote`, `--url`).

Both give `Chat` the same calls: start a conversation, send a message and stream its events,
answer a permission request, interrupt the running turn, fork the conversation (and go on in the
fork), compact its context and say how full it is. Not responsible for the terminal.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from .. import logs
from ..errors import CorralError, RequestError
from ..settings import Settings
from ..store.ownership import Claim
from .terminal import one_line

OnEvent = Callable[[str, dict[str, Any]], Awaitable[None]]
REQUEST_TIMEOUT = httpx.Timeout(30.0, connect=10.0)
STREAM_TIMEOUT = httpx.Timeout(None, connect=10.0)  # a turn takes as long as it takes
WHO = "corral chat"


class Local:
    """The agent in this process: the service's conversations and its permission broker."""

    def __init__(self, settings: Settings, owned: Claim | None = None):
        self.settings = settings
        self.owned = owned  # the state directory's lock, taken by the caller: released on close
        self.service: Any = None
        self.conversation_id = ""

    @asynccontextmanager
    async def open(self, agent: str) -> AsyncIterator[str]:
        from ..service import open_service

        log_file = _log_to_file(self.settings)
        try:
            async with open_service(self.settings) as service:
                self.service = service
                conversation = await service.conversations.create(agent, WHO, {"source": "chat"})
                self.conversation_id = conversation.id
                yield (f"{conversation.agent_name} {conversation.digest[:19]}... conversation "
                       f"{conversation.id}; log {log_file}")
        finally:
            if self.owned is not None:
                self.owned.release()

    async def turn(self, text: str, on_event: OnEvent) -> None:
        conversations = self.service.conversations
        turn = await conversations.send(self.conversation_id, text, if_busy="enqueue")
        async for event in conversations.events(self.conversation_id, after=turn.started_seq - 1,
                                                until_turn=turn.id):
            if event is not None:
                await on_event(event.name, event.data)

    async def decide(self, request_id: str, allow: bool) -> str | None:
        """Answer a permission request; a message when it could not be (decided already, expired)."""
        try:
            await self.service.permissions.decide(self.conversation_id, request_id, allow, WHO)
        except RequestError as exc:
            return exc.message
        return None

    async def interrupt(self) -> None:
        await self.service.conversations.interrupt(self.conversation_id)

    @property
    def conversation(self) -> str:
        return self.conversation_id

    async def fork(self) -> str:
        """Fork the whole conversation and go on in the fork; its id."""
        forked = await self.service.conversations.fork(self.conversation_id)
        self.conversation_id = forked.id
        return forked.id

    async def compact(self) -> dict[str, Any]:
        return await self.service.conversations.compact(self.conversation_id)

    async def context(self) -> dict[str, Any]:
        return await self.service.conversations.context(self.conversation_id)


def _log_to_file(settings: Settings) -> Path:
    """Send the log (MCP servers' stderr included) to the state directory, not to the terminal."""
    path = settings.state_dir / "chat.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    logs.configure(settings.log_level, settings.log_format)
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(path.open("a", encoding="utf-8"))
    return path


class Remote:
    """The agent on a Corral server, through its HTTP API."""

    def __init__(self, url: str, key: str | None, owner: Any = None):
        self.url = url
        self.owner = owner  # the pid of the server that owns the state directory, when that is why
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.client: httpx.AsyncClient | None = None
        self.path = ""

    @asynccontextmanager
    async def open(self, agent: str) -> AsyncIterator[str]:
        async with httpx.AsyncClient(base_url=self.url, headers=self.headers,
                                     timeout=REQUEST_TIMEOUT) as client:
            self.client = client
            body = {"agent": agent, "title": WHO, "metadata": {"source": "chat"}}
            created = await self._call("/v1/conversations", body, expect=201)
            self.path = f"/v1/conversations/{created['id']}"
            owning = f" (pid {self.owner}, which owns the state directory)" if self.owner else ""
            yield f"{created.get('agent_name', agent)} {str(created.get('digest'))[:19]}... " \
                  f"conversation {created['id']} on {self.url}{owning}"

    async def _call(self, path: str, body: dict[str, Any] | None = None, expect: int = 200) -> Any:
        assert self.client is not None
        response = await self.client.post(path, json=body)
        if response.status_code != expect:
            raise refused(response, self.url)
        return response.json()

    async def turn(self, text: str, on_event: OnEvent) -> None:
        assert self.client is not None
        body = {"content": text, "stream": True, "if_busy": "enqueue"}
        async with self.client.stream("POST", f"{self.path}/messages", json=body,
                                      timeout=STREAM_TIMEOUT) as response:
            if response.status_code != 200:
                await response.aread()
                raise refused(response, self.url)
            async for name, data in _sse(response.aiter_lines()):
                await on_event(name, data)

    async def decide(self, request_id: str, allow: bool) -> str | None:
        try:
            await self._call(f"{self.path}/permissions/{request_id}",
                             {"decision": "allow" if allow else "deny"})
        except CorralError as exc:
            if exc.code not in ("conflict", "not_found"):
                raise
            return exc.message
        return None

    async def interrupt(self) -> None:
        await self._call(f"{self.path}/interrupt")

    @property
    def conversation(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    async def fork(self) -> str:
        """Fork the whole conversation and go on in the fork; its id."""
        forked = await self._call(f"{self.path}/fork", {}, expect=201)
        self.path = f"/v1/conversations/{forked['id']}"
        return str(forked["id"])

    async def compact(self) -> dict[str, Any]:
        return await self._call(f"{self.path}/compact")

    async def context(self) -> dict[str, Any]:
        assert self.client is not None
        response = await self.client.get(f"{self.path}/context")
        if response.status_code != 200:
            raise refused(response, self.url)
        return response.json()


async def _sse(lines: AsyncIterator[str]) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """Server-sent events as (name, data), data parsed as JSON."""
    name, data = "message", []
    async for line in lines:
        if not line:
            if data:
                yield name, json.loads("\n".join(data))
            name, data = "message", []
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[6:] if line.startswith("data: ") else line[5:])


def refused(response: httpx.Response, url: str) -> CorralError:
    """A server's error answer as one line, with the code it carries (the exit status is that code's)."""
    try:
        error = response.json()["error"]
        code, message = str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):  # not Corral's envelope: not a Corral server there
        kind = response.headers.get("content-type", "no content type").split(";")[0]
        code, message = "unreachable", f"not a Corral server? (answered {kind})"
    return CorralError(f"{url}: {response.status_code} {response.reason_phrase}: {one_line(message)}",
                       code=code)


# --- the terminal ----------------------------------------------------------------------------------


