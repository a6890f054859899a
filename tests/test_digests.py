"""Digests change with meaning and only with meaning; compiled definitions are immutable.

A representative set is written in many ways that mean the same thing (every
digest equal), then changed one semantic detail at a time (exactly that
definition and every agent reaching it change). The same `Compiler` is then
reused across edits, and must agree with a fresh one.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from server.compiler import sources
from server.compiler.compiler import Compiler

FILES = {
    "prompts/main.md": "You are the main agent.\nBe brief.\n",
    "scripts/lookup.py": "print('lookup')\n",
    "hooks/guard.sh": "#!/bin/sh\nexit 0\n",
    "skills/haiku/SKILL.md": "---\nname: haiku\ndescription: Write haiku.\n---\nWrite three lines.\n",
    "skills/haiku/examples/pond.txt": "an old silent pond\n",
}
OBJECT = {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}


def documents(up: str = "") -> list[dict[str, Any]]:
    """The set's YAML documents; `up` prefixes paths for a document kept deeper down."""
    return [
        {"kind": "Model", "name": "primary", "provider": "openai", "model": "gpt-4o-mini",
         "temperature": 0.2, "fallbacks": ["backup"]},
        {"kind": "Model", "name": "backup", "provider": "scripted", "default": "offline answer"},
        {"kind": "Model", "name": "solo", "provider": "scripted",
         "script": [{"when": "(?i)fetch", "tool_call": {"name": "fetch", "arguments": {"id": "7"}}}]},
        {"kind": "Tool", "name": "lookup", "description": "Look a word up.", "input_schema": OBJECT,
         "command": {"argv": ["python3", up + "scripts/lookup.py", "{query}"], "timeout_s": 5}},
        {"kind": "Tool", "name": "fetch",
         "input_schema": {"type": "object", "properties": {"id": {"type": "string"}}},
         "http": {"method": "GET", "url": "https://api.example.com/items/{id}",
                  "headers": {"Authorization": "Bearer ${MY_SECRET}"}}},
        {"kind": "Tool", "name": "spare", "command": {"argv": ["date", "-u"]}},
        {"kind": "MCPServer", "name": "files", "command": "npx",
         "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"],
         "env": {"TOKEN": "${MY_SECRET}"}, "tools": {"exclude": ["write_file"]}},
        {"kind": "Hook", "name": "guard", "event": "pre_tool_use", "matcher": "lookup|fetch",
         "command": [up + "hooks/guard.sh"]},
        {"kind": "Hook", "name": "audit", "event": "post_tool_use", "matcher": "",
         "http": {"url": "https://audit.example.com/hook"}},
        {"kind": "Agent", "name": "main", "model": "primary", "instructions_file": up + "prompts/main.md",
         "tools": ["lookup", "files"], "agents": ["helper"], "skills": ["haiku"], "hooks": ["guard"]},
        {"kind": "Agent", "name": "helper", "description": "Fetches items.", "model": "solo",
         "tools": ["fetch"], "hooks": ["audit"]},
        {"kind": "Agent", "name": "top", "model": "solo", "agents": ["main"]},
        {"kind": "Agent", "name": "loner", "model": "solo", "instructions": "Work alone."},
    ]


def dump(doc: dict, *, flow: bool = False, indent: int = 2, quote: str | None = None) -> str:
    class Dumper(yaml.SafeDumper):
        pass

    if quote is not None:
        Dumper.add_representer(
            str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style=quote)
        )
    return yaml.dump(doc, Dumper=Dumper, default_flow_style=flow, indent=indent, sort_keys=False,
                     width=10**6, allow_unicode=True)


def by_kind(docs: list[dict], **style: Any) -> dict[str, str]:
    groups = {"Model": "models.yaml", "Tool": "tools.yaml", "MCPServer": "tools.yaml",
              "Hook": "hooks.yaml", "Agent": "agents.yaml"}
    out: dict[str, list[str]] = {}
    for doc in docs:
        out.setdefault(groups[doc["kind"]], []).append(dump(doc, **style))
    return {name: "---\n".join(texts) for name, texts in out.items()}


