"""Fuzzing: the compiler never fails but with DefinitionsInvalid; no API operation answers 5xx.

The compiler gets random definition directories: YAML documents made of
known and unknown keys with values of any type, random text and random
bytes, compiled afresh and then again by the same compiler after an edit
(its caches). The HTTP API is driven by schemathesis from the server's own
`/openapi.json`, on a loopback server serving the repository's definitions.
Both are bounded in examples so the whole file takes a few seconds.
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests
import schemathesis
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.compiler.compiler import Compiler
from server.compiler.documents import (
    DOCUMENT_MODELS,
    KINDS,
    CommandAction,
    HookHttp,
    HttpAction,
    ScriptRule,
    ToolCall,
    ToolFilter,
)
from server.errors import DefinitionsInvalid
from server.http import openapi
from server.http.app import create_app
from server.settings import Settings
from tests.support.servers import REPO_DEFINITIONS, corral_server

# --- the compiler ------------------------------------------------------------------------

NESTED = (CommandAction, HookHttp, HttpAction, ScriptRule, ToolCall, ToolFilter)
KNOWN_KEYS = sorted({f for m in (*DOCUMENT_MODELS.values(), *NESTED) for f in m.model_fields}
                    | {"allowed-tools", "type", "properties", "required"})
NAMES = ["a", "b", "offline", "main", "echo"]  # so that references resolve now and then
TRICKY = ["${SECRET}", "${X:-d}", "{param}", "{{", "../../../etc/passwd", "/etc/hostname", "(", "a|b", "*",
          "scripted", "openai", "anthropic", "stdio", "http", "pre_tool_use", "PreToolUse", "allow", "deny",
          "ask", "enqueue", "SKILL.md", "", " ", "\x00", "é" * 3, "1e999", "-1", "0"]

keys = st.one_of(st.sampled_from(KNOWN_KEYS), st.text(max_size=12))
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
    st.text(max_size=24), st.sampled_from(TRICKY + NAMES),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=3)),
    max_leaves=6,
)
documents = st.builds(
    lambda kind, name, fields: {"kind": kind, "name": name, **fields},
    st.one_of(st.sampled_from(KINDS), values),
    st.one_of(st.sampled_from(NAMES), values),
    st.dictionaries(keys, values, max_size=5),
) | st.dictionaries(keys, values, max_size=4)


def yaml_text(docs: list[dict[str, Any]]) -> str:
    return "\n---\n".join(yaml.safe_dump(doc, allow_unicode=True) for doc in docs)


# A valid set using every kind and reference, so that mutations of it reach validation and linking.
BASE: list[dict[str, Any]] = [
    {"kind": "Model", "name": "offline", "provider": "scripted",
     "script": [{"when": "hi", "tool_call": {"name": "echo", "arguments": {"text": "{input}"}}}]},
    {"kind": "Model", "name": "main", "provider": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1",
     "api_key": "${KEY}", "fallbacks": ["offline"]},
    {"kind": "Tool", "name": "echo", "input_schema": {"type": "object", "properties": {"text": {}}},
     "command": {"argv": ["python3", "-c", "print(1)", "{text}"], "env": {"A": "${B}"}}},
    {"kind": "Tool", "name": "b", "input_schema": {"type": "object", "properties": {"text": {}}},
     "http": {"url": "http://127.0.0.1:9/{text}", "headers": {"X": "${Y}"}}},
    {"kind": "MCPServer", "name": "mcp", "command": "server", "args": ["x"], "tools": {"exclude": ["y"]}},
    {"kind": "Hook", "name": "hook", "event": "PreToolUse", "matcher": "echo|b", "command": ["python3", "h"]},
    {"kind": "Skill", "name": "skill", "description": "d", "instructions": "i"},
    {"kind": "Agent", "name": "a", "model": "main", "tools": ["echo", "b", "mcp", "mcp/x"], "hooks": ["hook"],
     "skills": ["skill"], "agents": ["sub"]},
    {"kind": "Agent", "name": "sub", "model": "offline"},
]


def mutate(changes: list[tuple[int, str, str, str, Any]]) -> str:
    """BASE with each change: (document, op, key, sub-key, value), op being set, delete or nested."""
    docs = copy.deepcopy(BASE)
    for index, op, key, sub, value in changes:
        doc = docs[index]
        if op == "delete":
            doc.pop(key, None)
        elif op == "nested" and isinstance(doc.get(key), dict):
            doc[key][sub] = value
        else:
            doc[key] = value
    return yaml_text(docs)


changes = st.tuples(st.integers(0, len(BASE) - 1), st.sampled_from(["set", "delete", "nested"]),
                    st.sampled_from(KNOWN_KEYS), keys, values)
contents = st.one_of(
    st.lists(changes, max_size=4).map(mutate),
    st.lists(documents, min_size=1, max_size=3).map(yaml_text),
    st.text(max_size=300),
    st.binary(max_size=300),
    st.lists(changes, max_size=2).map(mutate).flatmap(  # a (nearly) valid set, cut short
        lambda text: st.integers(0, len(text)).map(lambda cut: text[:cut])),
)
front_matter = st.one_of(
    st.just({"name": "s", "description": "d"}),
    st.dictionaries(st.sampled_from(["name", "description", "license", "allowed-tools", "metadata"]) | keys,
                    values, max_size=4),
)
skill_files = st.one_of(
    st.builds(lambda head, body: f"---\n{yaml.safe_dump(head, allow_unicode=True)}---\n{body}",
              front_matter, st.text(max_size=40)),
    st.text(max_size=100),
)
trees = st.fixed_dictionaries({"a.yaml": contents}, optional={
    "b.yml": st.lists(documents, min_size=1, max_size=2).map(yaml_text),
    "sub/c.yaml": st.binary(max_size=100),
    "skills/s/SKILL.md": skill_files,
    "notes.txt": st.text(max_size=50),
})


def write(root: Path, files: dict[str, str | bytes]) -> None:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, "utf-8", errors="surrogatepass")


def compiles_or_says_why(compiler: Compiler) -> None:
    try:
        compiler.compile()
    except DefinitionsInvalid as exc:
        assert exc.errors and all(str(error) for error in exc.errors)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(files=trees, edit=contents)
def test_the_compiler_only_ever_reports_invalid_definitions(files: dict[str, str | bytes],
                                                           edit: str | bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write(root, files)
        compiler = Compiler(root)
        compiles_or_says_why(compiler)
        write(root, {"a.yaml": edit})  # the same compiler again, after an edit
        compiles_or_says_why(compiler)


# --- the HTTP API ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def api_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with corral_server(REPO_DEFINITIONS, tmp_path_factory.mktemp("fuzz") / "state") as url:
        published = httpx.get(f"{url}/openapi.json", timeout=10, trust_env=False).json()
        assert published == openapi.document(create_app(Settings()).routes)
        yield url


@pytest.fixture(scope="module")
def session() -> Iterator[requests.Session]:
    with requests.Session() as http:
        http.trust_env = False  # loopback only, whatever proxy the environment names
        yield http


# The document the server publishes, built here at import time for schemathesis to parametrize over
# (its lazy `from_fixture` loader does not run on pytest 9); `api_url` checks the server publishes it.
# The two event streams never end by design (they follow live events), so no request to them returns.
schema = (schemathesis.openapi.from_dict(openapi.document(create_app(Settings()).routes))
          .exclude(method="GET", path="/v1/events")
          .exclude(method="GET", path="/v1/conversations/{id}/events"))


@pytest.fixture(scope="module")
def conversation_id(api_url: str) -> str:
    created = httpx.post(f"{api_url}/v1/conversations", json={"agent": "assistant"}, timeout=10,
                         trust_env=False)
    assert created.status_code == 201, created.text
    return created.json()["id"]


@schema.parametrize()
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_operation_answers_5xx(case: schemathesis.Case, api_url: str, conversation_id: str,
                                  session: requests.Session) -> None:
    if "id" in (case.path_parameters or {}) and case.method != "DELETE":
        # A conversation that exists, so bodies and queries reach the routes' own checks (and real turns).
        case.path_parameters["id"] = conversation_id
    response = case.call(base_url=api_url, session=session, timeout=15)
    assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.text[:500]}"
