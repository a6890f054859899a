"""Schemas never reach out and never stall the server (CONTRACT §7).

A JSON Schema from a request (the OpenAI route's `response_format`) or a
definition (`output_schema`, `input_schema`) resolves `$ref` only inside
itself: a reference to a URL (here a loopback server that records every hit)
or a `file:` path is a 400, or a compile error at the field's line, and is
never fetched. A pattern that a backtracking engine takes exponential time
on is matched in linear time, so the server keeps answering.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.fakes import Reply, serve
from tests.support.fake_models import Fakes
from tests.support.servers import REPO, ServerProcess
from tests.support.trees import write_tree

pytestmark = pytest.mark.anyio


class Recorder:
    """A loopback server that answers every GET with a JSON Schema and records the paths asked for."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        self.app = Starlette(routes=[Route("/{path:path}", self._answer)])

    async def _answer(self, request: Request) -> JSONResponse:
        self.hits.append(request.url.path)
        return JSONResponse({"type": "string", "const": "internal-secret"})


@pytest.fixture(scope="module")
def recorder() -> Iterator[tuple[Recorder, str]]:
    recording = Recorder()
    with serve(recording.app) as url:
        yield recording, url


@pytest.fixture(scope="module")
def fakes() -> Fakes:
    return Fakes()


def definitions(root: Path, openai_url: str) -> Path:
    return write_tree(root, {"defs.yaml": f"""
        kind: Model
        name: gpt
        provider: openai
        model: gpt-fake
        base_url: {openai_url}/v1
        api_key: ${{CORRAL_TEST_OPENAI_KEY}}
        timeout_s: 5
        retries: 0
        ---
        kind: Agent
        name: plain
        model: gpt
    """})


@pytest.fixture(scope="module")
def base_url(fakes: Fakes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("confinement")
    # a process of its own: a server that froze on a pattern would freeze the test too in this one
    with serve(fakes.openai.app) as openai_url, ServerProcess(
            definitions(root / "defs", openai_url), root / "state",
            env={"CORRAL_TEST_OPENAI_KEY": "sk-fake-openai"}) as server:
        yield server.url


@pytest.fixture
async def client(base_url: str, fakes: Fakes) -> AsyncIterator[httpx.AsyncClient]:
    async with fakes.client(base_url) as http:
        yield http


async def complete(client: httpx.AsyncClient, schema: dict[str, Any]) -> httpx.Response:
    body = {"model": "plain", "messages": [{"role": "user", "content": "answer"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}}
    with anyio.fail_after(30):
        return await client.post("/v1/chat/completions", json=body)


def refused(response: httpx.Response, says: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request" and says in error["message"], error


async def test_a_remote_ref_is_refused_and_never_fetched(client: httpx.AsyncClient, fakes: Fakes,
                                                        recorder: tuple[Recorder, str]) -> None:
    recording, url = recorder
    for schema in ({"$ref": f"{url}/schema.json"},
                   {"type": "object", "properties": {"a": {"$ref": f"{url}/deep#/x"}}},
                   {"$id": f"{url}/root.json", "properties": {"a": {"$ref": "sibling.json"}}},
                   {"$ref": f"file://{REPO / 'pyproject.toml'}"},
                   {"$ref": "file:///etc/hostname"}):
        refused(await complete(client, schema), "does not resolve inside the schema")
    assert recording.hits == []  # nothing was fetched, not even once
    assert fakes.openai.requests == []  # refused before any turn


async def test_references_inside_the_schema_still_work(client: httpx.AsyncClient, fakes: Fakes,
                                                       recorder: tuple[Recorder, str]) -> None:
    recording, url = recorder
    fakes.openai.script(Reply(text='{"city": 5}'), Reply(text='{"city": "Oslo"}'))
    schema = {"$id": f"{url}/place.json", "type": "object", "required": ["city"],
              "properties": {"city": {"$ref": "#/$defs/name"}},
              "$defs": {"name": {"$ref": "place.json#/$defs/text"}, "text": {"type": "string"}}}
    response = await complete(client, schema)
    assert response.status_code == 200, response.text
    assert json.loads(response.json()["choices"][0]["message"]["content"]) == {"city": "Oslo"}
    assert "is not of type 'string'" in fakes.openai.requests[1].body["messages"][-1]["content"]
    assert recording.hits == []


async def test_a_backtracking_pattern_does_not_stall_the_server(client: httpx.AsyncClient,
                                                                fakes: Fakes) -> None:
    # Python's `re` takes about 2**n steps to fail `^(a+)+$` on n a's and a "!", holding the GIL:
    # with 40 of them, a server that matched with it would answer nothing for days.
    evil = "a" * 40 + "!"
    fakes.openai.script(Reply(text=json.dumps({"s": evil, evil: 1})),
                        Reply(text=json.dumps({"s": "aaa", "a": 1})))
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}},
              "patternProperties": {"^(a+)+$": {"type": "integer"}}, "additionalProperties": False}
    async with anyio.create_task_group() as tasks:
        answers: list[httpx.Response] = []

        async def ask() -> None:
            answers.append(await complete(client, schema))
        tasks.start_soon(ask)
        with anyio.fail_after(30):
            health = await client.get("/healthz")
    assert health.status_code == 200
    [response] = answers
    assert response.status_code == 200, response.text
    assert json.loads(response.json()["choices"][0]["message"]["content"]) == {"s": "aaa", "a": 1}
    repair = fakes.openai.requests[1].body["messages"][-1]["content"]
    assert "does not match '^(a+)+$'" in repair and "not match any of the regexes" in repair


@pytest.mark.parametrize("pattern", ["^(?=a)b", "(a)\\1"])
async def test_a_pattern_that_needs_backtracking_is_refused(client: httpx.AsyncClient,
                                                            pattern: str) -> None:
    response = await complete(client, {"type": "object", "properties": {"s": {"pattern": pattern}}})
    refused(response, "cannot be matched in bounded time")
    assert response.json()["error"]["details"]["path"] == ["properties", "s", "pattern"]


# --- definitions: a compile error at the field ------------------------------------------------------


def validate(root: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    return subprocess.run([sys.executable, "-m", "server.cli", "validate", str(root)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)


def test_a_remote_ref_in_a_definition_is_a_compile_error(tmp_path: Path,
                                                         recorder: tuple[Recorder, str]) -> None:
    recording, url = recorder
    root = write_tree(tmp_path / "defs", {"defs.yaml": f"""
        kind: Model
        name: m
        provider: scripted
        ---
        kind: Agent
        name: typed
        model: m
        output_schema:
          type: object
          properties:
            a: {{$ref: "{url}/output.json"}}
        ---
        kind: Tool
        name: fetch
        command: {{argv: [echo, hi]}}
        input_schema:
          type: object
          properties:
            path: {{$ref: "file:///etc/hostname"}}
    """})
    result = validate(root)
    assert result.returncode != 0, result.stdout
    errors = [line for line in (result.stdout + result.stderr).splitlines() if "does not resolve" in line]
    assert len(errors) == 2, result.stdout + result.stderr
    assert any(e.startswith("defs.yaml:8:1:") and "output_schema" in e for e in errors), errors
    assert any(e.startswith("defs.yaml:16:1:") and "input_schema" in e for e in errors), errors
    assert recording.hits == []
