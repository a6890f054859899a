"""What the HTTP providers share: one streamed POST read as Server-Sent Events.

`post_events` sends the request and yields the events of the response; every
way that can fail becomes a `ProviderError`: 429 and 5xx are retryable (with
`retry_after` from the `Retry-After` header), other 4xx are not, and time-outs
and broken connections are. Messages name the model, the provider and the
status; they never quote a response body (only an error `type`/`code` when it
is a plain identifier) and never hold a key.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import anyio

from ..canonical import freeze
from ..compiler.definitions import ModelDefinition
from ..compiler.templates import MissingSecret, resolve_secrets
from ..errors import ProviderError
from .transport import ModelHTTP, lines

_IDENTIFIER = re.compile(r"[A-Za-z0-9_.-]{1,64}")
DRAIN_S = 1.0  # how long a stream whose reply is complete may take to end


@dataclass(frozen=True, slots=True)
class Event:
    name: str
    data: str


def describe(definition: ModelDefinition, provider: str, url: str) -> str:
    """How error messages name a model: `model 'fast' (openai, api.openai.com)`."""
    return f"model {definition.name!r} ({provider}, {urlsplit(url).hostname})"


def api_key(definition: ModelDefinition, environ: Mapping[str, str], label: str) -> str | None:
    """The key, resolved now; a missing variable is named, never a value."""
    if not definition.api_key:
        return None
    try:
        return resolve_secrets(definition.api_key, environ)
    except MissingSecret as missing:
        raise ProviderError(f"{label}: environment variable {missing.args[0]} is not set") from None


def parse_arguments(text: str) -> Any:
    """Tool-call arguments from the pieces the wire sent: a JSON object, else the raw text."""
    if not text.strip():
        return freeze({})
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return freeze(value) if isinstance(value, dict) else text


def identifier(value: Any) -> str:
    """`value` when it is a plain identifier (an error type or code), else ""; never free text."""
    return value if isinstance(value, str) and _IDENTIFIER.fullmatch(value) else ""


def parse_json(data: str, label: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise malformed(label)
    return value


def malformed(label: str) -> ProviderError:
    return ProviderError(f"{label}: malformed chunk in the response stream", retryable=True)


async def post_events(
    client: ModelHTTP,
    url: str,
    *,
    body: dict[str, Any],
    headers: dict[str, str],
    timeout_s: float,
    label: str,
) -> AsyncIterator[Event]:
    """POST `body` as JSON (see `encode_body`) and yield the SSE events of the answer."""
    try:
        async with client.post(url, encode_body(body), headers, timeout_s) as response:
            if response.status >= 300:  # a redirect is not followed: an error, never retried
                raise await _status_error(response, label)
            async for event in _events(lines(response)):
                yield event
    except TimeoutError as exc:  # aiohttp's time-outs are TimeoutErrors (and ClientErrors): first
        raise ProviderError(f"{label}: timed out after {timeout_s:g}s", retryable=True) from exc
    except aiohttp.ClientError as exc:
        raise ProviderError(f"{label}: connection failed ({type(exc).__name__})", retryable=True) from exc


def dumps(value: Any) -> str:
    """JSON as httpx sent it: compact, UTF-8, and no NaN (which no JSON parser reads back)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


class Fragments(list):
    """A list of values already encoded as JSON texts, put into a body as they are."""


def encode_body(body: dict[str, Any]) -> bytes:
    """`body` as JSON; a `Fragments` value is joined, not encoded again."""
    parts = [dumps(key) + ":" + (f"[{','.join(value)}]" if isinstance(value, Fragments) else dumps(value))
             for key, value in body.items()]
    return ("{" + ",".join(parts) + "}").encode()


