"""HTTP tools: one request built from templates, one capped response.

The `url`, header values and `body` strings are templates. In the URL each
`{param}` value is percent-encoded in its place (a `/`, `?` or `&` in a value
stays inside its segment); header values are filled as text and may not
contain a line break or a NUL byte. A `body` that is a mapping or list is sent as JSON, its
strings filled (a string that is exactly one `{param}` takes the value with
its JSON type); a `body` string is filled and sent as text. `${VAR}` secret
references are resolved at call time from `ctx.environ`, and their values are
redacted from everything the tool returns: errors name the URL as written,
with `${VAR}` in place of the value.

A call with an execution key sends it as `Idempotency-Key` (the same on every
attempt of the call, so an API that deduplicates on it does the work once),
unless the tool's own `headers` set that header: the author's value wins.

The response is read up to `response_limit` bytes (1 MiB) and no further.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import anyio
import httpx

from ..compiler.definitions import ToolDefinition
from ..compiler.templates import SECRET_REF, MissingSecret, MissingValue, placeholders, render
from ..messages import ToolSpec
from .base import ToolContext, ToolOutput
from .command import redact, resolve_tracked

RESPONSE_LIMIT = 1024 * 1024
EXCERPT_BYTES = 1000
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_WHOLE_PLACEHOLDER = re.compile(r"^\{([A-Za-z_][A-Za-z0-9_]*)\}$")
IDEMPOTENCY_HEADER = "Idempotency-Key"


class RequestFailed(Exception):
    """The request could not be built or sent; the message is safe to show the model."""


def _quote(value: str) -> str:
    return quote(value, safe="")


@dataclass
class _Filler:
    """Fills templates from one call's arguments, resolving and remembering secrets."""

    arguments: Mapping[str, Any]
    environ: Mapping[str, str]
    secrets: set[str] = field(default_factory=set)

    def text(self, template: str, encode: Callable[[str], str] = str) -> str:
        # Placeholders and secrets are filled piecewise, so that neither a value nor a secret
        # is ever read as a template: `{x}` inside a secret, `${X}` inside a value stay literal.
        parts, pos = [], 0
        for match in SECRET_REF.finditer(template):
            parts.append(render(template[pos : match.start()], self.arguments, encode))
            parts.append(resolve_tracked(match.group(0), self.environ, self.secrets))
            pos = match.end()
        parts.append(render(template[pos:], self.arguments, encode))
        return "".join(parts)

    def json(self, body: Any) -> Any:
        if isinstance(body, str):
            whole = _WHOLE_PLACEHOLDER.match(body)
            if whole is None:
                return self.text(body)
            if self.arguments.get(whole.group(1)) is None:
                raise MissingValue(whole.group(1))
            return self.arguments[whole.group(1)]
        if isinstance(body, Mapping):
            return {key: self.json(value) for key, value in body.items()}
        if isinstance(body, list | tuple):
            return [self.json(item) for item in body]
        return body


@dataclass(frozen=True)
class _Request:
    method: str
    url: str
    shown_url: str  # the URL with `${VAR}` as written: what errors may name
    headers: dict[str, str]
    body: dict[str, Any]  # `content=` or `json=` for httpx, or nothing


