"""A catalogue of broken definition directories and the precise error each must produce.

Every case starts from a small valid set (a scripted Model, a command Tool, an
Agent using them), overrides or adds a few files, and expects exactly one
error: FILE:LINE[:COL], kind/name, field path, and a fragment of the message.
Compilation must fail with `DefinitionsInvalid` and nothing else.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from server.compiler.compiler import Compiler
from server.errors import DefinitionError, DefinitionsInvalid

REPO = Path(__file__).resolve().parent.parent

MODEL = """\
kind: Model
name: bot
provider: scripted
script:
  - when: hello
    reply: hi
"""
TOOL = """\
kind: Tool
name: echo
input_schema:
  type: object
  properties:
    text: {type: string}
command:
  argv: [echo, "{text}"]
"""
AGENT = """\
kind: Agent
name: helper
model: bot
tools: [echo]
"""
BASE = {"models.yaml": MODEL, "tools.yaml": TOOL, "agent.yaml": AGENT}
SKILL_OK = "---\nname: poems\ndescription: Poems.\n---\nWrite a poem.\n"
SECOND_MODEL = "---\nkind: Model\nname: b2\nprovider: scripted\nfallbacks: [bot]\n"


@dataclass(frozen=True)
class Link:
    """A symlink to `target`, a path under tmp_path/outside (outside the definitions)."""

    target: str


def build(tmp_path: Path, files: dict[str, str | bytes | Link | None]) -> Path:
    outside = tmp_path / "outside"
    (outside / "pack").mkdir(parents=True)
    (outside / "secret.md").write_text("not yours\n")
    (outside / "pack" / "m.yaml").write_text(MODEL.replace("bot", "other"))
    root = tmp_path / "defs"
    for rel, content in {**BASE, **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Link):
            path.symlink_to(outside / content.target)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        elif content is not None:
            path.write_text(content)
    return root


def errors_of(root: Path) -> tuple[DefinitionError, ...]:
    with pytest.raises(DefinitionsInvalid) as info:
        Compiler(root).compile()
    return info.value.errors


def where(e: DefinitionError) -> str:
    return f"{e.file}:{e.line}:{e.column}:"


def who(e: DefinitionError) -> str:
    return f"{e.kind}/{e.name}" if e.kind else "document"


DEEP_FLOW = "kind: Tool\nname: deep\nx: " + "[" * 10_000 + "]" * 10_000 + "\n"
DEEP_BLOCK = "x:\n" + "- " * 10_000 + "a\n"
LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)
MCP = "kind: MCPServer\nname: files\ncommand: mcp-files\ntools: {include: [read]}\n"

# id, files, "FILE:LINE[:COL]", kind/name, field ("" = the whole document), message fragment
CASES = [
    # --- files and YAML text ---
    ("yaml-syntax", {"agent.yaml": "kind: Agent\nname: helper\nmodel: [bot\n"}, "agent.yaml:4:1", "document",
     "", "did not find expected ',' or ']' (while parsing a flow sequence at line 3, column 8)"),
    ("yaml-bad-indent", {"agent.yaml": AGENT.replace("tools", "  tools")}, "agent.yaml:4:8", "document", "",
     "mapping values are not allowed"),
    ("yaml-unclosed-quote", {"agent.yaml": "kind: Agent\nname: 'helper\nmodel: bot\n"}, "agent.yaml:4:1",
     "document", "", "(while scanning a quoted scalar at line 2, column 7)"),
    ("tab-indentation", {"agent.yaml": AGENT.replace("tools: [echo]", "tools:\n\t- echo")}, "agent.yaml:5:1",
     "document", "", "tab character; indent YAML with spaces"),
    ("duplicate-key", {"agent.yaml": AGENT + "model: bot\n"}, "agent.yaml:5:1", "document", "",
     "duplicate key 'model'"),
    ("python-tag", {"agent.yaml": AGENT + "description: !!python/object:os.system {}\n"}, "agent.yaml:5:14",
     "document", "", "unsupported tag tag:yaml.org,2002:python/object:os.system"),
    ("inf-number", {"models.yaml": MODEL + "temperature: .inf\n"}, "models.yaml:7:14", "document", "",
     "numbers must be finite"),
    ("nan-number", {"models.yaml": MODEL + "timeout_s: .NaN\n"}, "models.yaml:7:12", "document", "",
     "numbers must be finite"),
    ("not-utf8", {"x.yaml": b"kind: Model\nname: x\ndescription: caf\xe9\nprovider: scripted\n"},
     "x.yaml:3:17", "document", "", "not UTF-8 text (byte 0xe9)"),
    ("ten-megabytes", {"big.yaml": "# " + "x" * (10 * 1024 * 1024) + "\n"}, "big.yaml:1:1", "document", "",
     "the limit is 1048576"),
    ("deep-block-lists", {"deep.yaml": DEEP_BLOCK}, "deep.yaml:2:127", "document", "",
     "nesting deeper than 64 levels"),
    ("deep-flow-lists", {"deep.yaml": DEEP_FLOW}, "deep.yaml:3", "document", "", "nesting"),
    ("billion-laughs", {"bomb.yaml": LAUGHS}, "bomb.yaml:5", "document", "", "more than 100000 nodes"),
    ("not-a-mapping", {"x.yaml": "- kind: Agent\n"}, "x.yaml:1:1", "document", "", "must be a mapping"),
    # --- kind, name, fields ---
    ("no-kind", {"x.yaml": "name: thing\nprovider: scripted\n"}, "x.yaml:1:1", "document", "",
     "missing `kind` (one of Agent, Model"),
    ("unknown-kind", {"x.yaml": "name: thing\nkind: Agnet\n"}, "x.yaml:2:1", "document", "kind",
     "unknown kind 'Agnet' (did you mean 'Agent'?)"),
    ("kind-not-a-string", {"x.yaml": "kind: [Agent]\nname: x\n"}, "x.yaml:1:1", "document", "kind",
     "unknown kind ['Agent']"),
    ("unknown-field", {"agent.yaml": AGENT + "max_step: 3\n"}, "agent.yaml:5:1", "Agent/helper", "max_step",
     "unknown field 'max_step' (did you mean 'max_steps'?)"),
    ("unknown-nested-field", {"tools.yaml": TOOL + "  timeout: 5\n"}, "tools.yaml:9:3", "Tool/echo",
     "command.timeout", "(did you mean 'timeout_s'?)"),
    ("wrong-type", {"agent.yaml": AGENT + "max_steps: lots\n"}, "agent.yaml:5:1", "Agent/helper", "max_steps",
     "valid integer"),
    ("scalar-for-list", {"agent.yaml": AGENT.replace("[echo]", "echo")}, "agent.yaml:4:1", "Agent/helper",
     "tools", "Input should be a list"),
    ("missing-required", {"models.yaml": "kind: Model\nname: bot\n"}, "models.yaml:1:1", "Model/bot",
     "provider", "required field 'provider' is missing"),
    ("missing-required-nested", {"tools.yaml": "kind: Tool\nname: echo\nhttp:\n  method: GET\n"},
     "tools.yaml:3:1", "Tool/echo", "http", "required field 'url' is missing"),
    ("name-uppercase", {"agent.yaml": AGENT.replace("helper", "Helper")}, "agent.yaml:2:1", "Agent/Helper",
     "name", "should match pattern"),
    ("name-too-long", {"agent.yaml": AGENT.replace("helper", "a" * 64)}, "agent.yaml:2:1",
     "Agent/" + "a" * 64, "name", "should match pattern"),
    ("literal-api-key", {"m.yaml": "kind: Model\nname: gpt\nprovider: openai\nmodel: gpt-4o\n"
                         "api_key: sk-abc\n"}, "m.yaml:5:1", "Model/gpt", "api_key",
     "write secrets as ${ENV_VAR} references"),
    ("http-and-command", {"tools.yaml": TOOL + "http:\n  url: https://example.com\n"}, "tools.yaml:1:1",
     "Tool/echo", "", "exactly one of `http`, `command` or `a2a`"),
    ("hook-event", {"h.yaml": "kind: Hook\nname: guard\nevent: PreTool\ncommand: ls\n"}, "h.yaml:3:1",
     "Hook/guard", "event", "'pre_tool_use'"),
    ("hook-matcher-regex", {"h.yaml": "kind: Hook\nname: guard\nevent: PreToolUse\nmatcher: 'ec(ho'\n"
                            "command: ls\n"}, "h.yaml:4:1", "Hook/guard", "matcher",
     "not a valid regular expression: missing )"),
    ("window-under-output", {"models.yaml": MODEL + "context_window: 2000\n"}, "models.yaml:7:1", "Model/bot",
     "context_window", "a context window of 2000 tokens cannot hold max_output_tokens (4096)"),
    ("window-equal-output", {"models.yaml": MODEL + "max_output_tokens: 300\ncontext_window: 300\n"},
     "models.yaml:8:1", "Model/bot", "context_window", "cannot hold max_output_tokens (300)"),
    ("script-when-regex", {"models.yaml": MODEL + "  - when: '[oops'\n    reply: x\n"}, "models.yaml:7:5",
     "Model/bot", "script[1].when", "not a valid regular expression"),
    ("schema-invalid", {"tools.yaml": TOOL.replace("type: string", "type: strng")}, "tools.yaml:3:1",
     "Tool/echo", "input_schema", "not a valid JSON Schema at properties/text/type"),
    ("schema-root-not-object", {"tools.yaml": TOOL.replace("type: object", "type: array")}, "tools.yaml:3:1",
     "Tool/echo", "input_schema", 'root of input_schema must be {"type": "object"'),
    ("placeholder-argv", {"tools.yaml": TOOL.replace('"{text}"', '"{txt}"')}, "tools.yaml:8:16", "Tool/echo",
     "command.argv[1]", "placeholder {txt} is not a property of input_schema"),
    ("placeholder-http-body", {"tools.yaml": "kind: Tool\nname: echo\nhttp:\n  url: https://x.test/\n"
                               "  body:\n    q: [ok, '{q}']\n"}, "tools.yaml:6:13", "Tool/echo",
     "http.body.q[1]", "placeholder {q}"),
    # --- skills and paths ---
    ("skill-no-front-matter", {"skills/poems/SKILL.md": "# Poems\n"}, "skills/poems/SKILL.md:1:1",
     "document", "", "must start with YAML front matter"),
    ("skill-front-matter-open", {"skills/poems/SKILL.md": "---\nname: poems\n"}, "skills/poems/SKILL.md:1:1",
     "document", "", "not closed by a --- line"),
    ("skill-name-not-folder", {"skills/poems/SKILL.md": SKILL_OK.replace("poems", "poem")},
     "skills/poems/SKILL.md:2:1", "Skill/poem", "name", "must match its folder name 'poems'"),
    ("instructions-dotdot", {"agent.yaml": AGENT + "instructions_file: ../outside/secret.md\n"},
     "agent.yaml:5:1", "Agent/helper", "instructions_file", "resolves outside the definition directory"),
    ("instructions-absolute", {"agent.yaml": AGENT + "instructions_file: /etc/passwd\n"}, "agent.yaml:5:1",
     "Agent/helper", "instructions_file", "'/etc/passwd' is an absolute path"),
    ("instructions-missing", {"agent.yaml": AGENT + "instructions_file: prompt.md\n"}, "agent.yaml:5:1",
     "Agent/helper", "instructions_file", "file not found: prompt.md"),
    ("symlink-file-out", {"agent.yaml": AGENT + "instructions_file: prompt.md\n",
                          "prompt.md": Link("secret.md")}, "agent.yaml:5:1", "Agent/helper",
     "instructions_file", "resolves outside the definition directory"),
    ("symlink-yaml-out", {"o.yaml": Link("pack/m.yaml")}, "o.yaml:1:1", "document", "",
     "symlink points outside the definition directory"),
    ("symlink-folder-out", {"linked": Link("pack")}, "linked:1:1", "document", "",
     "symlink points outside the definition directory"),
    ("skill-symlink-out", {"skills/poems/SKILL.md": SKILL_OK, "skills/poems/s.md": Link("secret.md")},
     "skills/poems/SKILL.md:2:1", "Skill/poems", "", "s.md is a symlink out of the skill folder"),
    # --- references across documents ---
    ("dangling-model", {"agent.yaml": AGENT.replace("model: bot", "model: bto")}, "agent.yaml:3:1",
     "Agent/helper", "model", "no Model named 'bto' (did you mean 'bot'?)"),
    ("dangling-tool", {"agent.yaml": AGENT.replace("[echo]", "[echo, ecko]")}, "agent.yaml:4:15",
     "Agent/helper", "tools[1]", "no Tool or MCPServer named 'ecko' (did you mean 'echo'?)"),
    ("dangling-sub-agent", {"agent.yaml": AGENT + "agents: [ghost]\n"}, "agent.yaml:5:10", "Agent/helper",
     "agents[0]", "no Agent named 'ghost'"),
    ("dangling-skill", {"agent.yaml": AGENT + "skills: [ghost]\n"}, "agent.yaml:5:10", "Agent/helper",
     "skills[0]", "no Skill named 'ghost'"),
    ("dangling-hook", {"agent.yaml": AGENT + "hooks:\n  - ghost\n"}, "agent.yaml:6:5", "Agent/helper",
     "hooks[0]", "no Hook named 'ghost'"),
    ("dangling-fallback", {"models.yaml": MODEL + "fallbacks: [ghost]\n"}, "models.yaml:7:13", "Model/bot",
     "fallbacks[0]", "no Model named 'ghost'"),
    ("unknown-server-tool", {"agent.yaml": AGENT.replace("[echo]", "[echo, files/read]")}, "agent.yaml:4:15",
     "Agent/helper", "tools[1]", "no MCPServer named 'files'"),
    ("filtered-server-tool", {"mcp.yaml": MCP, "agent.yaml": AGENT.replace("[echo]", "[echo, files/write]")},
     "agent.yaml:4:15", "Agent/helper", "tools[1]", "MCPServer 'files' filters out tool 'write'"),
    ("tool-listed-twice", {"agent.yaml": AGENT.replace("[echo]", "[echo, echo]")}, "agent.yaml:4:15",
     "Agent/helper", "tools[1]", "'echo' is listed twice"),
    ("duplicate-name-two-files", {"zz.yaml": "kind: Tool\nname: echo\ncommand: {argv: [ls]}\n"},
     "zz.yaml:2:1", "Tool/echo", "name", "duplicate Tool name; first defined at tools.yaml:1"),
    ("sub-agent-cycle", {"ab.yaml": "kind: Agent\nname: a\nmodel: bot\nagents: [b]\n---\n"
                         "kind: Agent\nname: b\nmodel: bot\nagents: [a]\n"}, "ab.yaml:9:10", "Agent/b",
     "agents[0]", "sub-agent cycle: a -> b -> a"),
    ("sub-agent-self", {"agent.yaml": AGENT + "agents:\n  - helper\n"}, "agent.yaml:6:5", "Agent/helper",
     "agents[0]", "an agent cannot call itself"),
    ("fallback-cycle", {"models.yaml": MODEL + "fallbacks: [b2]\n" + SECOND_MODEL}, "models.yaml:12:13",
     "Model/b2", "fallbacks[0]", "fallback cycle: bot -> b2 -> bot"),
    ("fallback-self", {"models.yaml": MODEL + "fallbacks: [bot]\n"}, "models.yaml:7:13", "Model/bot",
     "fallbacks[0]", "a model cannot fall back to itself"),
]


def test_the_base_set_is_valid(tmp_path: Path) -> None:
    assert len(Compiler(build(tmp_path, {})).compile()) == 3


@pytest.mark.parametrize(("files", "loc", "owner", "field", "message"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_broken_input(tmp_path: Path, files: dict, loc: str, owner: str, field: str, message: str) -> None:
    errors = errors_of(build(tmp_path, files))
    assert len(errors) == 1, "\n".join(map(str, errors))
    error = errors[0]
    assert where(error).startswith(loc + ":"), str(error)
    assert (who(error), error.field) == (owner, field), str(error)
    assert message in error.message, str(error)


def test_catalogue_ids_are_distinct() -> None:
    ids = [c[0] for c in CASES]
    assert len(ids) == len(set(ids)) >= 30


def test_every_error_in_every_file_in_one_run(tmp_path: Path) -> None:
    root = build(tmp_path, {
        "agent.yaml": AGENT + "max_step: 3\n",
        "models.yaml": MODEL + "  - when: '[oops'\n    reply: x\n",
        "broken.yaml": "kind: Tool\nname: [x\n",
        "more/second.yaml": "kind: Agnet\nname: q\n---\nkind: Hook\nname: h\nevent: nope\ncommand: ls\n",
        "skills/poems/SKILL.md": "no front matter\n",
    })
    errors = errors_of(root)
    assert errors == tuple(sorted(errors))
    assert [where(e) for e in errors] == [
        "agent.yaml:5:1:", "broken.yaml:3:1:", "models.yaml:7:5:", "more/second.yaml:1:1:",
        "more/second.yaml:6:1:", "skills/poems/SKILL.md:1:1:",
    ]


def test_every_dangling_reference_in_one_run(tmp_path: Path) -> None:
    root = build(tmp_path, {
        "agent.yaml": AGENT.replace("[echo]", "[ecko, files/x]") + "agents: [ghost]\n",
        "models.yaml": MODEL + "fallbacks: [nobody]\n",
    })
    assert [(where(e), e.field) for e in errors_of(root)] == [
        ("agent.yaml:4:9:", "tools[0]"), ("agent.yaml:4:15:", "tools[1]"),
        ("agent.yaml:5:10:", "agents[0]"), ("models.yaml:7:13:", "fallbacks[0]"),
    ]


def test_field_errors_and_dangling_references_in_one_run(tmp_path: Path) -> None:
    """A misspelled tool name shows up beside another document's field error, not after it is fixed;
    a name whose document is invalid is not reported dangling as well."""
    root = build(tmp_path, {
        "agent.yaml": AGENT.replace("[echo]", "[ecko]"),
        "models.yaml": MODEL + "temprature: 0.2\n",
    })
    assert [(where(e), e.field) for e in errors_of(root)] == [
        ("agent.yaml:4:9:", "tools[0]"), ("models.yaml:7:1:", "temprature"),
    ]


@pytest.mark.parametrize("cut", range(1, len(TOOL + AGENT), 3))
def test_truncated_files_never_crash(tmp_path: Path, cut: int) -> None:
    text = TOOL + "---\n" + AGENT
    root = build(tmp_path, {"tools.yaml": None, "agent.yaml": text[:cut] + "\n"})
    try:
        Compiler(root).compile()
    except DefinitionsInvalid as exc:
        assert all(e.file == "agent.yaml" and e.line >= 1 and e.column >= 1 for e in exc.errors)


CLI_LINE = re.compile(r"^(?P<file>[^:\s]+):(?P<line>\d+):(?P<col>\d+): (\w+/[\w-]+|document): \S+: .+$")
CLI_CASES = ["yaml-syntax", "kind-not-a-string", "unknown-field", "dangling-tool", "symlink-folder-out"]


def _validate_command() -> list[str]:
    script = Path(sys.executable).parent / "corral"
    if script.is_file():
        return [str(script), "validate"]
    return [sys.executable, "-m", "server.cli", "validate"]


@pytest.mark.parametrize("case_id", CLI_CASES)
def test_cli_reports_broken_dirs(tmp_path: Path, case_id: str) -> None:
    case = next(c for c in CASES if c[0] == case_id)
    root = build(tmp_path, case[1])
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([*_validate_command(), str(root)], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=60)
    assert done.returncode == 1
    assert "Traceback" not in done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[-1] == "1 error(s)"
    match = CLI_LINE.match(lines[0])
    assert match, lines[0]
    assert f"{match['file']}:{match['line']}:{match['col']}".startswith(case[2])
    assert case[5] in lines[0]


def test_cli_accepts_the_base_set(tmp_path: Path) -> None:
    done = subprocess.run([*_validate_command(), str(build(tmp_path, {}))], capture_output=True, text=True,
                          cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok: 3 definitions")