class EncodedCache:
    """Each value's JSON text, kept by the value's identity (checked, so a reused `id` never hits).

    A conversation's history is the same message objects turn after turn (the runtime's transcript
    cache), so each is encoded once, not once per turn: a long conversation's request is mostly a join.
    The oldest entries go first once `size` are kept; they hold their values, so no id is reused.
    """

    def __init__(self, encode: Callable[[Any], str], size: int = 20_000):
        self.encode = encode
        self.size = size
        self._entries: dict[int, tuple[Any, str]] = {}

    def __call__(self, value: Any) -> str:
        hit = self._entries.get(id(value))
        if hit is not None and hit[0] is value:
            return hit[1]
        text = self.encode(value)
        if len(self._entries) >= self.size:
            del self._entries[next(iter(self._entries))]
        self._entries[id(value)] = (value, text)
        return text


class PrefixCache:
    """A history's messages as JSON texts, kept by the history's first message: the next request of
    the conversation repeats the same message objects and adds a few, so only those are encoded.

    The end of the last request may come back as other objects (the turn's own messages, read back
    from the store), so the longest run of the same objects is found from its end, then checked
    object by object from the start (a compacted or repaired history shares none: encoded anew)."""

    def __init__(self, encode: Callable[[Any], str], size: int = 1000):
        self.encode = encode
        self.size = size
        # id of the first message -> (the messages, which stay alive so no id is reused; their texts)
        self._entries: dict[int, tuple[tuple[Any, ...], list[str]]] = {}

    def __call__(self, messages: tuple[Any, ...]) -> str:
        if not messages:
            return ""
        cached = self._entries.pop(id(messages[0]), None)
        texts: list[str] = []
        if cached is not None:
            prefix, known = cached
            same = min(len(prefix), len(messages))
            while same and prefix[same - 1] is not messages[same - 1]:
                same -= 1
            if same and all(map(operator.is_, prefix[:same], messages[:same])):
                texts = known[:same]
        texts += map(self.encode, messages[len(texts):])
        if len(self._entries) >= self.size:
            del self._entries[next(iter(self._entries))]
        self._entries[id(messages[0])] = (tuple(messages), texts)
        return ",".join(texts)


async def drain(events: AsyncIterator[Event]) -> None:
    """Read what is left of a stream whose reply is complete: normally nothing but its end.

    A response read to its end puts its connection back in the client's pool; one
    closed early drops it, and the next call pays a new TCP (and TLS) handshake. A
    server that keeps the stream going anyway is dropped after `DRAIN_S`; whatever it
    still sends, or a failure at that point, is ignored: the reply is already whole.
    """
    with anyio.move_on_after(DRAIN_S):
        try:
            async for _ in events:
                pass
        except ProviderError:
            pass


async def _events(lines: AsyncIterator[str]) -> AsyncIterator[Event]:
    name, data = "", []
    async for line in lines:
        if not line:
            if data:
                yield Event(name or "message", "\n".join(data))
            name, data = "", []
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            name = value
        elif field == "data":
            data.append(value)
    if data:  # a last event without its blank line: keep it rather than lose the end
        yield Event(name or "message", "\n".join(data))


async def _status_error(response: aiohttp.ClientResponse, label: str) -> ProviderError:
    status = response.status
    retryable = status in (408, 429) or status >= 500
    kind = _error_kind(await response.read())
    return ProviderError(
        f"{label}: HTTP {status}" + (f" {kind}" if kind else ""),
        retryable=retryable,
        retry_after=retry_after(response.headers) if retryable else None,
        status=status,
    )


def _error_kind(content: bytes) -> str:
    """The body's `error.code` or `error.type`, when it is a plain identifier; else nothing."""
    try:
        error = json.loads(content).get("error")
    except (ValueError, AttributeError):
        return ""
    if not isinstance(error, dict):
        return ""
    return identifier(error.get("code")) or identifier(error.get("type"))


def retry_after(headers: Mapping[str, str]) -> float | None:
    """`Retry-After` in seconds, from either of its two forms (seconds or an HTTP date)."""
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    return max(0.0, seconds) if seconds == seconds else None  # NaN is no answer