class HttpTool:
    """A `Tool` definition with an `http` action, as a `ToolPort`."""

    def __init__(
        self,
        definition: ToolDefinition,
        client: httpx.AsyncClient,
        *,
        response_limit: int = RESPONSE_LIMIT,
    ):
        if definition.http is None:
            raise ValueError(f"tool {definition.name!r} has no http action")
        self.definition = definition
        self.http = definition.http
        self.client = client
        self.response_limit = response_limit
        self.method = str(self.http.get("method", "GET")).upper()
        self.timeout = float(self.http.get("timeout_s", 30.0))
        self.spec = ToolSpec(definition.name, definition.description, definition.input_schema)
        self.replay_safe = definition.replay_safe
        headers = self.http.get("headers", {})
        templates = [self.http["url"], *headers.values(), *_strings(self.http.get("body"))]
        self.used = frozenset(name for template in templates for name in placeholders(template))
        self.own_idempotency_key = any(name.lower() == IDEMPOTENCY_HEADER.lower() for name in headers)

    async def call(self, arguments: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        filler = _Filler(arguments, ctx.environ)
        try:
            request = self._build(filler, ctx.execution_key)
            return await self._send(request, filler.secrets)
        except MissingValue as exc:
            return ToolOutput(f"missing value for placeholder {{{exc.args[0]}}}", is_error=True)
        except MissingSecret as exc:
            return ToolOutput(f"environment variable {exc.args[0]} is not set", is_error=True)
        except RequestFailed as exc:
            return ToolOutput(redact(str(exc), filler.secrets), is_error=True)

    def _build(self, filler: _Filler, execution_key: str = "") -> _Request:
        url = filler.text(self.http["url"], _quote)
        headers = {}
        for name, template in self.http.get("headers", {}).items():
            value = filler.text(template)
            if "\r" in value or "\n" in value:
                raise RequestFailed(f"header {name}: value contains a line break")
            if "\0" in value:
                raise RequestFailed(f"header {name}: value contains a NUL byte")
            headers[name] = value
        if execution_key and not self.own_idempotency_key:
            headers[IDEMPOTENCY_HEADER] = execution_key
        body = self.http.get("body")
        if body is None:
            # No body written: for POST/PUT/PATCH the arguments no placeholder used are the
            # JSON body, so a tool can be as short as `url` + `input_schema`. GET and DELETE
            # send no body; their arguments reach the server only through placeholders.
            unused = {k: v for k, v in filler.arguments.items() if k not in self.used}
            content = {"json": unused} if self.method in _BODY_METHODS and unused else {}
        elif isinstance(body, str):
            content = {"content": filler.text(body).encode()}
            if not any(name.lower() == "content-type" for name in headers):
                headers["Content-Type"] = "text/plain; charset=utf-8"
        else:
            content = {"json": filler.json(body)}
        shown = render(self.http["url"], filler.arguments, _quote)
        return _Request(self.method, url, shown, headers, content)

    async def _send(self, request: _Request, secrets: set[str]) -> ToolOutput:
        where = f"{request.method} {request.shown_url}"
        try:
            with anyio.fail_after(self.timeout):
                async with self.client.stream(
                    request.method, request.url, headers=request.headers, timeout=self.timeout, **request.body
                ) as response:
                    limit = self.response_limit if response.is_success else EXCERPT_BYTES
                    data, truncated = await _read(response, limit)
        except (TimeoutError, httpx.TimeoutException):
            raise RequestFailed(f"{where}: timed out after {self.timeout:g}s") from None
        except httpx.InvalidURL:
            raise RequestFailed(f"{where}: invalid URL") from None
        except httpx.HTTPError as exc:
            raise RequestFailed(f"{where}: {_describe(exc)}") from None
        text = _decode(data, response)
        if not response.is_success:
            excerpt = text.strip() + (" [...]" if truncated else "")
            message = f"HTTP {response.status_code} {response.reason_phrase} from {where}"
            return ToolOutput(redact(message + (f"\n{excerpt}" if excerpt else ""), secrets), is_error=True)
        if truncated:
            text += f"\n[response truncated: more than {limit} bytes]"
        return ToolOutput(redact(text, secrets))


def _strings(body: Any) -> list[str]:
    if isinstance(body, str):
        return [body]
    if isinstance(body, Mapping):
        return [s for value in body.values() for s in _strings(value)]
    if isinstance(body, list | tuple):
        return [s for item in body for s in _strings(item)]
    return []


async def _read(response: httpx.Response, limit: int) -> tuple[bytes, bool]:
    """At most `limit` bytes of the (decoded) body, and whether there was more."""
    data = bytearray()
    async for chunk in response.aiter_bytes():
        data += chunk
        if len(data) > limit:
            return bytes(data[:limit]), True
    return bytes(data), False


def _decode(data: bytes, response: httpx.Response) -> str:
    try:
        return data.decode(response.charset_encoding or "utf-8", errors="replace")
    except LookupError:
        return data.decode("utf-8", errors="replace")


def _describe(exc: httpx.HTTPError) -> str:
    # Never str(exc): httpx messages may quote the URL, and with it a resolved secret.
    # The operating system's reason (e.g. "Connection refused") is safe and useful.
    reason = type(exc).__name__
    cause: BaseException | None = exc
    for _ in range(6):
        cause = cause.__cause__ or cause.__context__ if cause else None
        if isinstance(cause, OSError) and cause.strerror:
            return f"{reason}: {cause.strerror}"
    return reason
