"""Security: API keys on every route, the bind refusal, request ids, limits, and no secret anywhere.

The auth matrix walks the server's own `/openapi.json`, which is generated
from the app's routes (`server.http.openapi`), so a route added later, `/mcp`
included, is covered without touching this file. The secret scan runs a real
`corral serve` process with JSON logs at debug level, feeds it secrets
through every `${VAR}` a definition can hold, runs turns that succeed and
fail, and then reads everything the server emitted: API bodies, SSE streams,
its log output and the bytes of its SQLite files.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from server.http import create_app
from server.settings import Settings
from tests.fakes import Call, FakeOpenAI, Reply, Status, serve
from tests.support.events import Event, ended, named, read_events, sse
from tests.support.servers import REPO as ROOT
from tests.support.servers import ServerProcess, clean_environ, corral_server
from tests.support.trees import gated_definitions, open_gate, write_tree

KEYS = ("key-one-3f9a1c7e52", "key-two-8d4b6e0a19")
WRONG = ({"Authorization": "Bearer key-three-nope"}, {"Authorization": f"Basic {KEYS[0]}"},
         {"Authorization": f"Bearer {KEYS[0]}{KEYS[1]}"}, {"Authorization": "Bearer"},
         {"Authorization": KEYS[0]})
SSE_PATHS = {"/v1/events"}  # the one route that answers a dummy request with a stream that never ends


def definitions(root: Path) -> Path:
    return write_tree(root, {
        "all.yaml": """
            kind: Model
            name: offline
            provider: scripted
            default: "echo: {input}"
            ---
            kind: Agent
            name: alpha
            model: offline
        """,
    })


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def error_code(response: httpx.Response) -> str:
    return response.json()["error"]["code"]


# --- the auth matrix ------------------------------------------------------------------


@pytest.fixture(scope="module")
def keyed_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("keyed")
    with corral_server(definitions(root / "defs"), root / "state", api_keys=f" {KEYS[0]} ,{KEYS[1]}") as url:
        yield url


def operations(client: httpx.Client) -> list[tuple[str, str]]:
    """Every (METHOD, path) of the served OpenAPI document, path parameters filled with dummies."""
    document = client.get("/openapi.json", headers=bearer(KEYS[0])).json()
    return [(method.upper(), re.sub(r"\{[^}]+\}", "dummy", path))
            for path, methods in document["paths"].items() for method in methods]


def test_the_matrix_walks_every_route(keyed_url: str) -> None:
    """Every method of every route the app serves, and nothing else (HEAD answers as GET does)."""
    routes = [r for r in create_app(Settings()).routes if isinstance(r, Route)]
    served = {(method, re.sub(r"\{[^}]+\}", "dummy", r.path))
              for r in routes for method in r.methods or () if method != "HEAD"}
    with httpx.Client(base_url=keyed_url, timeout=15, trust_env=False) as client:
        assert set(operations(client)) == served


def status_of(client: httpx.Client, method: str, path: str, headers: dict[str, str], body=None) -> int:
    # Streamed, so an SSE answer is judged by its status line and then dropped.
    with client.stream(method, path, headers=headers, json=body) as response:
        if path not in SSE_PATHS or response.status_code != 200:
            response.read()
        return response.status_code


def test_every_route_needs_a_key(keyed_url: str) -> None:
    with httpx.Client(base_url=keyed_url, timeout=15, trust_env=False) as client:
        ops = operations(client)
        assert len(ops) >= 25 and ("GET", "/healthz") in ops
        for method, path in ops:
            where = f"{method} {path}"
            if path == "/healthz":
                assert status_of(client, method, path, {}) == 200
                continue
            for headers in ({}, *WRONG):
                response = client.request(method, path, headers=headers)
                assert response.status_code == 401, (where, headers, response.text)
                assert error_code(response) == "unauthorized", where
                assert response.headers["www-authenticate"].startswith("Bearer")
                assert response.json()["error"]["request_id"] == response.headers["x-request-id"]
            for key in KEYS:
                assert status_of(client, method, path, bearer(key)) != 401, (where, key)


def test_mcp_needs_a_key_too(keyed_url: str) -> None:
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "security-test", "version": "1"}}}
    accept = {"Accept": "application/json, text/event-stream"}
    with httpx.Client(base_url=keyed_url, timeout=15, trust_env=False) as client:
        for headers in ({}, *WRONG):
            for method in ("GET", "POST", "DELETE"):
                response = client.request(method, "/mcp", headers=accept | headers, json=initialize)
                assert response.status_code == 401 and error_code(response) == "unauthorized", method
        for key in KEYS:
            assert status_of(client, "POST", "/mcp", accept | bearer(key), initialize) == 200


# --- the bind refusal -------------------------------------------------------------------


def test_a_public_bind_needs_keys_or_insecure(tmp_path: Path) -> None:
    """Three servers on 0.0.0.0, started side by side: no keys (refused), keys, --insecure."""
    defs = definitions(tmp_path / "defs")
    argv = [sys.executable, "-m", "server.cli", "serve", str(defs), "--host", "0.0.0.0", "--port", "0",
            "--no-watch"]
    env = clean_environ({"CORRAL_STATE_DIR": str(tmp_path / "refused")})
    refused = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    keyed = ServerProcess(defs, tmp_path / "keyed", env={"CORRAL_API_KEYS": ",".join(KEYS)}, host="0.0.0.0")
    insecure = ServerProcess(defs, tmp_path / "insecure", host="0.0.0.0", args=("--no-watch", "--insecure"))
    try:
        keyed.launch()
        insecure.launch()
        _, stderr = refused.communicate(timeout=60)
        with keyed, insecure, httpx.Client(timeout=10, trust_env=False) as client:
            assert client.get(keyed.url + "/healthz").status_code == 200
            assert client.get(keyed.url + "/v1/agents").status_code == 401
            assert client.get(keyed.url + "/v1/agents", headers=bearer(KEYS[1])).status_code == 200
            assert client.get(insecure.url + "/v1/agents").status_code == 200
            keyed.terminate()
            insecure.terminate()
    finally:
        refused.kill()
    assert refused.returncode != 0
    assert "refusing to bind 0.0.0.0" in stderr and "CORRAL_API_KEYS" in stderr
    assert not (tmp_path / "refused" / "corral.db").exists()  # it stopped before opening anything
    assert "WARNING" not in keyed.stderr
    assert "WARNING: serving 0.0.0.0 WITHOUT authentication" in insecure.stderr


# --- request ids, body limits, the turn cap ------------------------------------------------


@pytest.fixture(scope="module")
def small_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("small")
    with corral_server(definitions(root / "defs"), root / "state", max_body_bytes=2048) as url:
        yield url


def test_request_ids_are_echoed_and_kept(small_url: str) -> None:
    with httpx.Client(base_url=small_url, timeout=15, trust_env=False) as client:
        first = client.get("/v1/conversations/conv_missing")
        second = client.get("/v1/conversations/conv_missing")
        assert first.status_code == 404 and error_code(first) == "conversation_not_found"
        rid = first.headers["x-request-id"]
        assert re.fullmatch(r"req_[0-9a-f]{20}", rid) and first.json()["error"]["request_id"] == rid
        assert second.headers["x-request-id"] != rid
        for path in ("/v1/conversations/conv_missing", "/no/such/route"):
            mine = client.get(path, headers={"X-Request-ID": "client.chosen-id_42"})
            assert mine.status_code == 404
            assert mine.headers["x-request-id"] == "client.chosen-id_42"
            assert mine.json()["error"]["request_id"] == "client.chosen-id_42"
        assert client.get("/healthz", headers={"X-Request-ID": "ok-1"}).headers["x-request-id"] == "ok-1"
        for insane in ("has spaces in it", "x" * 65, "semi;colon"):
            replaced = client.get("/v1/agents/nobody", headers={"X-Request-ID": insane})
            assert replaced.headers["x-request-id"].startswith("req_")
            assert replaced.json()["error"]["request_id"] == replaced.headers["x-request-id"]


def test_bodies_over_the_limit_get_413(small_url: str) -> None:
    with httpx.Client(base_url=small_url, timeout=15, trust_env=False) as client:
        created = client.post("/v1/conversations", json={"agent": "alpha", "title": "t" * 400})
        assert created.status_code == 201, created.text
        cid = created.json()["id"]
        declared = client.post(f"/v1/conversations/{cid}/messages", json={"content": "x" * 3000})

        def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is counted as bytes arrive
            yield b'{"content": "'
            for _ in range(10):
                yield b"y" * 512
            yield b'"}'

        streamed = client.post(f"/v1/conversations/{cid}/messages", content=chunks(),
                               headers={"Content-Type": "application/json"})
        for response in (declared, streamed):
            assert response.status_code == 413 and error_code(response) == "payload_too_large"
            assert response.json()["error"]["request_id"] == response.headers["x-request-id"]
        assert client.get(f"/v1/conversations/{cid}/turns").json()["items"] == []
        fits = client.post(f"/v1/conversations/{cid}/messages", json={"content": "z" * 1500})
        assert fits.status_code == 200 and fits.json()["output"] == "echo: " + "z" * 1500


@pytest.mark.anyio
async def test_the_concurrent_turn_cap_answers_503(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    defs = gated_definitions(tmp_path / "defs")
    with corral_server(defs, tmp_path / "state", max_concurrent_turns=1) as url:
        async with httpx.AsyncClient(base_url=url, timeout=20, trust_env=False) as client:
            a, b = [(await client.post("/v1/conversations", json={"agent": "gated"})).json()["id"]
                    for _ in range(2)]
            answers: dict[str, httpx.Response] = {}

            async def slow() -> None:
                answers["a"] = await client.post(f"/v1/conversations/{a}/messages",
                                                 json={"content": f"wait {gate}"})

            try:
                with anyio.fail_after(20):
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(slow)
                        await read_events(client, a, named("tool.started"))
                        refused = await client.post(f"/v1/conversations/{b}/messages", json={"content": "hi"})
                        open_gate(gate)
            finally:
                open_gate(gate)
            assert refused.status_code == 503 and error_code(refused) == "overloaded", refused.text
            assert answers["a"].json()["status"] == "completed"
            assert (await client.get(f"/v1/conversations/{b}/turns")).json()["items"] == []
            after = await client.post(f"/v1/conversations/{b}/messages", json={"content": "hi"})
            assert after.status_code == 200 and after.json()["output"] == "echo: hi"


# --- the secret scan -------------------------------------------------------------------

SECRETS = {
    "SCAN_MODEL_KEY": "sk-scan-model-5b1e0c93d7aa",
    "SCAN_HTTP_TOKEN": "tok-scan-http-8c2f4a61e0bb",
    "SCAN_URL_KEY": "key-scan-url-9e7d5c3b1aee",
    "SCAN_CMD_ENV": "env-scan-cmd-3d9b7e52a4cc",
    "SCAN_MCP_ENV": "env-scan-mcp-6a0c1f83b9dd",
    # Referenced by no definition: the server's own key and a provider key it merely has.
    "OPENAI_API_KEY": "sk-canary-openai-27f4c9e18b3d",
    "CORRAL_API_KEYS": "canary-corral-key-one-7d21,canary-corral-key-two-4e98",
}
CLIENT_KEY = "canary-corral-key-one-7d21"
# Prints the environment of every process above it, the server's included: whatever a tool prints,
# no secret may come back. (No braces: argv elements are templates.)
ANCESTORS = """import os
pid = os.getppid()
while pid > 1:
    try:
        print(open("/proc/%d/environ" % pid, "rb").read().replace(b"\\0", b"\\n").decode("latin-1"))
        stat = open("/proc/%d/stat" % pid).read()
    except OSError:
        break
    pid = int(stat.rsplit(")", 1)[1].split()[1])
