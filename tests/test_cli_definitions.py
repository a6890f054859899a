"""The real `corral` command line on definition sets: validate, digest, lock, schema, secrets."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from server import cli
from server.compiler.compiler import Compiler
from server.compiler.yamltext import parse_yaml
from tests.support.servers import REPO_DEFINITIONS as DEFINITIONS  # as committed: see servers.py
from tests.support.trees import copy_definitions, shipped_definitions

REPO = Path(__file__).resolve().parent.parent
SECRETS = {"OPENAI_API_KEY": "sk-openai-Zq8vXw3Kp1", "MY_SECRET": "my-secret-Yb7uTr5Hn2"}
REF = re.compile(r"^(agent|model|tool|mcpserver|hook|skill)/[a-z0-9][a-z0-9_-]{0,62}$")


def corral(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return corral_many([args])[0]


def corral_many(commands: list[tuple[str | Path, ...]]) -> list[subprocess.CompletedProcess[str]]:
    """Run several `corral` commands at once (each is a fresh interpreter: that is the slow part)."""
    env = {**os.environ, **SECRETS}
    env.pop("CORRAL_DEFINITIONS", None)
    procs = [
        (args, subprocess.Popen([sys.executable, "-m", "server.cli", *map(str, args)], cwd=REPO, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        for args in commands
    ]
    done = []
    for args, proc in procs:
        out, err = proc.communicate(timeout=60)
        done.append(subprocess.CompletedProcess(args, proc.returncode, out, err))
    return done


@pytest.fixture
def defs(tmp_path: Path) -> Path:
    return copy_definitions(DEFINITIONS, tmp_path / "definitions")


def test_a_lock_left_in_the_source_tree_is_not_copied(tmp_path: Path) -> None:
    source = copy_definitions(DEFINITIONS, tmp_path / "source")
    assert corral("lock", source).returncode == 0  # what the README has a newcomer do
    copied = copy_definitions(source, tmp_path / "copy")
    assert (source / "corral.lock").exists() and not (copied / "corral.lock").exists()
    assert corral("lock", copied, "--check").returncode == 1


def test_validate_digest_and_json(defs: Path) -> None:
    compiled = Compiler(defs).compile()
    validate, text, as_json = corral_many([("validate", defs), ("digest", defs), ("digest", defs, "--json")])

    assert validate.returncode == 0, validate.stderr
    assert compiled.digest in validate.stdout

    assert text.returncode == 0, text.stderr
    first, *rest = text.stdout.splitlines()
    assert first.split() == ["set", compiled.digest]
    assert dict(line.split() for line in rest) == compiled.digests()

    assert as_json.returncode == 0, as_json.stderr
    listing = json.loads(as_json.stdout)
    assert listing == compiled.listing()
    assert set(listing) == {"digest", "definitions"} and listing["digest"] == compiled.digest
    for item in listing["definitions"]:
        assert set(item) == {"kind", "name", "digest", "source"}
        assert set(item["source"]) == {"file", "line"}
        assert (defs / item["source"]["file"]).is_file() and item["source"]["line"] >= 1
    kinds = {(d["kind"], d["name"]) for d in listing["definitions"]}
    assert {("Agent", "assistant"), ("Skill", "haiku"), ("Tool", "word_count")} <= kinds


def _sorted_everywhere(pairs: list[tuple[str, object]]) -> dict:
    keys = [k for k, _ in pairs]
    assert keys == sorted(keys)
    return dict(pairs)


def test_lock_and_check(defs: Path) -> None:
    missing = corral("lock", defs, "--check")
    assert missing.returncode == 1
    assert "corral.lock" in missing.stderr and "no " in missing.stderr.lower()
    assert not (defs / "corral.lock").exists()

    first = corral("lock", defs)
    assert first.returncode == 0, first.stderr
    text = (defs / "corral.lock").read_text("utf-8")
    again, ok = corral_many([("lock", defs), ("lock", defs, "--check")])
    assert again.returncode == 0 and (defs / "corral.lock").read_text("utf-8") == text
    assert ok.returncode == 0, ok.stdout + ok.stderr

    assert text.endswith("}\n")
    data = json.loads(text, object_pairs_hook=_sorted_everywhere)
    compiled = Compiler(defs).compile()
    assert data["version"] == 1
    assert data["digest"] == compiled.digest
    assert data["definitions"] == compiled.digests()
    assert "agent/assistant" in data["definitions"]
    assert all(REF.match(ref) for ref in data["definitions"])
    assert set(data) <= {"version", "digest", "definitions", "mcp_catalogs"}

    script = defs / "scripts" / "word_count.py"
    script.write_text(script.read_text() + "# changed\n")
    drift = corral("lock", defs, "--check")
    assert drift.returncode == 1
    before, after = data["definitions"], Compiler(defs).compile().digests()
    changed = {ref for ref in before if before[ref] != after[ref]}
    assert changed == {"tool/word_count", "agent/assistant"}
    report = drift.stdout + drift.stderr
    for ref in changed:
        assert ref in report and before[ref] in report and after[ref] in report
    for ref in set(before) - changed:
        assert ref not in report
    assert (defs / "corral.lock").read_text("utf-8") == text  # --check writes nothing


def test_help_for_every_verb(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    top = capsys.readouterr().out
    assert exit_.value.code == 0 and top.startswith("usage: corral")
    verbs = cli.build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert {"validate", "digest", "lock", "schema"} <= set(verbs)
    for verb in verbs:
        assert verb in top
        with pytest.raises(SystemExit) as exit_:
            cli.main([verb, "--help"])
        assert exit_.value.code == 0
        assert f"usage: corral {verb}" in capsys.readouterr().out


# --- schema --------------------------------------------------------------------


def _documents(root: Path) -> list[dict]:
    docs = []
    for path in sorted(root.rglob("*.y*ml")):
        docs += [d.data for d in parse_yaml(path.read_text("utf-8"))]
    for path in sorted(root.rglob("SKILL.md")):
        front = path.read_text("utf-8").split("---\n")[1]
        docs += [{"kind": "Skill", **d.data} for d in parse_yaml(front)]
    return docs


def test_schema_accepts_every_shipped_document_and_rejects_unknown_fields() -> None:
    result = corral("schema")
    assert result.returncode == 0, result.stderr
    schema = json.loads(result.stdout)
    Draft202012Validator.check_schema(schema)
    validator = Draft202012Validator(schema)
    docs = _documents(DEFINITIONS)
    assert {d["kind"] for d in docs} >= {"Agent", "Model", "Tool", "Skill"}
    for doc in docs:
        errors = [e.message for e in validator.iter_errors(doc)]
        assert not errors, (doc["name"], errors)
    examples = [
        {"kind": "Hook", "name": "h", "event": "PreToolUse", "matcher": "*", "command": "hooks/x.sh"},
        {"kind": "MCPServer", "name": "s", "url": "https://example.com/mcp"},
    ]
    for doc in examples:
        assert validator.is_valid(doc), doc
    agent = next(d for d in docs if d["kind"] == "Agent")
    assert not validator.is_valid({**agent, "tolls": ["word_count"]})
    assert not validator.is_valid({**agent, "kind": "Agnet"})
    assert not validator.is_valid({**examples[0], "event": "before_tool"})


def test_a_misspelled_field_is_named_by_the_schema() -> None:
    """Editors show the best error: it names the field, not "not valid under any of the schemas"."""
    validator = Draft202012Validator(json.loads(corral("schema").stdout))
    agent = next(d for d in _documents(DEFINITIONS) if d["kind"] == "Agent")
    error = best_match(validator.iter_errors({**agent, "tolls": ["word_count"]}))
    assert error is not None and "'tolls' was unexpected" in error.message, error.message
    tool = {"kind": "Tool", "name": "t", "command": {"argv": ["true"], "timout_s": 3}}
    error = best_match(validator.iter_errors(tool))
    assert error is not None and "'timout_s' was unexpected" in error.message, error.message
    wrong_kind = best_match(validator.iter_errors({**agent, "kind": "Agnet"}))
    assert wrong_kind is not None and "Agnet" in wrong_kind.message


# --- secrets ---------------------------------------------------------------------

SECRET_SET = {
    "models.yaml": """\