def write_set(root: Path, texts: dict[str, str], files: dict[str, str] = FILES) -> Path:
    for rel, text in {**files, **texts}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, "utf-8")
    return root


def digests(root: Path) -> dict[str, str]:
    compiled = Compiler(root).compile()
    return {"set": compiled.digest, **compiled.digests()}


@pytest.fixture
def baseline(tmp_path: Path) -> dict[str, str]:
    return digests(write_set(tmp_path / "baseline", by_kind(documents())))


# --- (a) invariance ---------------------------------------------------------


def reverse_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: reverse_keys(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [reverse_keys(v) for v in value]
    return value


def with_comments(text: str) -> str:
    lines = ["# a header comment", *text.splitlines()]
    out = []
    for line in lines:
        out.append(line if line.startswith(("#", "---")) or not line.strip() else line + "   # note")
        out.append("    # an indented comment line")
    return "\n".join(out) + "\n"


EXPLICIT_DEFAULTS = {
    "primary": {"description": "", "base_url": "https://api.openai.com/v1", "api_key": "${OPENAI_API_KEY}",
                "retries": 2, "timeout_s": 60, "max_output_tokens": 4096, "context_window": None},
    "backup": {"retries": 2, "fallbacks": [], "script": [], "model": ""},
    "lookup": {"permission": "allow"},
    "fetch": {"permission": "allow", "description": ""},
    "spare": {"permission": "allow", "input_schema": {"type": "object", "properties": {}}},
    "files": {"transport": "stdio", "timeout_s": 30, "cwd": None},
    "guard": {"on_error": "deny", "timeout_s": 60},
    "audit": {"on_error": "allow", "timeout_s": 60.0},
    "main": {"on_busy": "reject", "max_steps": 10},
    "top": {"on_busy": "reject", "max_steps": 10, "tools": [], "skills": [], "hooks": [], "instructions": ""},
    "loner": {"agents": [], "on_busy": "reject"},
}


def explicit_defaults(docs: list[dict]) -> list[dict]:
    for doc in docs:
        doc.update(copy.deepcopy(EXPLICIT_DEFAULTS.get(doc["name"], {})))
        if doc["name"] == "lookup":
            doc["command"].update({"cwd": None, "env": {}, "timeout_s": 5.0})
        if doc["name"] == "fetch":
            doc["http"]["timeout_s"] = 30
        if doc["name"] == "solo":
            doc["script"][0]["reply"] = "{tool_result}"
    return docs


def aliases(docs: list[dict]) -> list[dict]:
    events = {"pre_tool_use": "PreToolUse", "post_tool_use": "PostToolUse"}
    for doc in docs:
        if doc["kind"] == "Hook":
            doc["event"] = events[doc["event"]]
            doc["matcher"] = doc["matcher"] or "*"
            if "command" in doc:
                doc["command"] = doc["command"][0]  # a string naming one executable
        if doc["name"] == "fetch":
            doc["http"]["method"] = "get"
    return docs


def one_file_each(root: Path) -> None:
    write_set(root, {f"deep/er/{i:02d}-{d['name']}.yml": dump(d) for i, d in enumerate(documents("../../"))})


def one_multidoc_file(root: Path) -> None:
    docs = list(reversed(documents()))
    write_set(root, {"all.yml": "".join("---\n" + dump(d) + "...\n" for d in docs)})


def moved_skill(root: Path) -> None:
    files = {k.replace("skills/haiku/", "more/skills/live/here/haiku/"): v for k, v in FILES.items()}
    write_set(root, by_kind(documents()), files)


VARIANTS: dict[str, Callable[[Path], Any]] = {
    "flow-style": lambda root: write_set(root, by_kind(documents(), flow=True)),
    "indent-4": lambda root: write_set(root, by_kind(documents(), indent=4)),
    "key-order": lambda root: write_set(root, by_kind([reverse_keys(d) for d in documents()])),
    "double-quoted": lambda root: write_set(root, by_kind(documents(), quote='"')),
    "single-quoted": lambda root: write_set(root, by_kind(documents(), quote="'")),
    "comments": lambda root: write_set(
        root, {k: with_comments(v) for k, v in by_kind(documents()).items()}),
    "renamed-files": lambda root: write_set(
        root, {"z-" + k.replace(".yaml", ".yml"): v for k, v in by_kind(documents()).items()}),
    "split-and-renamed": lambda root: write_set(
        root, {f"{d['kind'].lower()}-{d['name']}.yaml": dump(d) for d in documents()}),
    "one-file-each-deeper": one_file_each,
    "one-multidoc-file": one_multidoc_file,
    "moved-skill-folder": moved_skill,
    "explicit-defaults": lambda root: write_set(root, by_kind(explicit_defaults(documents()))),
    "aliases": lambda root: write_set(root, by_kind(aliases(documents()))),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_no_digest_changes_without_meaning(tmp_path: Path, baseline: dict[str, str], variant: str) -> None:
    root = tmp_path / "variant"
    VARIANTS[variant](root)
    assert digests(root) == baseline


def test_handwritten_text_hashes_like_the_dump(tmp_path: Path, baseline: dict[str, str]) -> None:
    texts = by_kind(documents())
    texts["tools.yaml"] = texts["tools.yaml"].replace(dump(documents()[5]), (
        "# the spare tool, written by hand\n"
        "kind:   'Tool'\n"
        'name: "spare"\n'
        "command: {argv: [ date,\n   '-u' ]}   # flow mapping over two lines\n"
    ))
    assert "by hand" in texts["tools.yaml"]
    assert digests(write_set(tmp_path / "hand", texts)) == baseline


# --- (b) sensitivity ----------------------------------------------------------

MAIN_UP = {"agent/main", "agent/top"}
SKILL_UP = {"skill/haiku", *MAIN_UP}
HELPER_UP = {"agent/helper", *MAIN_UP}
SOLO_UP = {"model/solo", "agent/loner", *HELPER_UP}


def field(name: str, *path: str, value: Any) -> Callable[[list[dict], dict[str, str]], None]:
    def edit(docs: list[dict], files: dict[str, str]) -> None:
        node = next(d for d in docs if d["name"] == name)
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return edit


def file(rel: str, old: str, new: str) -> Callable[[list[dict], dict[str, str]], None]:
    def edit(docs: list[dict], files: dict[str, str]) -> None:
        assert old in files[rel]
        files[rel] = files[rel].replace(old, new)

    return edit


SENSITIVITY = {
    "model-field": (field("primary", "temperature", value=0.3), {"model/primary", *MAIN_UP}),
    "model-retries": (field("primary", "retries", value=3), {"model/primary", *MAIN_UP}),
    "fallback-model": (field("backup", "default", value="x"), {"model/backup", "model/primary", *MAIN_UP}),
    "scripted-model": (field("solo", "script", 0, "when", value="(?i)get"), SOLO_UP),
    "tool-field": (field("lookup", "command", "timeout_s", value=6), {"tool/lookup", *MAIN_UP}),
    "tool-permission": (field("lookup", "permission", value="ask"), {"tool/lookup", *MAIN_UP}),
    "tool-description": (field("lookup", "description", value="Look up."), {"tool/lookup", *MAIN_UP}),
    "tool-script": (file("scripts/lookup.py", "lookup", "lookuq"), {"tool/lookup", *MAIN_UP}),
    "http-tool-header": (field("fetch", "http", "headers", "X-Extra", value="1"), {"tool/fetch", *HELPER_UP}),
    "unused-tool": (field("spare", "command", "argv", value=["date"]), {"tool/spare"}),
    "mcp-args": (field("files", "args", 2, value="/srv"), {"mcpserver/files", *MAIN_UP}),
    "mcp-filter": (field("files", "tools", "exclude", value=[]), {"mcpserver/files", *MAIN_UP}),
    "hook-matcher": (field("guard", "matcher", value="lookup"), {"hook/guard", *MAIN_UP}),
    "hook-script": (file("hooks/guard.sh", "exit 0", "exit 2"), {"hook/guard", *MAIN_UP}),
    "hook-on-error": (field("audit", "on_error", value="deny"), {"hook/audit", *HELPER_UP}),
    "skill-resource-byte": (file("skills/haiku/examples/pond.txt", "pond", "pone"), SKILL_UP),
    "skill-body": (file("skills/haiku/SKILL.md", "three", "four"), SKILL_UP),
    "skill-description": (file("skills/haiku/SKILL.md", "Write haiku.", "Haiku."), SKILL_UP),
    "prompt-file": (file("prompts/main.md", "brief", "terse"), MAIN_UP),
    "sub-agent-field": (field("helper", "max_steps", value=20), HELPER_UP),
    "agent-tools": (field("main", "tools", value=["files", "lookup"]), MAIN_UP),
    "top-agent": (field("top", "on_busy", value="enqueue"), {"agent/top"}),
    "lone-agent": (field("loner", "instructions", value="Work alone!"), {"agent/loner"}),
}


@pytest.mark.parametrize("case", sorted(SENSITIVITY))
def test_exactly_the_reaching_digests_change(tmp_path: Path, baseline: dict[str, str], case: str) -> None:
    edit, expected = SENSITIVITY[case]
    docs, files = documents(), dict(FILES)
    edit(docs, files)
    after = digests(write_set(tmp_path / "edited", by_kind(docs), files))
    assert after.keys() == baseline.keys()
    changed = {ref for ref in baseline if after[ref] != baseline[ref]}
    assert changed == {"set", *expected}


# --- (c) incremental recompile ----------------------------------------------


def _check_agrees(compiler: Compiler, root: Path) -> dict[str, str]:
    reused = compiler.compile()
    fresh = digests(root)
    assert {"set": reused.digest, **reused.digests()} == fresh
    return fresh


def test_reused_compiler_agrees_with_a_fresh_one(tmp_path: Path) -> None:
    root = write_set(tmp_path / "set", by_kind(documents()))
    compiler = Compiler(root)
    seen = [_check_agrees(compiler, root)]

    def replace(rel: str, old: str, new: str) -> None:
        (root / rel).write_text((root / rel).read_text().replace(old, new))

    edits: list[Callable[[], Any]] = [
        lambda: replace("agents.yaml", "alone", "apart"),
        lambda: (root / "prompts/main.md").write_text("You are the main agent.\nBe terse.\n"),
        lambda: (root / "scripts/lookup.py").write_text("print('lookuq')\n"),
        lambda: (root / "skills/haiku/examples/pond.txt").write_text("an old silent pone\n"),
        lambda: (root / "skills/haiku/examples/frog.txt").write_text("a frog jumps in\n"),
        lambda: (root / "skills/haiku/examples/frog.txt").unlink(),
        lambda: (root / "models.yaml").rename(root / "renamed.yaml"),
        lambda: replace("tools.yaml", "/tmp", "/srv"),
    ]
    for edit in edits:
        edit()
        seen.append(_check_agrees(compiler, root))
    assert seen[3]["skill/haiku"] == seen[0]["skill/haiku"]
    assert seen[4] == seen[6] == seen[7]  # the added file removed again; a file renamed
    assert len({s["set"] for s in seen}) == len(seen) - 2


def test_same_size_edits_in_quick_succession(tmp_path: Path) -> None:
    root = write_set(tmp_path / "set", by_kind(documents()))
    compiler = Compiler(root)
    results = []
    for word in ("alone.", "apart.", "aside."):
        loner = {**documents()[-1], "instructions": "Work " + word}
        (root / "loner.yaml").write_text(dump(loner))
        (root / "agents.yaml").write_text(by_kind(documents()[:-1])["agents.yaml"])
        for rel in ("prompts/main.md", "skills/haiku/examples/pond.txt"):
            (root / rel).write_text(FILES[rel].replace("a", word[1]))
        results.append(_check_agrees(compiler, root))
    assert len({r["agent/loner"] for r in results}) == 3
    assert len({r["skill/haiku"] for r in results}) == 3


def test_same_size_edits_within_one_mtime_tick(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Coarse file systems give two writes in one tick the same mtime; a later look must still see both."""
    root = write_set(tmp_path / "set", by_kind(documents()))
    tick = 1_000_000_000_000_000_000
    clock = [tick]
    monkeypatch.setattr(sources.time, "time_ns", lambda: clock[0])
    edits = {"agents.yaml": ("alone", "apart"), "prompts/main.md": ("brief", "terse"),
             "skills/haiku/examples/pond.txt": ("pond", "pone")}

    def write(index: int) -> None:
        for rel, words in edits.items():
            path = root / rel
            path.write_text(path.read_text().replace(words[1 - index], words[index]))
            os.utime(path, ns=(tick, tick))

    compiler = Compiler(root)
    write(0)
    clock[0] = tick + 1_000_000  # compiled 1 ms after the write, in the same tick
    first = _check_agrees(compiler, root)
    write(1)  # same sizes, same mtimes
    clock[0] = tick + 10_000_000_000  # ten seconds later: the mtime is no longer recent
    second = _check_agrees(compiler, root)
    assert second["agent/loner"] != first["agent/loner"]
    assert second["skill/haiku"] != first["skill/haiku"]


def test_argv_file_created_after_first_compile(tmp_path: Path) -> None:
    root = write_set(tmp_path / "set", by_kind(documents()))
    (root / "scripts/lookup.py").unlink()
    compiler = Compiler(root)
    before = _check_agrees(compiler, root)
    (root / "scripts/lookup.py").write_text(FILES["scripts/lookup.py"])
    assert _check_agrees(compiler, root)["tool/lookup"] != before["tool/lookup"]


# --- (d) immutability ---------------------------------------------------------


def test_definitions_are_immutable(tmp_path: Path) -> None:
    compiled = Compiler(write_set(tmp_path / "set", by_kind(documents()))).compile()
    main, lookup = compiled.get("Agent", "main"), compiled.get("Tool", "lookup")
    assert main is not None and lookup is not None
    for definition, attr in ((main, "name"), (main, "digest"), (lookup, "spec"), (lookup, "files")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(definition, attr, "x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        compiled.digest = "sha256:0"  # type: ignore[misc]
    mutations: list[Callable[[], Any]] = [
        lambda: main.spec.__setitem__("name", "x"),
        lambda: main.spec.__delitem__("model"),
        lambda: main.spec["closure"].__setitem__("tool/x", "sha256:0"),
        lambda: main.closure.__setitem__("tool/x", "sha256:0"),
        lambda: lookup.spec["command"]["argv"].append("x"),
        lambda: lookup.command["argv"].__setitem__(0, "x"),
        lambda: lookup.input_schema["properties"].__setitem__("x", {}),
        lambda: lookup.files.clear(),
        lambda: compiled.by_key.__setitem__(("Agent", "x"), main),
    ]
    for mutate in mutations:
        with pytest.raises((TypeError, AttributeError)):
            mutate()
    assert isinstance(main.tools, tuple) and isinstance(main.spec["tools"], tuple)
    compiled.digests()["agent/main"] = "sha256:0"  # a copy: the set is untouched
    assert compiled.get("Agent", "main").digest == main.digest  # type: ignore[union-attr]


def test_recompiling_never_touches_old_definitions(tmp_path: Path) -> None:
    root = write_set(tmp_path / "set", by_kind(documents()))
    compiler = Compiler(root)
    old = compiler.compile()
    old_main = old.get("Agent", "main")
    assert old_main is not None
    snapshot = (old.digest, old_main.digest, old_main.instructions, dict(old_main.closure))
    (root / "prompts/main.md").write_text("Something else.\n")
    shutil.rmtree(root / "skills")
    docs = [{**d, "skills": []} if d["name"] == "main" else d for d in documents()]
    write_set(root, by_kind(docs))
    new = compiler.compile()
    assert new.digest != old.digest
    assert (old.digest, old_main.digest, old_main.instructions, dict(old_main.closure)) == snapshot