"""
MODEL_KEY, HTTP_TOKEN, URL_KEY = (SECRETS[k] for k in ("SCAN_MODEL_KEY", "SCAN_HTTP_TOKEN", "SCAN_URL_KEY"))
DUMP = "import os, sys; print('token=' + os.environ['TOKEN']); print('bad ' + os.environ['TOKEN'], " \
       "file=sys.stderr); sys.exit(int(sys.argv[1]))"
TURNS = [  # what each turn of the scan asks the fake model to do
    (Reply(calls=(Call("probe", {"what": "echo"}, id="c1"),)), Reply(text="t1")),
    (Reply(calls=(Call("probe", {"what": "fail"}, id="c2"),)), Reply(text="t2")),
    (Reply(calls=(Call("env_dump", {"code": "0"}, id="c3"), Call("env_dump", {"code": "3"}, id="c4"))),
     Reply(text="t3")),
    (Reply(calls=(Call("fixture__echo", {"text": "hi"}, id="c5"),)), Reply(text="t4")),
    (Reply(calls=(Call("env_all", {}, id="c6"), Call("ancestors", {}, id="c7"))), Reply(text="t5")),
    (Status(401, error_type="invalid_request_error", message=f"Incorrect API key provided: {MODEL_KEY}"),),
    (Status(500, message=f"upstream broke near {MODEL_KEY}"),),
]


class Upstream:
    """What the http tool calls: echoes the Authorization header and the query, in a 200 or a 500."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.app = Starlette(routes=[Route("/{what}", self.answer)])

    async def answer(self, request: Request) -> Response:
        sent = f"{request.headers.get('authorization', '')} {request.url.query}"
        self.seen.append(sent)
        if request.path_params["what"] == "fail":
            return PlainTextResponse(f"denied for {sent}", status_code=500)
        return JSONResponse({"you_sent": sent})


