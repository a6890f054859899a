"""ASGI middleware that guards every route: API keys, body size and body time.

Written as plain ASGI (not BaseHTTPMiddleware) so streaming responses pass
through untouched and the cost per request stays a few attribute reads.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import re
import uuid
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import envelope, forms
from ..logs import request_id

OPEN_PATHS = frozenset({"/healthz"})
# The console's page and static files (§7): they hold no data, and the page asks for a key itself.
CONSOLE = "/console"
_REQUEST_ID = re.compile(rb"^[A-Za-z0-9._-]{1,64}$")


async def reject(send: Send, code: str, message: str, headers=()) -> None:
    """Answer before the app runs: the error envelope with the request's id, at the table's status."""
    body = json.dumps(envelope(code, message, request_id=request_id.get())).encode()
    await send({"type": "http.response.start", "status": forms(code).http,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


def is_open(path: str) -> bool:
    """Whether `path` is answered without a key: /healthz, and the console's page and files."""
    return path in OPEN_PATHS or path == CONSOLE or path.startswith(CONSOLE + "/")


class ApiKeys:
    """With keys configured, every route but /healthz and the console's page and files needs
    `Authorization: Bearer KEY`."""

    def __init__(self, app: ASGIApp, keys: tuple[str, ...], also_open: Callable[[str], bool] | None = None):
        self.app = app
        self.keys = tuple(k.encode() for k in keys)
        self.also_open = also_open  # paths published without a key by a setting (A2A cards)

    def _allowed(self, scope: Scope) -> bool:
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() != b"bearer":
                    return False
                token = token.strip()
                # compare against every key, always, so timing says nothing about which matched
                return sum(hmac.compare_digest(token, k) for k in self.keys) > 0
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or is_open(scope["path"]) or (
                self.also_open is not None and scope["method"] == "GET" and self.also_open(scope["path"])):
            return await self.app(scope, receive, send)
        if not self._allowed(scope):
            return await reject(send, "unauthorized", "missing or invalid API key",
                                 [(b"www-authenticate", b'Bearer realm="corral"')])
        return await self.app(scope, receive, send)


class BodyLimit:
    """Bodies over `limit` bytes get 413 `payload_too_large`, declared or streamed; a body that has
    not fully arrived `timeout_s` after the request began gets 408 `request_timeout` (or, once a
    response has started, its connection closed), so a slow sender cannot hold a connection forever."""

    def __init__(self, app: ASGIApp, limit: int, timeout_s: float = 30.0):
        self.app = app
        self.limit = limit
        self.timeout_s = timeout_s
        self._too_large = f"request body is larger than {limit} bytes"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                return await reject(send, "payload_too_large", self._too_large)
        body = _BodyReader(receive, self.limit, asyncio.get_running_loop().time() + self.timeout_s)
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, body.receive, tracking_send)
        except _TooLarge:
            if not started:
                await reject(send, "payload_too_large", self._too_large)
        except _TooSlow:
            if not started:
                await reject(send, "request_timeout",
                             f"the request body did not arrive within {self.timeout_s:g}s",
                             [(b"connection", b"close")])


class _BodyReader:
    """`receive` for the app: counts body bytes and holds each wait for them to the deadline."""

    def __init__(self, receive: Receive, limit: int, deadline: float):
        self._receive = receive
        self.limit = limit
        self.deadline = deadline
        self.seen = 0
        self.complete = False

    async def receive(self) -> Message:
        if self.complete:  # past the body, receive only waits for the client to leave: no deadline
            return await self._receive()
        try:  # asyncio's own timeout (uvicorn serves on asyncio): half an anyio cancel scope's 11 µs
            async with asyncio.timeout_at(self.deadline):
                message = await self._receive()
        except TimeoutError:
            raise _TooSlow() from None
        if message["type"] == "http.request":
            self.seen += len(message.get("body", b""))
            if self.seen > self.limit:
                raise _TooLarge()
            self.complete = not message.get("more_body", False)
        return message


class _TooSlow(Exception):
    pass


class _TooLarge(Exception):
    pass


class RequestIds:
    """Give every request an id (the client's X-Request-ID when sane), echoed in the response."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"x-request-id", b"")
        rid = given.decode() if _REQUEST_ID.match(given) else "req_" + uuid.uuid4().hex[:20]
        token = request_id.set(rid)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-request-id", rid.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            request_id.reset(token)
