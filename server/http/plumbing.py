"""Request and response plumbing shared by every route: JSON bodies, errors, pages, SSE."""

from __future__ import annotations

import base64
import json
import logging
import re
from collections.abc import AsyncIterator
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..clock import iso  # noqa: F401  (re-exported for the routes)
from ..errors import CorralError, RequestError, envelope, forms
from ..logs import request_id
from ..providers.wellformed import has_lone_surrogate

log = logging.getLogger("corral.http")
Body = TypeVar("Body", bound=BaseModel)
MAX_JSON_DEPTH = 64
# A lone surrogate arrives as a `\uD800`-`\uDFFF` escape, or as raw bytes (json decodes a body with
# "surrogatepass"): an ASCII body without such an escape has none and is not walked. The parser joins
# a pair of escapes into one character, so a surrogate left in a parsed string is a lone one.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
STARLETTE_CODES = {404: "not_found", 405: "method_not_allowed"}  # the HTTPExceptions its router raises


def error_response(exc: CorralError) -> JSONResponse:
    """The envelope of `exc`, with this request's id, at the table's status for its code."""
    return JSONResponse(exc.envelope(request_id.get()), status_code=exc.http_status)


async def corral_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, CorralError)
    return error_response(exc)


async def http_error_handler(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 (no route, or not this method) in our envelope; headers such as `Allow`
    are kept."""
    assert isinstance(exc, HTTPException)
    fallback = "internal" if exc.status_code >= 500 else "invalid_request"
    code = STARLETTE_CODES.get(exc.status_code, fallback)
    body = envelope(code, str(exc.detail), request_id=request_id.get())
    return JSONResponse(body, status_code=forms(code).http, headers=exc.headers)


async def internal_error_handler(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(CorralError("internal server error"))


async def read_json(request: Request, model: type[Body]) -> Body:
    """Parse and validate a JSON body; every failure is a 400 `invalid_request`.

    Nesting is capped at `MAX_JSON_DEPTH`: far deeper than any request needs, and shallow enough
    that nothing downstream (validation, storage, canonical JSON) can exhaust the stack.
    """
    raw = await request.body()
    try:
        data = json.loads(raw or b"null")
    except RecursionError:  # json's parser recurses per level: 100,000 `[` overflow the stack
        raise RequestError(f"body is nested more than {MAX_JSON_DEPTH} levels deep") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise RequestError("body must be a JSON object")
    if _deeper_than(data, MAX_JSON_DEPTH):  # parsed, it would still overflow whatever recurses on it later
        raise RequestError(f"body is nested more than {MAX_JSON_DEPTH} levels deep")
    if (not raw.isascii() or _SURROGATE_ESCAPE.search(raw)) and has_lone_surrogate(data):
        raise RequestError("body has a lone surrogate (U+D800 to U+DFFF, not part of a pair)")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        details = [{"field": ".".join(map(str, e["loc"])), "message": e["msg"]} for e in exc.errors()]
        raise RequestError("invalid request body", details=details) from None


def _deeper_than(data: Any, limit: int) -> bool:
    """Whether lists and objects nest more than `limit` deep; level by level, so nothing recurses."""
    level = [data]
    for _ in range(limit):
        level = [child for node in level if isinstance(node, (dict, list))
                 for child in (node.values() if isinstance(node, dict) else node)]
        if not level:
            return False
    return any(isinstance(node, (dict, list)) for node in level)


def page_params(request: Request, default: int = 50) -> tuple[int, str | None]:
    raw = request.query_params.get("limit", str(default))
    try:
        limit = int(raw)
    except ValueError:
        raise RequestError("limit must be an integer") from None
    if not 1 <= limit <= 1000:
        raise RequestError("limit must be between 1 and 1000")
    cursor = request.query_params.get("cursor")
    if not cursor:
        return limit, None
    try:
        # validate=True: a cursor with characters outside the alphabet is refused, not half-decoded
        padded = cursor.encode() + b"=" * (-len(cursor) % 4)
        position = base64.b64decode(padded, altchars=b"-_", validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        position = ""
    if not position:
        raise RequestError("cursor is not valid")
    return limit, position


def page(items: list[Any], limit: int, key) -> dict[str, Any]:
    """`{"items", "next_cursor"}` from `limit + 1` fetched rows."""
    more = len(items) > limit
    items = items[:limit]
    cursor = None
    if more and items:
        cursor = base64.urlsafe_b64encode(str(key(items[-1])).encode()).decode().rstrip("=")
    return {"items": items, "next_cursor": cursor}


def sse_frame(name: str, data: Any, event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class BrokenOff(Exception):
    """Raised by an event stream's frames that stop before the stream's end (the server stops): the
    response is broken off, not ended (`EventStreamResponse`)."""


class EventStreamResponse(StreamingResponse):
    """SSE. Frames that raise `BrokenOff` break the response off: no final chunk is sent and the
    server closes the connection (an ASGI app that returns without completing its response), so a
    client sees an error, never a clean end, and reconnects with `Last-Event-ID` (§8)."""

    async def stream_response(self, send: Any) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        try:
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except BrokenOff:
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def sse_response(frames: AsyncIterator[bytes], metrics=None) -> StreamingResponse:
    """Stream SSE frames; Starlette closes the generator when the client leaves. Frames that raise
    `BrokenOff` break the response off (`EventStreamResponse`)."""

    async def body() -> AsyncIterator[bytes]:
        if metrics is not None:
            metrics.streams.inc(amount=1)
        try:
            async for frame in frames:
                yield frame
        finally:
            if metrics is not None:
                metrics.streams.inc(amount=-1)

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return EventStreamResponse(body(), media_type="text/event-stream", headers=headers)


KEEP_ALIVE = b": keep-alive\n\n"
