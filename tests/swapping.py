"""What the hot-swap tests share: a versioned definition tree, atomic edits, swap waits.

The tree holds two agents, each on its own scripted model, each in its own
file. `edited` says its version in every answer ("v1: hello", "v1 passed the
gate"), so a turn's output proves which definitions it ran on; rewriting
`edited.yaml` with another version changes `edited`'s digest and nothing of
`other`. "wait PATH" holds a turn open in the `gate` tool until PATH exists.

Every edit replaces a whole file at once (a hidden temporary file renamed
over it), so a reload never reads half a write.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx

from server.compiler.compiler import Compiler
from tests.live import gate_yaml


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` (dedented) in one rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.writing")
    tmp.write_text(textwrap.dedent(text).lstrip("\n"), "utf-8")
    os.replace(tmp, path)


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


def line_of(path: Path, text: str) -> int:
    """The line (from 1) of `path` that holds `text`."""
    return next(n for n, line in enumerate(path.read_text("utf-8").splitlines(), 1) if text in line)

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


async def set_digest(client: httpx.AsyncClient) -> str:
    r = await client.get("/v1/definitions")
    assert r.status_code == 200, r.text
    return r.json()["digest"]


async def swaps(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    """Every recorded swap report, newest first."""
    r = await client.get("/v1/definitions/history", params={"limit": 1000})
    assert r.status_code == 200, r.text
    return r.json()["items"]


async def next_swap(client: httpx.AsyncClient, seen: int,
                    where: Callable[[dict[str, Any]], bool] = lambda report: True) -> dict[str, Any]:
    """The first report after the first `seen` that satisfies `where` (polls; bound it outside)."""
    while True:
        history = await swaps(client)
        for report in reversed(history[: len(history) - seen]):
            if where(report):
                return report
        await anyio.sleep(0.02)


PROBE = "kind: Model\nname: probe\ndescription: A change for the watcher to see.\nprovider: scripted\n"


async def watcher_live(client: httpx.AsyncClient, root: Path) -> dict[str, Any]:
    """Add a probe definition, and write it again until the watcher reports a swap.

    The watcher starts with the server but may not have subscribed to the
    directory yet when the first request is answered; an edit made before it
    has would never be reported. From the first report on, edits are seen.
    Every write has the same content, so a write seen late reloads an
    unchanged set, which leaves no report (outside locked mode).
    """
    with anyio.fail_after(20):
        while True:
            before = len(await swaps(client))
            write_atomic(root / "probe.yaml", PROBE)
            with anyio.move_on_after(2.0):
                return await next_swap(client, before)


async def create_conversation(client: httpx.AsyncClient, agent: str) -> str:
    r = await client.post("/v1/conversations", json={"agent": agent})
    assert r.status_code == 201, r.text
    return r.json()["id"]


async def say(client: httpx.AsyncClient, conversation_id: str, content: str) -> dict[str, Any]:
    """One turn; its result once it has ended."""
    r = await client.post(f"/v1/conversations/{conversation_id}/messages", json={"content": content})
    assert r.status_code == 200, r.text
    return r.json()


async def turns(client: httpx.AsyncClient, conversation_id: str) -> list[dict[str, Any]]:
    r = await client.get(f"/v1/conversations/{conversation_id}/turns", params={"limit": 1000})
    assert r.status_code == 200, r.text
    return r.json()["items"]
