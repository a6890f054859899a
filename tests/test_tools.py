"""Command and HTTP tools against real processes and a real loopback HTTP server.

Every tool is compiled from a small definition directory by the real
compiler, so argv file resolution (`files`) is exercised end to end.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import uvicorn
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from server.compiler.compiler import Compiler
from server.compiler.definitions import ToolDefinition
from server.compiler.templates import placeholders
from server.errors import DefinitionsInvalid
from server.tools.base import MAX_OUTPUT_BYTES, ToolContext, ToolOutput
from server.tools.command import CommandTool
from server.tools.http import RESPONSE_LIMIT, HttpTool
from tests.support.processes import alive, wait_until

PY = sys.executable
ARGV_PY = "import json, sys\nprint(json.dumps(sys.argv[1:]))\n"
# Starts a grandchild that sleeps, records its pid (atomically) in argv[1], then exits or sleeps.
GROUP_PY = """import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(child.pid))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
print("started")
if sys.argv[2] == "wait":
    time.sleep(60)
"""
TOKEN = "tok-5ecret-abcdef"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def compile_tool(root: Path, spec: dict[str, Any], files: dict[str, str] | None = None,
                 where: str = "tools.yaml") -> tuple[ToolDefinition, Path]:
    """Write one Tool document (and `files`) under `root`, compile, return the tool and the root."""
    for rel, text in (files or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / where).parent.mkdir(parents=True, exist_ok=True)
    # Every placeholder used is declared, as the compiler requires; none is required.
    schema = {"type": "object", "properties": {name: {} for name in _placeholders(spec)}}
    (root / where).write_text(yaml.safe_dump({"kind": "Tool", "name": "t", "input_schema": schema, **spec}))
    compiler = Compiler(root)
    try:
        definition = compiler.compile().get("Tool", "t")
    except DefinitionsInvalid as exc:
        raise AssertionError("\n".join(map(str, exc.errors))) from None
    assert isinstance(definition, ToolDefinition)
    return definition, compiler.root


def _placeholders(value: Any) -> set[str]:
    if isinstance(value, str):
        return set(placeholders(value))
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return {name for item in items for name in _placeholders(item)}


def context(root: Path, environ: dict[str, str] | None = None) -> ToolContext:
    return ToolContext(conversation_id="c", turn_id="t", agent="a", digest="sha256:0", root=root,
                       environ=environ or {})


async def run_command(root: Path, command: dict[str, Any], arguments: dict[str, Any],
                      files: dict[str, str] | None = None, environ: dict[str, str] | None = None,
                      bound: float = 15) -> ToolOutput:
    definition, root = compile_tool(root, {"command": command}, files)
    with anyio.fail_after(bound):
        return await CommandTool(definition).call(arguments, context(root, environ))


# --- command tools ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_argument_values_stay_single_literal_argv_entries(tmp_path: Path) -> None:
    markers = [tmp_path / f"pwned-{i}" for i in range(3)]
    values = {
        "semi": f"; touch {markers[0]}", "subst": f"$(touch {markers[1]})", "tick": f"`touch {markers[2]}`",
        "spaces": "a b  c", "newline": "one\ntwo", "dash": "-rf", "help": "--help", "secretish": "${HOME}",
        "braces": "{semi}", "n": 3, "obj": {"k": [1, "x"]},
    }
    argv = [PY, "argv.py", *(f"{{{name}}}" for name in values), "--name={spaces}", "{{literal}}"]
    output = await run_command(tmp_path, {"argv": argv}, values, {"argv.py": ARGV_PY})
    assert not output.is_error, output.content
    expected = [*(v for v in values.values() if isinstance(v, str)), "3", '{"k":[1,"x"]}',
                "--name=a b  c", "{literal}"]
    assert json.loads(output.content) == expected
    assert not any(marker.exists() for marker in markers)


@pytest.mark.anyio
async def test_a_nul_in_a_value_is_a_tool_error_not_dropped(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    argv = [PY, "-c", "import pathlib, sys; pathlib.Path(sys.argv[1]).write_text(sys.argv[2])",
            str(marker), "before-{text}-after"]
    output = await run_command(tmp_path / "defs", {"argv": argv}, {"text": "a\0b"})
    assert output == ToolOutput("argv[4] holds a NUL byte, which a command argument cannot carry",
                                is_error=True)
    assert not marker.exists()  # the command did not run with a shortened argument


@pytest.mark.anyio
async def test_files_resolve_under_root_and_cwd_is_relative_to_it(tmp_path: Path) -> None:
    where_py = "import json, os, sys\nprint(json.dumps([sys.argv[0], os.getcwd()]))\n"
    (tmp_path / "work").mkdir()
    definition, root = compile_tool(
        tmp_path, {"command": {"argv": [PY, "../scripts/where.py"], "cwd": "../work"}},
        {"scripts/where.py": where_py}, where="tools/t.yaml",
    )
    assert set(definition.files) == {"scripts/where.py"}
    with anyio.fail_after(15):
        output = await CommandTool(definition).call({}, context(root))
    assert json.loads(output.content) == [str(root / "scripts/where.py"), str(root / "work")]


@pytest.mark.anyio
async def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    command = {"argv": [PY, "group.py", "{pidfile}", "wait"], "timeout_s": 2}
    output = await run_command(tmp_path, command, {"pidfile": str(pidfile)}, {"group.py": GROUP_PY})
    assert output == ToolOutput("timed out after 2s", is_error=True)
    pid = int(pidfile.read_text())
    await wait_until(lambda: not alive(pid))


@pytest.mark.anyio
async def test_cancelled_caller_kills_the_whole_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    command = {"argv": [PY, "group.py", "{pidfile}", "wait"], "timeout_s": 60}
    definition, root = compile_tool(tmp_path, {"command": command}, {"group.py": GROUP_PY})
    with anyio.fail_after(15):
        async with anyio.create_task_group() as group:
            group.start_soon(CommandTool(definition).call, {"pidfile": str(pidfile)}, context(root))
            await wait_until(pidfile.exists, bound=10)
            group.cancel_scope.cancel()
    pid = int(pidfile.read_text())
    await wait_until(lambda: not alive(pid))


@pytest.mark.anyio
async def test_background_children_do_not_outlive_a_finished_command(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    command = {"argv": [PY, "group.py", "{pidfile}", "exit"], "timeout_s": 60}
    # The grandchild holds stdout open; the call must still end when its parent does.
    output = await run_command(tmp_path, command, {"pidfile": str(pidfile)}, {"group.py": GROUP_PY})
    assert output == ToolOutput("started\n")
    pid = int(pidfile.read_text())
    await wait_until(lambda: not alive(pid))


@pytest.mark.anyio
async def test_output_is_capped_and_full_pipes_never_block(tmp_path: Path) -> None:
    size = 3 * MAX_OUTPUT_BYTES
    script = f"import sys\nsys.stderr.write('e' * {2 * 1024 * 1024})\nsys.stdout.write('o' * {size})\n"
    output = await run_command(tmp_path, {"argv": [PY, "big.py"]}, {}, {"big.py": script})
    assert output.content.startswith("o" * MAX_OUTPUT_BYTES)
    assert output.content.endswith(f"[output truncated: {size} bytes, limit {MAX_OUTPUT_BYTES}]")


@pytest.mark.anyio
async def test_nonzero_exit_is_an_error_with_the_tail_of_stderr(tmp_path: Path) -> None:
    script = "import sys\nprint('partial')\nsys.stderr.write('early\\n' + 'y' * 10000 + '\\nthe reason')\n" \
             "sys.exit(3)\n"
    output = await run_command(tmp_path, {"argv": [PY, "fail.py"]}, {}, {"fail.py": script})
    assert output.is_error
    assert output.content.startswith("command failed (exit code 3)")
    assert output.content.endswith("the reason")
    assert "early" not in output.content and len(output.content) < 5000


@pytest.mark.anyio
async def test_env_secrets_reach_the_process_and_are_redacted_from_output_and_the_server_env_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CORRAL_TEST_SERVER_VAR", "from-the-server")
    monkeypatch.setenv("SOME_SERVER_VAR", "also-from-the-server")
    script = ("import json, os\ne = os.environ\nprint(json.dumps([e['TOKEN'], e['TOKEN'][::-1], e['REGION'],"
              " e['PLAIN'], e.get('CORRAL_TEST_SERVER_VAR'), e.get('SOME_SERVER_VAR'), 'PATH' in e]))\n")
    env = {"TOKEN": "${CORRAL_TEST_TOKEN}", "REGION": "${CORRAL_TEST_REGION:-eu-west-1}", "PLAIN": "plain"}
    output = await run_command(tmp_path, {"argv": [PY, "env.py"], "env": env}, {}, {"env.py": script},
                               environ={"CORRAL_TEST_TOKEN": TOKEN})
    assert json.loads(output.content) == ["[redacted]", TOKEN[::-1], "eu-west-1", "plain", None, None, True]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ({"argv": [PY, "-c", "pass", "{text}"]}, "missing value for placeholder {text}"),
        ({"argv": [PY, "-c", "pass"], "env": {"K": "${CORRAL_UNSET_VAR}"}},
         "environment variable CORRAL_UNSET_VAR is not set"),
        ({"argv": ["corral-no-such-program"]}, "program not found: corral-no-such-program"),
    ],
)
async def test_call_failures_are_tool_errors(tmp_path: Path, command: dict, expected: str) -> None:
    output = await run_command(tmp_path, command, {})
    assert output == ToolOutput(expected, is_error=True)


# --- http tools ---------------------------------------------------------------------------------


@dataclass
class Loopback:
    url: str
    seen: dict[str, dict[str, Any]] = field(default_factory=dict)  # path -> last request


def loopback_app(seen: dict[str, dict[str, Any]]) -> Starlette:
    async def echo(request: Request) -> Response:
        record = {
            "method": request.method,
            "raw_path": request.scope["raw_path"].decode(),
            "query": request.scope["query_string"].decode(),
            "headers": dict(request.headers),
            "body": (await request.body()).decode(),
        }
        seen[request.url.path] = record
        return JSONResponse(record)

    async def status(request: Request) -> Response:
        return PlainTextResponse(f"no luck for {request.url}", status_code=request.path_params["code"])

    async def big(request: Request) -> Response:
        async def chunks() -> Any:
            for _ in range(40):
                yield b"z" * 65536

        return StreamingResponse(chunks())

    async def slow(request: Request) -> Response:
        with anyio.move_on_after(10):
            while not await request.is_disconnected():
                await anyio.sleep(0.05)
        return PlainTextResponse("late")

    methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]
    return Starlette(routes=[
        Route("/echo/{rest:path}", echo, methods=methods),
        Route("/status/{code:int}", status),
        Route("/big", big),
        Route("/slow", slow),
    ])


@pytest.fixture(scope="module")
def loopback() -> Iterator[Loopback]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)  # listening before the thread starts: connections queue until it accepts
    seen: dict[str, dict[str, Any]] = {}
    app = loopback_app(seen)
    config = uvicorn.Config(app, lifespan="off", log_level="warning", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    yield Loopback(f"http://127.0.0.1:{sock.getsockname()[1]}", seen)
    server.should_exit = True
    thread.join(10)
    sock.close()


async def call_http(root: Path, http: dict[str, Any], arguments: dict[str, Any],
                    environ: dict[str, str] | None = None, bound: float = 10) -> ToolOutput:
    definition, root = compile_tool(root, {"http": http})
    async with httpx.AsyncClient(trust_env=False) as client:
        with anyio.fail_after(bound):
            return await HttpTool(definition, client).call(arguments, context(root, environ))


@pytest.mark.anyio
async def test_url_values_are_percent_encoded_in_place(tmp_path: Path, loopback: Loopback) -> None:
    http = {"url": loopback.url + "/echo/{q}?q={q}&n={n}"}
    output = await call_http(tmp_path, http, {"q": "a b/c?d&e", "n": 7})
    assert not output.is_error, output.content
    seen = json.loads(output.content)
    assert seen["raw_path"] == "/echo/a%20b%2Fc%3Fd%26e"
    assert seen["query"] == "q=a%20b%2Fc%3Fd%26e&n=7"


@pytest.mark.anyio
async def test_headers_carry_secrets_that_never_come_back(tmp_path: Path, loopback: Loopback) -> None:
    http = {"url": loopback.url + "/echo/headers", "headers": {"Authorization": "Bearer ${API_TOKEN}",
                                                               "X-User": "{user}"}}
    output = await call_http(tmp_path, http, {"user": "ann"}, {"API_TOKEN": TOKEN})
    headers = loopback.seen["/echo/headers"]["headers"]
    assert headers["authorization"] == f"Bearer {TOKEN}" and headers["x-user"] == "ann"
    assert TOKEN not in output.content and "Bearer [redacted]" in output.content


@pytest.mark.anyio
async def test_header_values_with_line_breaks_are_refused(tmp_path: Path, loopback: Loopback) -> None:
    http = {"url": loopback.url + "/echo/crlf", "headers": {"X-User": "{user}"}}
    output = await call_http(tmp_path, http, {"user": "ann\r\nX-Evil: 1"})
    assert output == ToolOutput("header X-User: value contains a line break", is_error=True)
    assert "/echo/crlf" not in loopback.seen


@pytest.mark.anyio
async def test_a_nul_in_a_value_is_kept_in_a_url_and_refused_in_a_header(tmp_path: Path,
                                                                        loopback: Loopback) -> None:
    encoded = await call_http(tmp_path / "a", {"url": loopback.url + "/echo/{q}"}, {"q": "a\0b"})
    assert json.loads(encoded.content)["raw_path"] == "/echo/a%00b"  # nothing dropped
    http = {"url": loopback.url + "/echo/nul", "headers": {"X-User": "{user}"}}
    output = await call_http(tmp_path / "b", http, {"user": "ann\0x"})
    assert output == ToolOutput("header X-User: value contains a NUL byte", is_error=True)
    assert "/echo/nul" not in loopback.seen


@pytest.mark.anyio
async def test_json_body_strings_are_templated(tmp_path: Path, loopback: Loopback) -> None:
    body = {"query": "{q}", "limit": "{n}", "tags": ["pre-{q}", "{{raw}}"], "fixed": True,
            "auth": {"user": "${API_USER}"}}
    http = {"method": "post", "url": loopback.url + "/echo/json", "body": body}
    output = await call_http(tmp_path, http, {"q": 'say "hi"', "n": 5}, {"API_USER": "bob"})
    assert not output.is_error, output.content
    assert json.loads(loopback.seen["/echo/json"]["body"]) == {
        "query": 'say "hi"', "limit": 5, "tags": ['pre-say "hi"', "{raw}"], "fixed": True,
        "auth": {"user": "bob"},
    }


@pytest.mark.anyio
async def test_unused_arguments_are_the_json_body_of_a_post(tmp_path: Path, loopback: Loopback) -> None:
    http = {"method": "POST", "url": loopback.url + "/echo/items/{id}"}
    await call_http(tmp_path, http, {"id": "x1", "name": "n", "count": 2})
    assert json.loads(loopback.seen["/echo/items/x1"]["body"]) == {"name": "n", "count": 2}
    await call_http(tmp_path, {"url": loopback.url + "/echo/get/{id}"}, {"id": "x1", "name": "n"})
    assert loopback.seen["/echo/get/x1"]["body"] == ""


@pytest.mark.anyio
async def test_string_body_is_templated_text(tmp_path: Path, loopback: Loopback) -> None:
    http = {"method": "PUT", "url": loopback.url + "/echo/text", "body": "hello {name}\n"}
    await call_http(tmp_path, http, {"name": "ann"})
    seen = loopback.seen["/echo/text"]
    assert seen["body"] == "hello ann\n" and seen["headers"]["content-type"].startswith("text/plain")


@pytest.mark.anyio
async def test_non_2xx_is_an_error_with_a_redacted_excerpt(tmp_path: Path, loopback: Loopback) -> None:
    http = {"url": loopback.url + "/status/418?key=${API_TOKEN}&q={q}"}
    output = await call_http(tmp_path, http, {"q": "x"}, {"API_TOKEN": TOKEN})
    assert output.is_error
    first, excerpt = output.content.split("\n", 1)
    assert first == f"HTTP 418 I'm a Teapot from GET {loopback.url}/status/418?key=${{API_TOKEN}}&q=x"
    assert excerpt == f"no luck for {loopback.url}/status/418?key=[redacted]&q=x"


@pytest.mark.anyio
async def test_response_is_capped(tmp_path: Path, loopback: Loopback) -> None:
    output = await call_http(tmp_path, {"url": loopback.url + "/big"}, {})
    assert not output.is_error
    marker = f"\n[response truncated: more than {RESPONSE_LIMIT} bytes]"
    assert output.content == "z" * RESPONSE_LIMIT + marker


@pytest.mark.anyio
async def test_timeout_is_an_error(tmp_path: Path, loopback: Loopback) -> None:
    output = await call_http(tmp_path, {"url": loopback.url + "/slow", "timeout_s": 0.3}, {})
    assert output == ToolOutput(f"GET {loopback.url}/slow: timed out after 0.3s", is_error=True)


@pytest.mark.anyio
async def test_connection_errors_never_show_the_secret(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port that was free a moment ago, with nothing listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/p/${{API_TOKEN}}?key=${{API_TOKEN}}"
    output = await call_http(tmp_path, {"url": url}, {}, {"API_TOKEN": TOKEN})
    assert output.is_error and TOKEN not in output.content
    assert output.content.startswith(f"GET {url}: ConnectError")


@pytest.mark.anyio
async def test_http_missing_values_are_tool_errors(tmp_path: Path, loopback: Loopback) -> None:
    output = await call_http(tmp_path, {"url": loopback.url + "/echo/{q}"}, {})
    assert output == ToolOutput("missing value for placeholder {q}", is_error=True)
    output = await call_http(tmp_path, {"url": loopback.url + "/echo/x?k=${CORRAL_UNSET_VAR}"}, {})
    assert output == ToolOutput("environment variable CORRAL_UNSET_VAR is not set", is_error=True)
