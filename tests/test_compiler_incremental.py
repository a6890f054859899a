"""Recompiling told what changed (as the watcher does) gives exactly a fresh compile's result."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.compiler.compiler import Compiler
from server.errors import DefinitionsInvalid
from tests.support.trees import write_tree

FILES = {
    "models.yaml": """
        kind: Model
        name: m
        provider: scripted
        """,
    "a.yaml": """
        kind: Agent
        name: a
        model: m
        instructions_file: prompts/a.md
        agents: [b]
        """,
    "b.yaml": """
        kind: Agent
        name: b
        model: m
        """,
    "prompts/a.md": "Be brief.\n",
}


def fresh(root: Path) -> dict[str, str]:
    return Compiler(root).compile().digests()


def test_told_recompiles_match_fresh_compiles(tmp_path: Path) -> None:
    root = write_tree(tmp_path, FILES)
    compiler = Compiler(root)
    first = compiler.compile().digests()
    (root / "b.yaml").write_text("kind: Agent\nname: b\nmodel: m\ninstructions: changed\n")
    second = compiler.compile([root / "b.yaml"]).digests()
    assert second == fresh(root)
    # b changed, and a reaches b: both digests move, the model's does not
    assert {k for k in first if first[k] != second[k]} == {"agent/a", "agent/b"}
    (root / "prompts" / "a.md").write_text("Be very brief.\n")
    third = compiler.compile([str(root / "prompts" / "a.md")]).digests()
    assert third == fresh(root) and third["agent/a"] != second["agent/a"]


def test_a_new_or_deleted_file_falls_back_to_a_full_check(tmp_path: Path) -> None:
    root = write_tree(tmp_path, FILES)
    compiler = Compiler(root)
    compiler.compile()
    (root / "c.yaml").write_text("kind: Agent\nname: c\nmodel: m\n")
    added = compiler.compile([root / "c.yaml"]).digests()
    assert "agent/c" in added and added == fresh(root)
    (root / "c.yaml").unlink()
    removed = compiler.compile([root / "c.yaml"]).digests()
    assert "agent/c" not in removed and removed == fresh(root)


def test_an_error_then_its_fix_while_told(tmp_path: Path) -> None:
    root = write_tree(tmp_path, FILES)
    compiler = Compiler(root)
    compiler.compile()
    (root / "b.yaml").write_text("kind: Agent\nname: b\nmodel: missing\n")
    with pytest.raises(DefinitionsInvalid) as caught:
        compiler.compile([root / "b.yaml"])
    assert "no Model named 'missing'" in str(caught.value.errors[0])
    (root / "b.yaml").write_text("kind: Agent\nname: b\nmodel: m\ndescription: fixed\n")
    assert compiler.compile([root / "b.yaml"]).digests() == fresh(root)