def scan_definitions(root: Path, model_url: str, upstream_url: str) -> Path:
    return write_tree(root, {"all.yaml": f"""
kind: Model
name: gpt
provider: openai
model: gpt-fake
base_url: {model_url}/v1
api_key: ${{SCAN_MODEL_KEY}}
retries: 0
timeout_s: 10
---
kind: Tool
name: probe
description: Call the upstream with a secret header.
input_schema: {{type: object, properties: {{what: {{type: string}}}}, required: [what]}}
http:
  url: "{upstream_url}/{{what}}?key=${{SCAN_URL_KEY}}"
  headers: {{Authorization: "Bearer ${{SCAN_HTTP_TOKEN}}"}}
---
kind: Tool
name: env_dump
description: Print a secret from the environment, and exit with a code.
input_schema: {{type: object, properties: {{code: {{type: string}}}}, required: [code]}}
command: {{argv: {json.dumps(["python3", "-c", DUMP, "{code}"])}, env: {{TOKEN: "${{SCAN_CMD_ENV}}"}}}}
---
kind: Tool
name: env_all
description: Print the whole environment the tool gets.
command: {{argv: [env]}}
---
kind: Tool
name: ancestors
description: Print the environment of every process above this one.
command: {{argv: {json.dumps(["python3", "-c", ANCESTORS])}}}
---
kind: MCPServer
name: fixture
command: {sys.executable}
args: [{ROOT / "tests" / "mcp_fixture_server.py"}]
env: {{FIXTURE_TOKEN: "${{SCAN_MCP_ENV}}"}}
timeout_s: 20
---
kind: Agent
name: leaky
model: gpt
tools: [probe, env_dump, env_all, ancestors, fixture]
"""})


