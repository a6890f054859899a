"""The transcript file hooks read (`transcript_path`, CONTRACT §2) goes with its conversation.

A real Corral on loopback; a `Stop` hook (`hooks/record_transcript.py`)
writes down the `transcript_path` it was given and what the file held. The
file is looked at on disk, where the hook found it.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.support.client import Conversation
from tests.support.servers import corral_server
from tests.support.trees import write_tree

pytestmark = pytest.mark.anyio
SCRIPTS = Path(__file__).parent / "hooks"


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Path]]:
    root = tmp_path / "defs"
    shutil.copytree(SCRIPTS, root / "hooks", ignore=shutil.ignore_patterns("__pycache__"))
    log = tmp_path / "recorded.jsonl"
    write_tree(root, {"agents.yaml": f"""
        kind: Model
        name: m
        provider: scripted
        default: "heard: {{input}}"
        ---
        kind: Hook
        name: record
        event: Stop
        command: [{json.dumps(sys.executable)}, hooks/record_transcript.py, {json.dumps(str(log))}]
        ---
        kind: Agent
        name: hooked
        model: m
        hooks: [record]
    """})
    with corral_server(root, tmp_path / "state") as url:
        async with httpx.AsyncClient(base_url=url, timeout=30, trust_env=False) as client:
            yield client, log


def recorded(log: Path, conversation_id: str) -> list[dict]:
    lines = log.read_text("utf-8").splitlines() if log.exists() else []
    return [r for r in map(json.loads, lines) if r["input"]["session_id"] == conversation_id]


async def test_deleting_a_conversation_removes_its_transcript_file(served) -> None:
    client, log = served
    gone, kept = await Conversation.create(client, "hooked"), await Conversation.create(client, "hooked")
    for conversation in (gone, kept):
        assert (await conversation.say("hello"))["output"] == "heard: hello"
    paths = {}
    for conversation in (gone, kept):
        (entry,) = recorded(log, conversation.id)
        assert [m["content"] for m in entry["transcript"]] == ["hello", "heard: hello"]  # the hook read it
        paths[conversation.id] = Path(entry["input"]["transcript_path"])
        assert paths[conversation.id].is_file()
    assert paths[gone.id] != paths[kept.id]

    r = await client.delete(gone.path)
    assert r.status_code == 204, r.text
    assert not paths[gone.id].exists()  # its messages no longer lie on disk
    assert paths[kept.id].is_file()
    assert (await client.get(gone.path)).status_code == 404
    assert (await kept.say("again"))["output"] == "heard: again"
