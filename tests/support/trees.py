"""Definition trees on disk: writing them, and the trees many tests share.

A gated turn holds itself open without any timing: the scripted model asks
for the `gate` tool, a command that returns only once a given file exists.
The test creates that file when it wants the turn to go on, so "busy" is a
state the test controls, not a race it hopes to win.

    root = gated_definitions(tmp_path / "defs")
    ... send "wait /abs/path/to/gate" ...  # the turn blocks in the tool
    open_gate(path)                       # and now finishes

The versioned tree holds two agents, each on its own scripted model, each in
its own file. `edited` says its version in every answer ("v1: hello", "v1
passed the gate"), so a turn's output proves which definitions it ran on;
rewriting `edited.yaml` with another version changes `edited`'s digest and
nothing of `other`. Every edit replaces a whole file at once (`write_atomic`:
a hidden temporary file renamed over it), so a reload never reads half a write.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import textwrap
from pathlib import Path

from server.compiler.compiler import Compiler

# What a checkout's definitions/ may hold besides the definitions: the README has a newcomer run
# `corral lock definitions`, and a test of its own lock must not find that one.
LEFT_BY_THE_README = shutil.ignore_patterns("corral.lock", "__pycache__")


def copy_definitions(source: Path, destination: Path) -> Path:
    """A copy of a definition tree, as compiled (without a lock file or caches left in the source)."""
    return Path(shutil.copytree(source, destination, ignore=LEFT_BY_THE_README))


def shipped_definitions(repo: Path, destination: Path) -> Path:
    """`repo`'s definitions/ as committed (HEAD), written to `destination`: what the tests serve as "the
    shipped definitions", so an agent a user adds to (or edits in) their checkout's definitions/ changes
    no test. Outside a git checkout (an unpacked archive), the tree as it is."""
    try:
        archive = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", "HEAD", "definitions"],
                                 capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return copy_definitions(repo / "definitions", destination)
    with tempfile.TemporaryDirectory() as unpacked, tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(unpacked, filter="data")
        return copy_definitions(Path(unpacked) / "definitions", destination)


WAIT_PY = """import os, sys, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
print('open')
"""


def write_tree(root: Path, files: dict[str, str]) -> Path:
    """Write `files` (relative path -> text, dedented) under `root`; returns root."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"), "utf-8")
    return root


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` (dedented) in one rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.writing")
    tmp.write_text(textwrap.dedent(text).lstrip("\n"), "utf-8")
    os.replace(tmp, path)


# --- the gate ------------------------------------------------------------------------------------


def gate_yaml() -> str:
    """The `gate` tool: returns once the file at its `path` argument exists."""
    argv = json.dumps(["python3", "-c", WAIT_PY, "{path}"])
    return f"""
        kind: Tool
        name: gate
        description: Return once the file at path exists.
        input_schema:
          type: object
          properties: {{ path: {{ type: string }} }}
          required: [path]
        command:
          argv: {argv}
          timeout_s: 30
    """


def gated_definitions(root: Path) -> Path:
    """Agents on a scripted model: "wait PATH" blocks in the `gate` tool until PATH exists."""
    return write_tree(root, {
        "models.yaml": r"""
            kind: Model
            name: scripted
            provider: scripted
            script:
              - when: "^wait (?P<path>\\S+)"
                tool_call: { name: gate, arguments: { path: "{path}" } }
                reply: "passed the gate"
            default: "echo: {input}"
        """,
        "tools.yaml": gate_yaml(),
        "agents.yaml": """
            kind: Agent
            name: gated
            description: Rejects a message while busy (the default).
            model: scripted
            tools: [gate]
            ---
            kind: Agent
            name: queued
            description: Queues a message while busy.
            model: scripted
            tools: [gate]
            on_busy: enqueue
        """,
    })


def open_gate(path: Path) -> None:
    path.write_text("open")


# --- the versioned tree --------------------------------------------------------------------------


def edited_yaml(version: str) -> str:
    return f"""
        kind: Model
        name: m_edited
        provider: scripted
        script:
          - when: "^wait (?P<path>\\\\S+)"
            tool_call: {{ name: gate, arguments: {{ path: "{{path}}" }} }}
            reply: "{version} passed the gate"
        default: "{version}: {{input}}"
        ---
        kind: Agent
        name: edited
        description: Answers with its version.
        model: m_edited
        tools: [gate]
    """


def broken_edited_yaml(version: str = "broken") -> str:
    """`edited.yaml` whose agent names a model that does not exist."""
    return edited_yaml(version).replace("model: m_edited", "model: m_missing")


OTHER_YAML = """
    kind: Model
    name: m_other
    provider: scripted
    script:
      - when: "^wait (?P<path>\\\\S+)"
        tool_call: { name: gate, arguments: { path: "{path}" } }
        reply: "other passed the gate"
    default: "other: {input}"
    ---
    kind: Agent
    name: other
    description: Never edited.
    model: m_other
    tools: [gate]
"""


def versioned_definitions(root: Path, version: str = "v1") -> Path:
    """The two-agent tree with `edited` at `version`; returns root."""
    write_atomic(root / "edited.yaml", edited_yaml(version))
    write_atomic(root / "other.yaml", OTHER_YAML)
    write_atomic(root / "tools.yaml", gate_yaml())
    return root


def agent_digest(root: Path, agent: str = "edited") -> str:
    """The digest `agent` compiles to in `root`, computed offline."""
    return Compiler(root).compile().by_key[("Agent", agent)].digest


def line_of(path: Path, text: str) -> int:
    """The line (from 1) of `path` that holds `text`."""
    return next(n for n, line in enumerate(path.read_text("utf-8").splitlines(), 1) if text in line)