async def drain_sse(response: httpx.Response, out: list[str], stop: Callable[[Event], bool]) -> None:
    """The events of a stream into `out` as text, up to the one `stop` accepts."""
    async for event in sse(response):
        out.append(f"{event.id} {event.name} {json.dumps(event.data)}")
        if stop(event):
            return


async def everything_served(client: httpx.AsyncClient) -> list[str]:
    """The body and headers of every read route, over every conversation and definition."""
    texts: list[str] = []

    async def read(method: str, path: str) -> httpx.Response:
        response = await client.request(method, path)
        assert response.status_code < 500, (path, response.text)
        texts.extend([response.text, str(response.headers)])
        return response

    for path in ("/openapi.json", "/healthz", "/readyz", "/metrics", "/v1/agents", "/v1/agents/leaky",
                 "/v1/agents/leaky/aliases", "/v1/definitions/history", "/v1/models"):
        await read("GET", path)
    await read("POST", "/v1/definitions/reload")
    for d in (await read("GET", "/v1/definitions")).json()["definitions"]:
        await read("GET", f"/v1/definitions/{d['kind'].lower()}/{d['name']}")
    for c in (await read("GET", "/v1/conversations")).json()["items"]:
        for tail in ("", "/messages", "/turns", "/permissions"):
            await read("GET", f"/v1/conversations/{c['id']}{tail}")
        turns = (await client.get(f"/v1/conversations/{c['id']}/turns")).json()["items"]
        async with client.stream("GET", f"/v1/conversations/{c['id']}/events") as events:
            await drain_sse(events, texts, ended(turns[-1]["id"]))  # the replay reached the last turn
    return texts


