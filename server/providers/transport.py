"""The model providers' HTTP client: one aiohttp session (a connection pool) per server.

Every other outbound request of Corral (http tools, hooks, A2A) goes through httpx; the model request
is the one made on every turn, and there aiohttp costs a third of httpx's client CPU for the same
streamed chat completion on the same loopback fake (`python -m bench clients`), which was the largest
single item of a turn's CPU (`python -m bench overhead --sample`, docs/performance.md). Its C HTTP
parser and its own stream reader do what h11, httpcore and anyio do in Python for httpx.

The session is made on first use, inside the loop that serves (aiohttp binds a session to its loop),
and closed with the server. Requests carry the current span's `traceparent`, as the httpx client's
request hook adds it elsewhere.
"""

from __future__ import annotations

import codecs
import functools
import re
import ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from urllib.parse import urlsplit
from urllib.request import getproxies_environment, proxy_bypass_environment

import aiohttp
import httpx

from ..tracing import carrier

CONNECTIONS = 1000  # at most, all hosts together; idle ones are kept for reuse
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


class ModelHTTP:
    """Streamed POSTs to model providers over one pooled aiohttp session."""

    def __init__(self, *, trust_env: bool = True) -> None:
        self.trust_env = trust_env  # HTTPS_PROXY, NO_PROXY, SSL_CERT_FILE..., as httpx honours them
        self._session: aiohttp.ClientSession | None = None

    def _opened(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=CONNECTIONS, ssl=_tls(self.trust_env))
            # aiohttp's own trust_env looks the proxy and ~/.netrc up in a worker thread on every
            # request (a thread hand-off per model call); the proxy is looked up once per origin here
            self._session = aiohttp.ClientSession(connector=connector, trust_env=False,
                                                  auto_decompress=True, raise_for_status=False)
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def __aenter__(self) -> ModelHTTP:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @asynccontextmanager
    async def post(self, url: str, body: bytes, headers: Mapping[str, str],
                   timeout_s: float) -> AsyncIterator[aiohttp.ClientResponse]:
        """POST `body` (JSON); `timeout_s` bounds the connection (a pool slot, a proxy, TLS included)
        and every read of the answer, so a stream that stalls midway fails too."""
        sent = {"content-type": "application/json", **carrier(), **headers}
        timeout = aiohttp.ClientTimeout(total=None, connect=timeout_s, sock_read=timeout_s)
        proxy = _proxy_for(url) if self.trust_env else None
        # never followed (as httpx did not): a redirect would carry the key (`x-api-key` is not among
        # the headers aiohttp drops across origins) and the whole conversation somewhere else
        async with self._opened().post(url, data=body, headers=sent, timeout=timeout, proxy=proxy,
                                       allow_redirects=False) as response:
            yield response


async def lines(response: aiohttp.ClientResponse) -> AsyncIterator[str]:
    """The body's lines as they arrive (ended by CRLF, LF or CR), decoded as UTF-8 (an invalid byte
    becomes U+FFFD); no limit on a line's length, unlike `StreamReader.readline`."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    buffer = ""
    async for chunk in response.content.iter_any():
        buffer += decoder.decode(chunk)
        held = buffer.endswith("\r")  # maybe half of a CRLF: its end decides after the next chunk
        *complete, buffer = _LINE_BREAK.split(buffer[:-1] if held else buffer)
        for line in complete:
            yield line
        if held:
            buffer += "\r"
    *complete, last = _LINE_BREAK.split(buffer + decoder.decode(b"", final=True))
    for line in complete:
        yield line
    if last:
        yield last


def _proxy_for(url: str) -> str | None:
    parts = urlsplit(url)
    return _proxy(parts.scheme, parts.hostname or "", parts.port)


@functools.lru_cache(maxsize=64)
def _proxy(scheme: str, host: str, port: int | None) -> str | None:
    """The proxy the environment names for this origin (`HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY`),
    unless `NO_PROXY` exempts it; read once per origin."""
    if proxy_bypass_environment(host if port is None else f"{host}:{port}"):
        return None
    proxies = getproxies_environment()
    proxy = proxies.get(scheme) or proxies.get("all")
    if proxy and "://" not in proxy:  # `proxy.corp:3128`, which httpx read as http://proxy.corp:3128
        proxy = "http://" + proxy
    return proxy or None


def _tls(trust_env: bool) -> ssl.SSLContext:
    """The certificates httpx trusts (`SSL_CERT_FILE`, `SSL_CERT_DIR`, else certifi's bundle), made by
    httpx itself: a provider trusted before, and a deployment's own CA, are trusted still."""
    return httpx.create_ssl_context(trust_env=trust_env)
