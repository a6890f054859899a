"""The error table: every code in use is in it, with all three forms, and every surface renders from it.

The source scan reads `server/` with `ast`, so a `code="..."` (or a class's
`code = "..."`, an error dict's `{"code": "..."}`, a code passed to one of the
renderers) added anywhere fails here until the code has a row in
`errors.ERRORS`.
"""

from __future__ import annotations

import ast
import importlib
import json
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path

import anyio
import mcp.types as types
import pytest
from mcp.shared.exceptions import MCPError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.testclient import TestClient

import server
from server import cli, errors
from server.errors import ERRORS, TOOL_RESULT, CorralError, Forms
from server.http import openapi, plumbing
from server.http.app import create_app
from server.http.browsers import BrowserGuard
from server.http.guards import ApiKeys
from server.mcp import server as mcp_server
from server.settings import Settings

SOURCE = Path(server.__file__).resolve().parent
# The codes CONTRACT §5 names; clients rely on each.
CONTRACT_CODES = {
    "invalid_request", "unauthorized", "agent_not_found", "digest_not_found", "conversation_not_found",
    "conversation_busy", "definitions_invalid", "lock_mismatch", "model_error", "tool_error", "internal",
    "idempotency_key_reused", "turn_not_found", "context_window_exceeded", "budget_exceeded",
    "output_invalid", "interrupted", "storage_error",
}
# Functions that take a code as a plain argument: name -> its position.
RENDERERS = {"reject": 1, "_tool_error": 0, "_protocol_error": 0, "envelope": 0, "forms": 0}


# --- the source scan ---------------------------------------------------------------------