kind: Model
name: gpt
provider: openai
model: gpt-4o-mini
fallbacks: [custom]
---
kind: Model
name: custom
provider: openai
model: local
base_url: http://127.0.0.1:9/v1
api_key: ${MY_SECRET}
""",
    "tools.yaml": """\
kind: Tool
name: fetch
input_schema: {type: object, properties: {id: {type: string}}}
http:
  url: https://api.example.com/items/{id}
  headers: {Authorization: "Bearer ${MY_SECRET}", X-Key: "${OPENAI_API_KEY}"}
---
kind: MCPServer
name: files
command: npx
args: [-y, server-filesystem]
env: {TOKEN: "${MY_SECRET}", OPENAI_API_KEY: "${OPENAI_API_KEY}"}
""",
    "agent.yaml": """\
kind: Agent
name: helper
model: gpt
tools: [fetch, files]
""",
}
BROKEN = {
    "broken.yaml": """\
kind: Model
name: leaky
provider: openai
model: x
api_key: Bearer ${MY_SECRET}
---
kind: Tool
name: bad
http: {url: "https://x.example/{nope}", headers: {A: "${MY_SECRET}"}, extra: 1}
""",
}
DANGLING = {  # valid documents, broken references: found by the second stage
    "lost.yaml": """\
kind: Agent
name: lost
model: nobody
tools: [fetch, fetch, files/write]
agents: [helper]
""",
}


def _write(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).write_text(text, "utf-8")
    return root


def test_secret_values_never_appear(tmp_path: Path) -> None:
    good = _write(tmp_path / "good", SECRET_SET)
    broken = _write(tmp_path / "broken", {**SECRET_SET, **BROKEN})
    dangling = _write(tmp_path / "dangling", {**SECRET_SET, **DANGLING})
    runs = corral_many([
        ("digest", good), ("digest", good, "--json"), ("lock", good, "--skip-mcp"),
        ("validate", broken), ("validate", dangling),
    ])
    for run in runs[:3]:
        assert run.returncode == 0, run.stderr
    assert runs[3].returncode == runs[4].returncode == 1
    assert "Model/leaky: api_key:" in runs[3].stderr and "http.extra:" in runs[3].stderr
    assert "no Model named 'nobody'" in runs[4].stderr and "listed twice" in runs[4].stderr
    assert "${MY_SECRET}" in Compiler(good).compile().get("Model", "custom").spec["api_key"]  # type: ignore
    outputs = [run.stdout + run.stderr for run in runs] + [(good / "corral.lock").read_text()]
    for text in outputs:
        for value in SECRETS.values():
            assert value not in text


def test_a_missing_definition_directory_is_said_plainly(tmp_path: Path) -> None:
    """`corral validate` run inside definitions/ looks for definitions/definitions: say that, in one line."""
    env = {k: v for k, v in os.environ.items() if k != "CORRAL_DEFINITIONS"} | {"PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "server.cli", "validate"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("error: the definition directory definitions (") and "does not exist" in line
    assert ":1:1:" not in line


def test_an_agent_added_to_a_checkouts_definitions_changes_no_test(tmp_path: Path) -> None:
    """The tests serve definitions/ as committed (`shipped_definitions`), not the checkout's working tree:
    an agent a user adds there, or a shipped file they break, is not what the tests serve."""
    checkout = tmp_path / "checkout"
    copy_definitions(DEFINITIONS, checkout / "definitions")
    git = ["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    for args in (["init", "-q"], ["add", "definitions"], ["commit", "-q", "-m", "shipped"]):
        subprocess.run([*git, *args], check=True, capture_output=True, timeout=60)
    (checkout / "definitions" / "mine.yaml").write_text("kind: Agent\nname: mine\nmodel: nowhere\n")
    (checkout / "definitions" / "assistant.yaml").write_text("kind: Agent\nname: [broken\n")
    assert corral("validate", checkout / "definitions").returncode == 1  # the working tree would fail
    shipped = shipped_definitions(checkout, tmp_path / "shipped")
    assert not (shipped / "mine.yaml").exists()
    assert Compiler(shipped).compile().digest == Compiler(DEFINITIONS).compile().digest
