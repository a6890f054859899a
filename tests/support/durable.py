"""What the durable-turn tests share: servers that die and come back, and streams that outlive them.

    node = Node("a", defs, state, env={...})      # one `corral serve` under a name and a state dir
    await node.start()                          # (again, after a kill: the same state, a new port)
    await node.kill()                           # SIGKILL; `terminate` is SIGTERM, `pause`/`go_on` STOP/CONT

    follower = Follower(conversation_id, lambda: [n.url for n in nodes if n.serving])
    tg.start_soon(follower.run)                 # GET .../events, resumed with Last-Event-ID when dropped
    end = await follower.wait(ended(turn_id))   # bounded
    follower.problems                           # every gap or duplicate it saw, as it arrived

A client of a durable turn sees its conversation's events through every
crash: when its connection drops it reconnects, to whichever server is up,
with the id of the last event it read. `Follower` is that client, and checks
on arrival that each event's id is the previous one's plus one. A server
that is paused (SIGSTOP) drops nothing, it just goes silent: the test that
pauses one moves the follower on (`reconnect`), as a client's read time-out
would. `Node.serving` is what a load balancer would route to: up, and not
being stopped.
"""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import httpx

from tests.support.events import Event, sse
from tests.support.servers import ServerProcess

TERMINAL = ("turn.completed", "turn.failed", "turn.cancelled")
READ_S = 20.0  # longer than the server's keep-alive (15 s): a connection this quiet is a stalled server
RETRY_S = 0.05  # between rounds of reconnection attempts while no server answers


def client_for(url: str, timeout: float = 30) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, timeout=timeout, trust_env=False)


def lines(path: Path) -> list[str]:
    """The lines of a file a tool appends to (none while it does not exist)."""
    return path.read_text().splitlines() if path.exists() else []


class Node:
    """One `corral serve` under a fixed name, state directory and environment, started again at will."""

    def __init__(self, name: str, definitions: Path, state: Path, env: dict[str, str] | None = None):
        self.name = name
        self.definitions = definitions
        self.state = state
        self.env = env or {}
        self.runs: list[ServerProcess] = []  # every process it has been, oldest first
        self.serving = False  # up and not being stopped: where a client may send

    @property
    def server(self) -> ServerProcess:
        return self.runs[-1]

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def running(self) -> bool:
        return bool(self.runs) and self.server.proc is not None and self.server.proc.poll() is None

    def launch(self) -> None:
        """Start a new process on the node's state, without waiting for it (see `ready`)."""
        self.runs.append(ServerProcess(self.definitions, self.state, env=self.env).launch())

    def ready(self, timeout_s: float = 60.0) -> None:
        """Wait (blocking) until the launched process serves."""
        self.server.start(timeout_s)
        self.serving = True

    async def start(self) -> None:
        """A new process on the same state (unless one runs), once it serves."""
        if not self.running:
            self.launch()
        await anyio.to_thread.run_sync(self.ready)

    async def kill(self) -> None:
        """SIGKILL, and wait for the process to be gone."""
        self.serving = False
        self.server.signal(signal.SIGKILL)
        await anyio.to_thread.run_sync(self.server.wait, 15.0)

    async def terminate(self, timeout_s: float = 30.0) -> int:
        """SIGTERM (no longer routed to from now on); its exit status."""
        self.serving = False
        self.server.signal(signal.SIGTERM)
        return await anyio.to_thread.run_sync(self.server.wait, timeout_s)

    def pause(self) -> None:
        self.serving = False
        self.server.signal(signal.SIGSTOP)

    def go_on(self) -> None:
        self.server.signal(signal.SIGCONT)
        self.serving = True

    def stop(self) -> None:
        """Whatever runs is killed (a paused process too)."""
        if self.running:
            self.server.signal(signal.SIGCONT)
        for run in self.runs:
            run.kill()
        self.serving = False

    def log(self, tail: int = 60) -> str:
        """The last lines each of its processes logged."""
        return "\n".join(f"--- {self.name}, process {n} (last {tail} lines of stderr)\n"
                         + "\n".join(run.lines[-tail:]) for n, run in enumerate(self.runs, 1))