def _literal(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _in_call(node: ast.Call) -> Iterator[str]:
    for keyword in node.keywords:
        if keyword.arg == "code" and (code := _literal(keyword.value)):
            yield code
    name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
    position = RENDERERS.get(name or "")
    if position is not None and len(node.args) > position and (code := _literal(node.args[position])):
        yield code


def _in_class(node: ast.ClassDef) -> Iterator[str]:
    for statement in node.body:
        named = isinstance(statement, ast.Assign) and any(getattr(t, "id", "") == "code"
                                                          for t in statement.targets)
        if named and (code := _literal(statement.value)):
            yield code


def _in_dict(node: ast.Dict) -> Iterator[str]:
    for key, value in zip(node.keys, node.values, strict=True):
        if _literal(key) == "code" and (code := _literal(value)):
            yield code


def _codes_in(tree: ast.AST) -> Iterator[tuple[int, str]]:
    scans = {ast.Call: _in_call, ast.ClassDef: _in_class, ast.Dict: _in_dict}
    for node in ast.walk(tree):
        scan = scans.get(type(node))
        for code in scan(node) if scan else ():
            yield node.lineno, code


def codes_used() -> dict[str, list[str]]:
    """Every code written in `server/`, with where: {code: ["server/x.py:12", ...]}."""
    found: dict[str, list[str]] = {}
    for path in sorted(SOURCE.rglob("*.py")):
        tree = ast.parse(path.read_text("utf-8"), str(path))
        for line, code in _codes_in(tree):
            found.setdefault(code, []).append(f"{path.relative_to(SOURCE.parent)}:{line}")
    return found


def test_every_code_used_anywhere_is_in_the_table() -> None:
    used = codes_used()
    # The scan sees the codes it must: on classes, in keywords, error dicts and renderer calls.
    assert {"agent_not_found", "overloaded", "loop_detected", "interrupted", "host_not_allowed",
            "permission_required", "cancelled"} <= set(used), sorted(used)
    missing = {code: where for code, where in used.items() if code not in ERRORS}
    assert not missing, f"codes used but not in errors.ERRORS: {missing}"
    # Codes kept in constants rather than written at a call.
    for code in (*errors.TURN_FAILURES, *plumbing.STARLETTE_CODES.values(), *openapi.EVERY_ROUTE):
        assert code in ERRORS, code


def test_every_code_has_its_three_forms() -> None:
    assert set(ERRORS) >= CONTRACT_CODES, CONTRACT_CODES - set(ERRORS)
    for code, row in ERRORS.items():
        assert re.fullmatch(r"[a-z]+(_[a-z]+)*", code), code
        assert isinstance(row, Forms) and len(row) == 3, code
        assert 400 <= row.http <= 599, code
        assert row.mcp == TOOL_RESULT or (isinstance(row.mcp, int) and -32768 <= row.mcp <= -32000), code
        assert isinstance(row.exit, int) and 1 <= row.exit <= 255, code
    assert errors.JSONRPC_INVALID_PARAMS == types.INVALID_PARAMS
    # What the contract fixes: `validate` and `lock --check` exit 1, a dead store exits 1.
    assert ERRORS["definitions_invalid"].exit == ERRORS["lock_mismatch"].exit == 1
    assert ERRORS["storage_error"].exit == 1 and ERRORS["invalid_request"].exit == 2
    assert len({row.exit for row in ERRORS.values()}) >= 4, "exit statuses that say something"


# --- the hierarchy --------------------------------------------------------------------------


def _drawn_tree() -> dict[str, str | None]:
    """The class tree drawn in `errors`' docstring (its second paragraph): {class: parent}."""
    assert errors.__doc__ is not None
    parents: dict[str, str | None] = {}
    stack: list[str] = []
    for line in errors.__doc__.split("\n\n")[1].splitlines():
        branch = line.find("── ")  # each level indents the branch by four columns
        depth = 0 if branch < 0 else (branch - 1) // 4
        name = (line[branch + 3:] if branch >= 0 else line).split()[0]
        stack[depth:] = [name]
        parents[name] = stack[depth - 1] if depth else None
    return parents


def _server_modules() -> Iterator[str]:
    for module in pkgutil.walk_packages(server.__path__, "server."):
        if not module.name.endswith("__main__"):
            yield module.name


def _subclasses(cls: type) -> Iterator[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_every_error_class_is_in_the_error_module_and_drawn_in_its_docstring() -> None:
    for name in _server_modules():
        importlib.import_module(name)
    classes = {c for c in _subclasses(CorralError) if c.__module__.startswith("server")}
    elsewhere = sorted(f"{c.__module__}.{c.__name__}" for c in classes if c.__module__ != "server.errors")
    assert not elsewhere, f"CorralError subclasses outside server/errors.py: {elsewhere}"
    actual = {c.__name__: c.__bases__[0].__name__ for c in classes} | {"CorralError": None}
    assert _drawn_tree() == actual
    for cls in classes:
        assert cls.code in ERRORS, cls


# --- the OpenAPI document --------------------------------------------------------------------


@pytest.fixture(scope="module")
def document() -> dict:
    return openapi.document(create_app(Settings()).routes)


def test_every_code_the_document_lists_is_in_the_table_at_its_status(document: dict) -> None:
    assert document["components"]["schemas"]["ErrorCode"]["enum"] == sorted(ERRORS)
    listed = set()
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            where = f"{method.upper()} {path}"
            codes = set()
            for status, response in operation["responses"].items():
                if status == "default" or int(status) < 400:
                    continue
                [_, only] = response["content"]["application/json"]["schema"]["allOf"]
                for code in only["properties"]["error"]["properties"]["code"]["enum"]:
                    assert code in ERRORS, (where, code)
                    assert ERRORS[code].http == int(status), (where, code, status)
                    codes.add(code)
            assert {"internal", "forbidden", "host_not_allowed", "payload_too_large"} <= codes, where
            assert ("unauthorized" in codes) == (path != "/healthz"), where
            listed |= codes
    assert {"conversation_busy", "idempotency_key_reused", "agent_not_found", "model_error"} <= listed


def test_the_document_is_generated_from_the_routes(document: dict) -> None:
    routes = [r for r in create_app(Settings()).routes if isinstance(r, Route)]
    operations = {(m.lower(), r.path) for r in routes for m in (r.methods or ()) if m != "HEAD"}
    assert operations == {(m, p) for p, methods in document["paths"].items() for m in methods}
    undeclared = [r.path for r in routes if openapi.doc_of(r.endpoint) is None]
    assert not undeclared, f"add these routes' summaries and error codes to openapi.DOCS: {undeclared}"
    send = document["paths"]["/v1/conversations/{id}/messages"]["post"]
    assert send["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/SendMessage")


def test_the_document_lists_the_turn_route_and_permission_required(document: dict) -> None:
    def codes(operation: dict) -> dict[str, set[str]]:
        return {status: set(r["content"]["application/json"]["schema"]["allOf"][1]["properties"]["error"]
                            ["properties"]["code"]["enum"])
                for status, r in operation["responses"].items() if status != "default" and int(status) >= 400}

    turn = document["paths"]["/v1/conversations/{id}/turns/{turn_id}"]["get"]
    assert {p["name"] for p in turn["parameters"]} == {"id", "turn_id", "wait"}
    assert {"turn_not_found", "conversation_not_found"} <= codes(turn)["404"]
    assert "invalid_request" in codes(turn)["400"]
    chat = codes(document["paths"]["/v1/chat/completions"]["post"])
    assert "permission_required" in chat["409"] and "output_invalid" in chat["422"]


# --- the surfaces render from the table --------------------------------------------------------


async def _answer(app, headers: list[tuple[bytes, bytes]], method: str = "GET") -> tuple[int, dict]:
    """What an ASGI guard answers to one request (the app behind it must not be reached)."""
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": "/v1/agents", "headers": headers}
    await app(scope, receive, send)
    return sent[0]["status"], json.loads(sent[1]["body"])


async def _unreachable(scope, receive, send) -> None:
    raise AssertionError("the guard let the request through")


@pytest.mark.anyio
async def test_the_guards_answer_with_the_tables_status() -> None:
    keys = ApiKeys(_unreachable, ("k",))
    browsers = BrowserGuard(_unreachable, bind_host="127.0.0.1")
    with anyio.fail_after(5):
        for app, headers, method, code in [
            (keys, [], "GET", "unauthorized"),
            (browsers, [(b"host", b"evil.example")], "GET", "host_not_allowed"),
            (browsers, [(b"host", b"localhost"), (b"origin", b"http://evil.example")], "GET", "forbidden"),
            (browsers, [(b"host", b"localhost"), (b"content-type", b"text/plain")], "POST",
             "unsupported_media_type"),
        ]:
            status, body = await _answer(app, headers, method)
            assert status == ERRORS[code].http and body["error"]["code"] == code, (code, status, body)


def test_starlettes_own_404_and_405_and_a_corral_error_share_the_envelope() -> None:
    async def conflict(request: Request) -> Response:
        raise CorralError("already decided", code="conflict", details={"status": "allowed"})

    app = Starlette(routes=[Route("/only-post", conflict, methods=["POST"])],
                    exception_handlers={CorralError: plumbing.corral_error_handler,
                                        HTTPException: plumbing.http_error_handler})
    with TestClient(app) as client:
        missing, wrong, raised = client.get("/nowhere"), client.get("/only-post"), client.post("/only-post")
    assert missing.status_code == ERRORS["not_found"].http and missing.json()["error"]["code"] == "not_found"
    assert wrong.status_code == ERRORS["method_not_allowed"].http and wrong.headers["allow"] == "POST"
    assert wrong.json()["error"]["code"] == "method_not_allowed"
    assert raised.status_code == 409
    assert raised.json() == {"error": {"code": "conflict", "message": "already decided",
                                       "details": {"status": "allowed"}}}


def test_mcp_keeps_the_details_and_answers_unknown_names_in_json_rpc() -> None:
    busy = mcp_server._tool_error("conversation_busy", "busy", details={"turn_id": "turn_1"})
    [text] = busy.content
    assert busy.is_error and isinstance(text, types.TextContent)
    assert text.text.startswith("[conversation_busy] busy") and '"turn_id": "turn_1"' in text.text
    assert busy.structured_content is None  # no turn of its own: the output schema cannot be met
    turn = {"conversation_id": "conv_1", "turn_id": "turn_2", "digest": "sha256:x", "status": "failed"}
    failed = mcp_server._tool_error("model_error", "upstream broke", turn, details={"status": 500})
    assert failed.structured_content == {**turn, "error": {"code": "model_error", "message": "upstream broke",
                                                           "details": {"status": 500}}}
    with pytest.raises(MCPError) as unknown:
        mcp_server._tool_error("not_found", "Unknown tool: nobody")
    assert unknown.value.code == ERRORS["not_found"].mcp == types.INVALID_PARAMS
    assert unknown.value.data == {"code": "not_found", "message": "Unknown tool: nobody"}


def test_the_cli_exits_with_the_tables_status(capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CORRAL_API_KEYS", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
                 "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    definitions = str(SOURCE.parent / "definitions")
    refused = cli.main(["serve", definitions, "--host", "0.0.0.0", "--no-watch"])
    unreachable = cli.main(["chat", "assistant", "--url", "http://127.0.0.1:9"])
    assert (refused, unreachable) == (ERRORS["invalid_request"].exit, ERRORS["unreachable"].exit) == (2, 3)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and all(line.startswith("error: ") for line in lines), lines
    assert "refusing to bind 0.0.0.0" in lines[0] and "cannot reach http://127.0.0.1:9" in lines[1]