@pytest.mark.anyio
async def test_no_secret_value_leaves_the_server(tmp_path: Path) -> None:
    fake, upstream = FakeOpenAI(), Upstream()
    with serve(fake.app) as model_url, serve(upstream.app) as upstream_url:
        defs = scan_definitions(tmp_path / "defs", model_url, upstream_url)
        env = SECRETS | {"CORRAL_LOG_FORMAT": "json", "CORRAL_LOG_LEVEL": "debug"}
        with ServerProcess(defs, tmp_path / "state", env=env) as server:
            texts = await exercise(server.url, fake)
            server.terminate()
    texts.append(server.stderr)
    for path in sorted((tmp_path / "state").rglob("*")):
        if path.is_file():
            texts.append(path.read_bytes().decode("latin-1"))
    # The secrets were used: the model and the upstream got them, the command printed its own.
    assert {r.headers.get("authorization") for r in fake.requests} == {f"Bearer {MODEL_KEY}"}
    assert upstream.seen == [f"Bearer {HTTP_TOKEN} key={URL_KEY}"] * 2
    assert "token=[redacted]" in "".join(texts)
    assert not [s for s in SECRETS.values() for r in fake.requests if s in json.dumps(r.body)]
    for name, value in SECRETS.items():
        leaks = [text[max(0, i - 80): i + 80] for text in texts if (i := text.find(value)) >= 0]
        assert not leaks, f"{name} leaked: {leaks}"


async def only_a_minimal_environment(client: httpx.AsyncClient, cid: str) -> None:
    """The `env` tool saw PATH and HOME, and nothing of the server's: no CORRAL_* but its call's
    execution key (§7, §9), no provider key."""
    messages = (await client.get(f"/v1/conversations/{cid}/messages", params={"limit": 1000})).json()["items"]
    [env_out, ancestors_out] = [m["content"] for m in messages if m["role"] == "tool"][-2:]
    names = {line.split("=", 1)[0] for line in env_out.splitlines() if "=" in line}
    assert "PATH" in names, env_out
    assert {n for n in names if n.startswith("CORRAL_")} == {"CORRAL_EXECUTION_KEY"}, env_out
    assert not names & {"OPENAI_API_KEY", *SECRETS}, env_out
    # the server's environment was there to read, and came back with its keys cut out
    assert "CORRAL_API_KEYS=[redacted]" in ancestors_out, ancestors_out[:2000]
    assert "OPENAI_API_KEY=[redacted]" in ancestors_out


async def exercise(url: str, fake: FakeOpenAI) -> list[str]:
    """Turns that succeed and fail, streamed and not, plus the OpenAI-compatible route; every body."""
    texts: list[str] = []
    async with httpx.AsyncClient(base_url=url, timeout=30, trust_env=False,
                                 headers={"Authorization": f"Bearer {CLIENT_KEY}"}) as client, \
            anyio.create_task_group() as tg:
        subscribed = anyio.Event()

        async def server_events() -> None:
            async with client.stream("GET", "/v1/events") as events:
                subscribed.set()
                await drain_sse(events, texts, lambda event: False)

        with anyio.fail_after(60):
            tg.start_soon(server_events)
            await subscribed.wait()
            cid = (await client.post("/v1/conversations", json={"agent": "leaky"})).json()["id"]
            outcomes = []
            for scenarios in TURNS:
                fake.script(*scenarios)
                answer = await client.post(f"/v1/conversations/{cid}/messages", json={"content": "go"})
                texts.append(answer.text)
                outcomes.append(answer.json()["status"])
            assert outcomes == ["completed"] * 5 + ["failed"] * 2, texts
            await only_a_minimal_environment(client, cid)
            fake.script(Reply(text="streamed"))
            async with client.stream("POST", f"/v1/conversations/{cid}/messages",
                                     json={"content": "go", "stream": True}) as streamed:
                texts.append((await streamed.aread()).decode())
            fake.script(Reply(text="compat"))
            compat = await client.post("/v1/chat/completions", json={
                "model": "leaky", "messages": [{"role": "user", "content": "go"}]})
            assert compat.status_code == 200, compat.text
            texts += [compat.text, *await everything_served(client)]
            tg.cancel_scope.cancel()
    assert fake.pending == 0
    return texts