class Follower:
    """A client following one conversation's events across crashes, checking every id on arrival."""

    def __init__(self, conversation_id: str, servers: Callable[[], Sequence[str]]):
        self.path = f"/v1/conversations/{conversation_id}/events"
        self.servers = servers
        self.events: list[Event] = []
        self.connections: list[str] = []  # the server each connection was made to, in order
        self.problems: list[str] = []  # gaps and duplicates, as they arrived
        self._arrived = anyio.Event()
        self._scope: anyio.CancelScope | None = None
        self._moved = False

    @property
    def last_id(self) -> int | None:
        return self.events[-1].id if self.events else None

    async def run(self) -> None:
        """Follow until cancelled: from the first event, then after the last one read."""
        while True:
            self._moved = False
            for url in list(self.servers()):
                await self._read(url)
                if self._moved:
                    break
            await anyio.sleep(RETRY_S)

    def reconnect(self) -> None:
        """Drop the connection now and resume (after the last id read) on a server that is serving."""
        self._moved = True
        if self._scope is not None:
            self._scope.cancel()

    async def _read(self, url: str) -> None:
        with anyio.CancelScope() as self._scope:
            headers = {} if self.last_id is None else {"Last-Event-ID": str(self.last_id)}
            try:
                timeout = httpx.Timeout(10.0, read=READ_S)
                async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=timeout) as client, \
                        client.stream("GET", self.path, headers=headers) as r:
                    if r.status_code != 200:
                        return
                    self.connections.append(url)
                    async for event in sse(r):
                        self._add(event, url)
            except httpx.HTTPError:
                pass  # dropped (killed, stopping, stalled): the next round reconnects
        self._scope = None

    def _add(self, event: Event, url: str) -> None:
        last = self.last_id
        if last is not None and event.id != last + 1:
            self.problems.append(f"after id {last} came id {event.id} ({event.name}) from {url}")
            if event.id is None or event.id <= last:
                return  # a duplicate: not read twice
        self.events.append(event)
        self._arrived.set()
        self._arrived = anyio.Event()

    async def wait(self, until: Callable[[Event], bool], bound: float = 30.0) -> Event:
        """The first event (of all read so far, and then as they come) that `until` accepts."""
        with anyio.fail_after(bound):
            seen = 0
            while True:
                for event in self.events[seen:]:
                    if until(event):
                        return event
                seen = len(self.events)
                await self._arrived.wait()

    def of(self, turn_id: str) -> list[Event]:
        """The turn's events: from its `turn.started` to its end (a conversation runs one turn at a time;
        deltas and tool events do not name their turn)."""
        span: list[Event] = []
        for event in self.events:
            if event.name == "turn.started" and event.data.get("turn_id") == turn_id:
                span = [event]
            elif span:
                span.append(event)
                if event.name in TERMINAL and event.data.get("turn_id") == turn_id:
                    break
        return span

    def check(self) -> list[str]:
        """Everything wrong with the stream read: gaps, duplicates, a turn started or ended twice."""
        problems = list(self.problems)
        ids = [e.id for e in self.events]
        if ids and ids != list(range(ids[0], ids[0] + len(ids))):
            problems.append(f"ids not consecutive: {ids}")
        started = Counter(e.data["turn_id"] for e in self.events if e.name == "turn.started")
        ends = Counter(e.data["turn_id"] for e in self.events if e.name in TERMINAL)
        problems += [f"turn {t} started {n} times" for t, n in started.items() if n != 1]
        problems += [f"turn {t} ended {n} times" for t, n in ends.items() if n != 1]
        problems += [f"turn {t} ended without starting" for t in ends if t not in started]
        return problems


def summary(events: Sequence[Event]) -> list[tuple[Any, ...]]:
    """Events as (id, name, turn_id) for an assertion message."""
    return [(e.id, e.name, e.data.get("turn_id")) for e in events]
