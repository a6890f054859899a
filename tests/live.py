"""What the HTTP API tests share: an SSE reader, and definitions whose turns wait on a gate.

A gated turn holds itself open without any timing: the scripted model asks
for the `gate` tool, a command that returns only once a given file exists.
The test creates that file when it wants the turn to go on, so "busy" is a
state the test controls, not a race it hopes to win.

    root = gated_definitions(tmp_path / "defs")
    ... send "wait /abs/path/to/gate" ...  # the turn blocks in the tool
    open_gate(path)                       # and now finishes
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio.abc
import httpx

from tests.conftest import write_tree

WAIT_PY = """import os, sys, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
print('open')
"""


@dataclass(frozen=True)
class Event:
    id: int | None
    name: str
    data: Any


async def sse(response: httpx.Response) -> AsyncIterator[Event]:
    """The events of a streaming response, as they arrive (comments and keep-alives skipped)."""
    event_id, name, data = None, "message", []
    async for line in response.aiter_lines():
        if not line:
            if data:
                yield Event(event_id, name, json.loads("\n".join(data)))
            event_id, name, data = None, "message", []
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "id":
            event_id = int(value)
        elif field == "event":
            name = value
        elif field == "data":
            data.append(value)


async def read_events(client: httpx.AsyncClient, conversation_id: str, until: Callable[[Event], bool],
                      last_event_id: int | None = None) -> list[Event]:
    """`GET .../events` (resuming after `last_event_id`), up to and including the first `until` event."""
    headers = {} if last_event_id is None else {"Last-Event-ID": str(last_event_id)}
    seen: list[Event] = []
    async with client.stream("GET", f"/v1/conversations/{conversation_id}/events", headers=headers) as r:
        assert r.status_code == 200, await r.aread()
        assert r.headers["content-type"].startswith("text/event-stream")
        async for event in sse(r):
            seen.append(event)
            if until(event):
                return seen
    raise AssertionError(f"the event stream ended before the awaited event: {seen}")


def ended(turn_id: str | None = None) -> Callable[[Event], bool]:
    """A predicate: the end of `turn_id` (of any turn when None)."""
    names = ("turn.completed", "turn.failed", "turn.cancelled")
    return lambda e: e.name in names and turn_id in (None, e.data.get("turn_id"))


def named(name: str) -> Callable[[Event], bool]:
    return lambda e: e.name == name


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


class _Rest:
    """The rest of a response's lines, for `sse` to parse."""

    def __init__(self, lines: AsyncIterator[str]):
        self.lines = lines

    def aiter_lines(self) -> AsyncIterator[str]:
        return self.lines


async def follow_server_events(client: httpx.AsyncClient, until: Callable[[Event], bool], *,
                               task_status: anyio.abc.TaskStatus[list[Event]]) -> None:
    """`GET /v1/events` into a list, up to the first `until` event; started once subscribed."""
    seen: list[Event] = []
    async with client.stream("GET", "/v1/events") as r:
        assert r.status_code == 200
        lines = r.aiter_lines()
        assert (await anext(lines)).startswith(":")  # the first keep-alive: subscribed from here
        task_status.started(seen)
        async for event in sse(_Rest(lines)):  # type: ignore[arg-type]
            seen.append(event)
            if until(event):
                return
    raise AssertionError(f"the event stream ended before the awaited event: {seen}")
