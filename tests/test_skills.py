"""Skills in real turns: `activate_skill` and `read_skill_resource` called by the scripted model of a
real Corral on loopback, and skills as MCP prompts (the official `mcp` client on /mcp).

`read_skill_resource` must give one compiled file of the skill's folder and nothing else: not a
file beside the folder, not an absolute path, not a symlink planted after compilation (the
compiler refuses one that is there already), not a file edited since compilation.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp.types as types
import pytest
from mcp import Client

from tests.support.client import talk
from tests.support.servers import corral_server
from tests.support.trees import write_tree

pytestmark = pytest.mark.anyio
BODY = "Fill every field of the form.\nRead `reference/forms.md` first."
FORMS = "Form 1040: the name goes on line 1.\n"
SECRET = "the definition directory's secret, not the skill's\n"


def definitions(root: Path) -> Path:
    return write_tree(root, {
        "skills/pdf/SKILL.md": f"---\nname: pdf\ndescription: Fill in PDF forms.\n---\n{BODY}\n",
        "skills/pdf/reference/forms.md": FORMS,
        "skills/pdf/changing.txt": "as compiled\n",
        "skills/secret": SECRET,
        "agent.yaml": r"""
            kind: Model
            name: scripted
            provider: scripted
            script:
              - when: "^activate (?P<skill>\\S+)$"
                tool_call: { name: activate_skill, arguments: { name: "{skill}" } }
              - when: "^read (?P<skill>\\S+) (?P<path>.+)$"
                tool_call: { name: read_skill_resource, arguments: { skill: "{skill}", path: "{path}" } }
            ---
            kind: Skill
            name: tone
            description: Answer in a friendly tone.
            instructions: Be kind.
            ---
            kind: Agent
            name: clerk
            description: Fills in forms.
            model: scripted
            skills: [pdf, tone]
        """,
    })


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("skills")
    defs = definitions(root / "defs")
    with corral_server(defs, root / "state") as url:
        yield url, defs


@pytest.fixture
async def client(served: tuple[str, Path]) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=served[0], timeout=15, trust_env=False) as http:
        yield http


@pytest.fixture
def skill_dir(served: tuple[str, Path]) -> Path:
    return served[1] / "skills" / "pdf"


async def tool_result(client: httpx.AsyncClient, content: str) -> dict[str, Any]:
    """Say `content` to the clerk in a new conversation; the one tool result of the turn."""
    _, answer = await talk(client, "clerk", content, bound=20)
    assert answer["status"] == "completed", answer
    [result] = [m for m in answer["messages"] if m["role"] == "tool"]
    assert answer["output"] == result["content"].strip()  # the reply is {tool_result}: what the model read
    return result


async def test_activation_returns_the_body_and_the_resources(client: httpx.AsyncClient) -> None:
    result = await tool_result(client, "activate pdf")
    assert not result["is_error"]
    assert result["content"] == (f"{BODY}\n\nResources (read with `read_skill_resource`):\n"
                                 "- changing.txt\n- reference/forms.md")
    inline = await tool_result(client, "activate tone")
    assert inline["content"] == "Be kind." and not inline["is_error"]


async def test_a_resource_is_read(client: httpx.AsyncClient) -> None:
    result = await tool_result(client, "read pdf reference/forms.md")
    assert not result["is_error"] and result["content"] == FORMS
    dotted = await tool_result(client, "read pdf reference/../reference/forms.md")  # still inside
    assert not dotted["is_error"] and dotted["content"] == FORMS


@pytest.mark.parametrize(("path", "error"), [
    ("../secret", "'../secret' is outside the skill's folder"),
    ("/etc/passwd", "'/etc/passwd' is outside the skill's folder"),
    ("../../agent.yaml", "'../../agent.yaml' is outside the skill's folder"),
    ("missing.md", "skill pdf has no file 'missing.md'"),
    ("reference", "skill pdf has no file 'reference'"),
])
async def test_nothing_outside_the_skill_folder_is_read(client: httpx.AsyncClient, path: str,
                                                        error: str) -> None:
    result = await tool_result(client, f"read pdf {path}")
    assert result["is_error"] and result["content"] == error
    assert SECRET.strip() not in result["content"] and "root:" not in result["content"]


async def test_a_skill_without_a_folder_has_no_resources(client: httpx.AsyncClient) -> None:
    result = await tool_result(client, "read tone anything.md")
    assert result["is_error"] and result["content"] == "skill tone has no folder of resources"


@pytest.mark.parametrize("target", ["../secret", "/etc/passwd"])
async def test_a_symlink_planted_after_compiling_is_refused(client: httpx.AsyncClient, skill_dir: Path,
                                                            target: str) -> None:
    link = skill_dir / "escape.txt"
    os.symlink(target, link)
    try:
        result = await tool_result(client, "read pdf escape.txt")
        assert result["is_error"] and result["content"] == "'escape.txt' is outside the skill's folder"
        assert SECRET.strip() not in result["content"]
        # Compiled now, the same folder is refused whole, and the old set keeps serving.
        report = (await client.post("/v1/definitions/reload")).json()
        assert report["status"] == "rejected"
        assert any("escape.txt is a symlink out of the skill folder" in str(e) for e in report["errors"])
    finally:
        link.unlink()


async def test_a_file_edited_after_compiling_reads_as_compiled(client: httpx.AsyncClient,
                                                               skill_dir: Path) -> None:
    # The running definitions' digest covers "as compiled": what the model gets (server/deployment/vault.py).
    (skill_dir / "changing.txt").write_text("edited behind the server's back\n")
    result = await tool_result(client, "read pdf changing.txt")
    assert not result["is_error"]
    assert result["content"] == "as compiled\n"


async def test_skills_are_mcp_prompts(served: tuple[str, Path]) -> None:
    with anyio.fail_after(20):
        async with Client(served[0] + "/mcp") as client:
            prompts = {p.name: p for p in (await client.list_prompts()).prompts}
            got = await client.get_prompt("pdf", {"task": "my tax form"})
    assert set(prompts) == {"pdf", "tone"}
    assert prompts["pdf"].description == "Fill in PDF forms."
    assert prompts["tone"].description == "Answer in a friendly tone."
    [message] = got.messages
    assert isinstance(message.content, types.TextContent)
    assert message.content.text == f"{BODY}\n\nTask: my tax form"
