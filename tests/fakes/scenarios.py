"""What a fake model server is told to do next, and what it was sent.

A fake server holds a FIFO of scenarios: each request takes the next one (a
request that finds the queue empty gets a 400 `no_scenario`, so a test that
scripted too little fails loudly). Every request is recorded with its path,
headers (names lower-cased) and JSON body, before the scenario runs.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

STALL_LIMIT_S = 30.0  # a stalled stream ends by itself after this, whatever the client does


@dataclass(frozen=True)
class Call:
    """A tool call, its JSON arguments sent in `pieces` chunks."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str = "call_1"
    pieces: int = 3
    raw: str | None = None  # send this text as the arguments instead (e.g. something not JSON)

    @property
    def text(self) -> str:
        return self.raw if self.raw is not None else json.dumps(self.arguments)


@dataclass(frozen=True)
class Reply:
    """A streamed answer: `text` in `chunks` pieces, then `calls`, then usage."""

    text: str = ""
    calls: tuple[Call, ...] = ()
    chunks: int = 3
    usage: tuple[int, int] = (12, 7)  # input, output tokens
    stop: str | None = None  # the wire's stop reason; by default from the content


@dataclass(frozen=True)
class Status:
    """An HTTP error with the provider's JSON error body."""

    status: int
    retry_after: str | None = None
    error_type: str = "server_error"
    message: str = "scripted failure, do not quote this body"


@dataclass(frozen=True)
class Stall:
    """The first chunk of `text`, then silence until the client gives up."""

    text: str = "partial"


@dataclass(frozen=True)
class Cut:
    """The first chunk of `text`, then the stream ends cleanly without finishing."""

    text: str = "partial"


@dataclass(frozen=True)
class Malformed:
    """`text` (if any), then a data line that is not JSON."""

    text: str = ""


@dataclass(frozen=True)
class StreamError:
    """Anthropic only: an `error` event after `message_start`."""

    error_type: str = "overloaded_error"


Scenario = Reply | Status | Stall | Cut | Malformed | StreamError


@dataclass(frozen=True)
class Recorded:
    path: str
    headers: dict[str, str]
    body: Any


class ScriptedServer:
    """The queue and the record; subclasses build `app` and play scenarios."""

    def __init__(self) -> None:
        self._queue: deque[Scenario] = deque()
        self._lock = threading.Lock()
        self.requests: list[Recorded] = []

    def script(self, *scenarios: Scenario) -> None:
        with self._lock:
            self._queue.extend(scenarios)

    def reset(self) -> None:
        with self._lock:
            self._queue.clear()
            self.requests.clear()

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    async def take(self, request: Request) -> tuple[Any, Scenario | None]:
        """Record `request`; its JSON body and the next scenario (None when none is left)."""
        raw = await request.body()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        with self._lock:
            self.requests.append(Recorded(request.url.path, dict(request.headers), body))
            return body, (self._queue.popleft() if self._queue else None)


def split(text: str, parts: int) -> list[str]:
    """`text` in `parts` consecutive pieces (fewer when it is shorter)."""
    if not text:
        return []
    size = max(1, -(-len(text) // max(1, parts)))
    return [text[i : i + size] for i in range(0, len(text), size)]


def sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    payload = data if isinstance(data, str) else json.dumps(data)
    return f"{head}data: {payload}\n\n".encode()


def error_response(status: int, body: dict[str, Any], retry_after: str | None = None) -> JSONResponse:
    headers = {"retry-after": retry_after} if retry_after is not None else None
    return JSONResponse(body, status_code=status, headers=headers)
