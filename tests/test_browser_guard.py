"""No web page can drive a server it was not meant to (§7): Host, Origin, Content-Type, CORS, slow bodies.

Each request here is one a page in the developer's browser could make: a
`text/plain` or form POST (no CORS preflight needed), a DNS-rebinding page
(foreign Host), a foreign or `null` Origin. They run against real servers on
loopback, bound to 127.0.0.1 and to 127.0.0.2 (loopback too, so allowed
without keys).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.servers import REPO_DEFINITIONS, corral_server

CHAT = {"model": "assistant", "messages": [{"role": "user", "content": "count words in a b"}]}
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with corral_server(REPO_DEFINITIONS, tmp_path_factory.mktemp("guard") / "state") as base_url:
        yield base_url


def conversations(client: httpx.Client) -> list:
    return client.get("/v1/conversations").json()["items"]


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", None])
def test_a_body_that_is_not_json_runs_nothing(url: str, content_type: str | None) -> None:
    with httpx.Client(base_url=url) as client:
        before = len(conversations(client))
        headers = {"Content-Type": content_type} if content_type else {}
        for path in ("/v1/chat/completions", "/v1/conversations"):
            # a JSON text, as a page would send it: only the declared type differs
            body = json.dumps(CHAT | {"agent": "assistant"})
            answer = client.post(path, content=body, headers=headers)
            assert answer.status_code == 415, answer.text
            assert answer.json()["error"]["code"] == "unsupported_media_type"
        assert len(conversations(client)) == before  # no turn ran, nothing was created
        ok = client.post("/v1/chat/completions", json=CHAT,
                         headers={"Content-Type": "application/json; charset=utf-8"})
        assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8420", "127.0.0.1.evil.example",
                                  "localhost.evil.example:80", "[::ffff:8.8.8.8]:80"])
def test_a_foreign_host_is_refused_on_every_route(url: str, host: str) -> None:
    with httpx.Client(base_url=url, headers={"Host": host}) as client:
        for method, path, body in [("GET", "/v1/agents", None), ("GET", "/readyz", None),
                                   ("GET", "/v1/conversations", None),
                                   ("POST", "/v1/chat/completions", CHAT)]:
            answer = client.request(method, path, json=body)
            assert answer.status_code == 421, (path, answer.text)
            assert answer.json()["error"]["code"] == "host_not_allowed"
        mcp = client.post("/mcp", json=INITIALIZE, headers=MCP_HEADERS)
        assert mcp.status_code == 421, mcp.text


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "LOCALHOST", "127.0.0.2", "[::1]"])
def test_loopback_hosts_are_served(url: str, host: str) -> None:
    port = httpx.URL(url).port
    for value in (host, f"{host}:{port}"):
        with httpx.Client(base_url=url, headers={"Host": value}) as client:
            assert client.get("/v1/agents").status_code == 200, value
            assert client.post("/mcp", json=INITIALIZE, headers=MCP_HEADERS).status_code == 200, value


def test_a_bind_on_another_loopback_address_checks_host_too(tmp_path: Path) -> None:
    """127.0.0.2 is loopback (served without keys), so the Host rule holds there as well."""
    with corral_server(REPO_DEFINITIONS, tmp_path / "state", host="127.0.0.2") as url, \
            httpx.Client(base_url=url) as client:
        assert client.get("/v1/agents").status_code == 200
        evil = {"Host": "evil.example"}
        assert client.get("/v1/agents", headers=evil).status_code == 421
        assert client.post("/mcp", json=INITIALIZE, headers=MCP_HEADERS | evil).status_code == 421
        assert client.post("/mcp", json=INITIALIZE, headers=MCP_HEADERS).status_code == 200


def test_allowed_hosts_are_served(tmp_path: Path) -> None:
    with corral_server(REPO_DEFINITIONS, tmp_path / "state",
                       allowed_hosts="corral.internal, other.internal") as url, \
            httpx.Client(base_url=url) as client:
        assert client.get("/v1/agents", headers={"Host": "corral.internal:9000"}).status_code == 200
        assert client.get("/v1/agents", headers={"Host": "other.internal"}).status_code == 200
        assert client.get("/v1/agents", headers={"Host": "evil.example"}).status_code == 421


@pytest.mark.parametrize("origin", ["http://evil.example", "null", "http://localhost:3000",
                                    "https://127.0.0.1.evil.example"])
def test_a_foreign_origin_is_refused(url: str, origin: str) -> None:
    with httpx.Client(base_url=url, headers={"Origin": origin}) as client:
        for method, path, body in [("GET", "/v1/agents", None), ("GET", "/v1/conversations", None),
                                   ("POST", "/v1/chat/completions", CHAT), ("POST", "/mcp", INITIALIZE)]:
            headers = MCP_HEADERS if path == "/mcp" else {}
            answer = client.request(method, path, json=body, headers=headers)
            assert answer.status_code == 403, (path, answer.text)
            assert answer.json()["error"]["code"] == "forbidden"
            assert "access-control-allow-origin" not in answer.headers
        preflight = client.options("/v1/chat/completions", headers={
            "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
        assert preflight.status_code == 403
        assert "access-control-allow-origin" not in preflight.headers


def test_the_servers_own_origin_is_served(url: str) -> None:
    with httpx.Client(base_url=url, headers={"Origin": url}) as client:
        assert client.get("/v1/agents").status_code == 200
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
        assert "access-control-allow-origin" not in client.get("/v1/agents").headers  # CORS stays closed


def test_cors_origins_open_cors_to_those_origins_only(tmp_path: Path) -> None:
    app_origin = "https://app.example.com"
    origins = f"{app_origin},http://other.example"
    with corral_server(REPO_DEFINITIONS, tmp_path / "state", cors_origins=origins) as url, \
            httpx.Client(base_url=url) as client:
        preflight = client.options("/v1/chat/completions", headers={
            "Origin": app_origin, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type, idempotency-key"})
        assert preflight.status_code == 200, preflight.text
        assert preflight.headers["access-control-allow-origin"] == app_origin
        allowed = preflight.headers["access-control-allow-headers"].lower()
        assert {"authorization", "content-type", "idempotency-key"} <= {h.strip() for h in allowed.split(",")}
        answer = client.post("/v1/chat/completions", json=CHAT, headers={"Origin": app_origin})
        assert answer.status_code == 200
        assert answer.headers["access-control-allow-origin"] == app_origin
        assert "x-request-id" in answer.headers["access-control-expose-headers"].lower()
        # JSON only still holds for an allowed origin
        plain = client.post("/v1/chat/completions", content=b"{}",
                            headers={"Origin": app_origin, "Content-Type": "text/plain"})
        assert plain.status_code == 415
        assert client.get("/v1/agents", headers={"Origin": "http://evil.example"}).status_code == 403


def test_cors_preflight_needs_no_key_but_the_request_does(tmp_path: Path) -> None:
    app_origin = "https://app.example.com"
    with corral_server(REPO_DEFINITIONS, tmp_path / "state", cors_origins=app_origin,
                       api_keys="k1") as url, \
            httpx.Client(base_url=url) as client:
        preflight = client.options("/v1/agents", headers={
            "Origin": app_origin, "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "authorization"})
        assert preflight.status_code == 200
        assert client.get("/v1/agents", headers={"Origin": app_origin}).status_code == 401
        keyed = client.get("/v1/agents", headers={"Origin": app_origin, "Authorization": "Bearer k1"})
        assert keyed.status_code == 200


@pytest.mark.anyio
async def test_a_body_that_never_completes_is_answered_408(tmp_path: Path) -> None:
    with corral_server(REPO_DEFINITIONS, tmp_path / "state", body_timeout_s=0.5) as url:
        parsed = httpx.URL(url)
        with anyio.fail_after(10):
            stream = await anyio.connect_tcp(parsed.host, parsed.port)
            async with stream:
                await stream.send(b"POST /v1/conversations HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                  b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"agent\":")
                received = b""
                while True:  # the server answers, then closes: read to the end
                    try:
                        received += await stream.receive()
                    except (anyio.EndOfStream, anyio.BrokenResourceError):
                        break
        head = received.split(b"\r\n", 1)[0]
        assert head.startswith(b"HTTP/1.1 408"), received
        assert b"request_timeout" in received
        with httpx.Client(base_url=url) as client:  # and the server goes on serving
            assert client.get("/v1/agents").status_code == 200
