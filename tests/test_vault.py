"""What runs is what the digest covered: script and skill files are kept by content."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from server.canonical import digest_bytes
from server.deployment.vault import FileChanged, FileVault
from tests.support.client import Conversation
from tests.support.servers import corral_server
from tests.support.trees import write_tree

DEFINITIONS = {
    "agent.yaml": """
        kind: Model
        name: m
        provider: scripted
        script:
          - when: say
            tool_call: { name: say }
            reply: "{tool_result}"
        ---
        kind: Tool
        name: say
        command: { argv: [python3, scripts/say.py] }
        ---
        kind: Agent
        name: a
        model: m
        tools: [say]
        """,
    "scripts/say.py": "print('version one')\n",
}


def test_resolve_prefers_the_file_then_the_kept_copy(tmp_path: Path) -> None:
    base = write_tree(tmp_path / "defs", {"s.py": "one\n"})
    digest = digest_bytes(b"one\n")
    vault = FileVault(tmp_path / "vault")
    vault.keep(base, {"s.py": digest})
    assert vault.resolve(base, "s.py", digest) == base / "s.py"
    (base / "s.py").write_text("two\n")
    kept = vault.resolve(base, "s.py", digest)
    assert kept != base / "s.py" and kept.read_text() == "one\n" and kept.name == "s.py"
    with pytest.raises(FileChanged, match=r"s\.py changed since this definition was compiled"):
        FileVault(None).resolve(base, "s.py", digest)


def test_keep_skips_a_file_already_edited(tmp_path: Path) -> None:
    base = write_tree(tmp_path / "defs", {"s.py": "edited\n"})
    vault = FileVault(tmp_path / "vault")
    vault.keep(base, {"s.py": digest_bytes(b"original\n")})
    assert not (tmp_path / "vault").exists()


@pytest.mark.anyio
async def test_a_pinned_conversation_runs_the_script_its_digest_covered(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "defs", DEFINITIONS)
    with corral_server(root, tmp_path / "state") as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            digest = (await client.get("/v1/agents/a")).json()["digest"]
            pinned = await Conversation.create(client, f"a@{digest}")
            (root / "scripts" / "say.py").write_text("print('version two')\n")
            report = (await client.post("/v1/definitions/reload")).json()
            assert report["status"] == "applied"
            current = await Conversation.create(client, "a")
            assert (await current.say("say"))["output"] == "version two"
            assert (await pinned.say("say"))["output"] == "version one"


@pytest.mark.anyio
async def test_a_pinned_skill_reads_its_files_after_a_restart(tmp_path: Path) -> None:
    files = {
        "agent.yaml": """
            kind: Model
            name: m
            provider: scripted
            script:
              - when: read
                tool_call: { name: read_skill_resource, arguments: { skill: notes, path: facts.txt } }
                reply: "{tool_result}"
            ---
            kind: Agent
            name: a
            model: m
            skills: [notes]
            """,
        "skills/notes/SKILL.md": "---\nname: notes\ndescription: Facts.\n---\nRead facts.txt.\n",
        "skills/notes/facts.txt": "the sky is blue\n",
    }
    root = write_tree(tmp_path / "defs", files)
    state = tmp_path / "state"
    with corral_server(root, state) as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            digest = (await client.get("/v1/agents/a")).json()["digest"]
            pinned = await Conversation.create(client, f"a@{digest}")
    (root / "skills" / "notes" / "facts.txt").write_text("the sky is green\n")  # a new digest on restart
    with corral_server(root, state) as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            answer = await pinned.through(client).say("read")
            assert answer["digest"] == digest
            assert answer["output"] == "the sky is blue"
