"""Durable turns (§9): a turn survives a crash, a paused replica and a rolling restart.

On the embedded SQLite store one `corral serve` is SIGKILLed and started again
on the same state directory; on PostgreSQL two replicas (`a`, `b`) share a
database, `a` is killed and `b` takes its turns over once `a`'s lease
(`LEASE_S`) lapses. Either way one crash cuts off several turns at once, each
at a different point, and each goes on by its own rule:

    stream   mid-model-stream (a fake OpenAI server holds the stream open): the request is made again
    safe     mid-tool, `replay: safe`: the tool runs again, with the same execution key
    unsafe   mid-tool, `replay: unsafe` (the default): not run again; the model is told the outcome is
             unknown
    ask      waiting on a permission (`permission: ask`): the same request stays pending and answerable
    doomed   (SQLite, `CORRAL_MAX_ATTEMPTS=2`) cut off in its tool on both attempts: it fails `interrupted`

A tool that blocks does so on a gate (a file the test creates), after writing
its side effect (a line: the execution key) to a log, so the test kills when
the log says the tool has run, never after a sleep. A crash's turns are cut
off once per backend (`sqlite_crash`, `postgres_crash`); the tests read what
came of each. On PostgreSQL a replica is also paused (SIGSTOP) past its lease
and continued after the other took its turn over, and both replicas restart
one after the other under a steady load of turns.

Every client's view of a conversation is a `Follower`: `GET .../events`,
resumed with `Last-Event-ID` on whichever server is up, checked for gaps and
duplicates as events arrive. Every wait is bounded and on a condition.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from server.runtime.loop import UNKNOWN_OUTCOME
from server.tools.base import execution_key
from tests.fakes import FakeOpenAI, Recorded, Reply, Stall, serve
from tests.support.durable import Follower, Node, client_for, lines, summary
from tests.support.events import Event, ended, named, read_events
from tests.support.postgres import PostgresServer
from tests.support.processes import wait_until
from tests.support.trees import open_gate, write_tree

pytestmark = pytest.mark.anyio

LEASE_S = 2.0  # PostgreSQL: short, so a take-over is quick, yet well above a busy machine's hiccups
GRACE_S = 1.0  # CORRAL_SHUTDOWN_GRACE_S of the replicas: a stopping replica hands its turns over soon
ANSWER = "the answer, asked for again"
PARTIAL = "partial"  # the stalled stream's text (the fake sends its first piece, "par", then nothing)
BOUND = 30.0  # any one wait

STEP_PY = """\
import os, sys, time
with open(sys.argv[1], "a") as log:  # the side effect, done at once
    log.write(os.environ.get("CORRAL_EXECUTION_KEY", "no key") + "\\n")
while len(sys.argv) > 2 and not os.path.exists(sys.argv[2]):  # then wait for the gate, if given one
    time.sleep(0.01)
print("stepped")
"""


def definitions(root: Path, fake_url: str) -> Path:
    logged = "{ type: object, properties: { log: { type: string }, gate: { type: string } },"
    logged += " required: [log] }"
    return write_tree(root, {
        "models.yaml": f"""
            kind: Model
            name: remote
            provider: openai
            model: fake-model
            base_url: {fake_url}/v1
            api_key: ${{DURABLE_KEY:-sk-fake}}
            timeout_s: 60
            retries: 0
            ---
            kind: Model
            name: offline
            provider: scripted
            script:
              - when: "^safe (?P<log>\\\\S+) (?P<gate>\\\\S+)"
                tool_call: {{ name: safe_step, arguments: {{ log: "{{log}}", gate: "{{gate}}" }} }}
                reply: "safe: {{tool_result}}"
              - when: "^unsafe (?P<log>\\\\S+) (?P<gate>\\\\S+)"
                tool_call: {{ name: unsafe_step, arguments: {{ log: "{{log}}", gate: "{{gate}}" }} }}
                reply: "{{tool_result}}"
              - when: "^ask (?P<log>\\\\S+)"
                tool_call: {{ name: asked_step, arguments: {{ log: "{{log}}" }} }}
                reply: "asked: {{tool_result}}"
              - when: "^nap"
                tool_call: {{ name: nap }}
                reply: "rested: {{input}}"
            default: "echo: {{input}}"
        """,
        "tools.yaml": f"""
            kind: Tool
            name: safe_step
            description: Append the execution key to a log, then wait for the gate.
            replay: safe
            input_schema: {logged}
            command: {{ argv: [python3, step.py, "{{log}}", "{{gate}}"], timeout_s: 60 }}
            ---
            kind: Tool
            name: unsafe_step
            description: Append the execution key to a log (not to be done twice), then wait for the gate.
            input_schema: {logged}
            command: {{ argv: [python3, step.py, "{{log}}", "{{gate}}"], timeout_s: 60 }}
            ---
            kind: Tool
            name: asked_step
            description: Append the execution key to a log, once a person allows it.
            permission: ask
            input_schema: {logged}
            command: {{ argv: [python3, step.py, "{{log}}"], timeout_s: 60 }}
            ---
            kind: Tool
            name: nap
            description: Take a little while.
            replay: safe
            command: {{ argv: [python3, -c, "import time; time.sleep(0.3); print('rested')"], timeout_s: 30 }}
        """,
        "agents.yaml": """
            kind: Agent
            name: streamer
            description: Answers with the remote model.
            model: remote
            ---
            kind: Agent
            name: worker
            description: Runs the step tools.
            model: offline
            tools: [safe_step, unsafe_step, asked_step, nap]
        """,
        "step.py": STEP_PY,
    })


# --- where turns run ---------------------------------------------------------------------------


@dataclass
class Deployment:
    """The servers a client may reach; turns are sent to the first one serving."""

    nodes: list[Node]
    restarts: bool  # SQLite: a crash is a kill and a start on the same state; PostgreSQL: a kill

    def urls(self) -> list[str]:
        return [n.url for n in self.nodes if n.serving]

    async def crash(self) -> None:
        """SIGKILL the server the turns run on (SQLite: and start it again on the same state)."""
        [victim] = [n for n in self.nodes if n.serving][:1]
        await victim.kill()
        if self.restarts:
            await victim.start()

    async def up(self) -> None:
        for node in self.nodes:
            if not node.running:
                node.launch()
        for node in self.nodes:
            if not node.serving:
                await anyio.to_thread.run_sync(node.ready)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def log(self) -> str:
        return "\n".join(node.log() for node in self.nodes)

    async def request(self, method: str, path: str, **fields: Any) -> httpx.Response:
        """One request to the first server serving."""
        async with client_for(self.urls()[0]) as client:
            return await client.request(method, path, **fields)

    async def conversation(self, agent: str) -> str:
        r = await self.request("POST", "/v1/conversations", json={"agent": agent})
        assert r.status_code == 201, r.text
        return r.json()["id"]

    async def items(self, conversation_id: str, tail: str) -> list[dict[str, Any]]:
        r = await self.request("GET", f"/v1/conversations/{conversation_id}/{tail}", params={"limit": 1000})
        assert r.status_code == 200, r.text
        return r.json()["items"]


# --- a crash and the turns it cut off ------------------------------------------------------------


@dataclass
class Cut:
    """A turn a crash cut off: what its client saw, and what the server holds of it afterwards."""

    name: str
    agent: str
    content: str
    log: Path | None = None
    gate: Path | None = None
    conversation_id: str = ""
    follower: Follower | None = None
    turn_id: str = ""
    reply: httpx.Response | httpx.HTTPError | None = None  # the first client's answer, if any came
    replied: anyio.Event = field(default_factory=anyio.Event)  # set once `reply` is
    resumed: anyio.Event = field(default_factory=anyio.Event)
    problems: list[str] = field(default_factory=list)  # a step that failed or ran out of time
    asked: dict[str, Any] = field(default_factory=dict)  # permission.requested
    pending: list[dict[str, Any]] = field(default_factory=list)  # the permissions listed after the resume
    decided: httpx.Response | None = None
    end: Event | None = None
    marker: dict[str, Any] = field(default_factory=dict)  # the answer of a turn sent after it ended
    stored: list[Event] = field(default_factory=list)  # the conversation's events, replayed afterwards
    turns: list[dict[str, Any]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    permissions: list[dict[str, Any]] = field(default_factory=list)
    requests: list[Recorded] = field(default_factory=list)  # the fake model server's
    resumed_by: list[str] = field(default_factory=list)  # the servers that logged resuming it
    server_log: str = ""

    @property
    def events(self) -> list[Event]:
        assert self.follower is not None
        return self.follower.events

    def names(self) -> list[str]:
        assert self.follower is not None
        return [e.name for e in self.follower.of(self.turn_id)]

    def of_turn(self, name: str) -> list[dict[str, Any]]:
        assert self.follower is not None
        return [e.data for e in self.follower.of(self.turn_id) if e.name == name]

    def turn(self) -> dict[str, Any]:
        [turn] = [t for t in self.turns if t["id"] == self.turn_id]
        return turn

    def said(self) -> list[tuple[str, str]]:
        """The transcript of the cut turn, as (role, content)."""
        return [(m["role"], m["content"]) for m in self.messages if m["turn_id"] == self.turn_id]

    def ok(self) -> str:
        """'' when every step went as it should; else what went wrong, the events and the servers' logs."""
        if not self.problems:
            return ""
        events = summary(self.follower.events) if self.follower else []
        return f"{self.name}: {self.problems}\nevents: {events}\n{self.server_log}"


Step = Callable[[Cut, Deployment], Awaitable[None]]


async def guarded(cut: Cut, step: Step, deployment: Deployment) -> None:
    """Run one step of a cut turn; a failure or a wait that ran out is kept for its test to report."""
    try:
        await step(cut, deployment)
    except (TimeoutError, AssertionError, httpx.HTTPError, KeyError, ValueError) as exc:
        cut.problems.append(f"{step.__name__}: {type(exc).__name__}: {exc}")
        cut.server_log = deployment.log()


def cuts_in(work: Path, *, doomed: bool) -> list[Cut]:
    work.mkdir(parents=True, exist_ok=True)
    found = [
        Cut("stream", "streamer", "hello"),
        Cut("safe", "worker", f"safe {work / 'safe.log'} {work / 'safe.gate'}", work / "safe.log",
            work / "safe.gate"),
        Cut("unsafe", "worker", f"unsafe {work / 'unsafe.log'} {work / 'unsafe.gate'}", work / "unsafe.log",
            work / "unsafe.gate"),
        Cut("ask", "worker", f"ask {work / 'ask.log'}", work / "ask.log"),
    ]
    if doomed:  # its gate never opens: it is in its tool at both kills
        found.append(Cut("doomed", "worker", f"safe {work / 'doomed.log'} {work / 'doomed.gate'}",
                         work / "doomed.log", work / "doomed.gate"))
    return found


async def cut_off(deployment: Deployment, fake: FakeOpenAI, work: Path, *, doomed: bool = False,
                  when_resumed: Callable[[], Awaitable[None]] | None = None) -> dict[str, Cut]:
    """Start every cut turn, kill the server they run on when each is where it should be, and see each
    go on to its end (`doomed`, on a server that restarts: kill it again while that one is in its tool
    again). `when_resumed` runs once every turn has resumed."""
    fake.reset()
    fake.script(Stall(text=PARTIAL), Reply(text=ANSWER), Reply(text="marker"))
    cuts = cuts_in(work, doomed=doomed)
    try:
        async with anyio.create_task_group() as tg:
            for cut in cuts:
                cut.conversation_id = await deployment.conversation(cut.agent)
                cut.follower = Follower(cut.conversation_id, deployment.urls)
                tg.start_soon(cut.follower.run)
                tg.start_soon(first_client, cut, deployment.urls()[0])
            async with anyio.create_task_group() as each:
                for cut in cuts:
                    each.start_soon(guarded, cut, at_the_kill_point, deployment)
            await deployment.crash()
            async with anyio.create_task_group() as each:
                for cut in cuts:
                    each.start_soon(guarded, cut, goes_on, deployment)
                if when_resumed is not None:
                    each.start_soon(after_every_resume, cuts, when_resumed)
            if doomed:
                await deployment.crash()  # its second cut-off: no attempt is left
                await guarded(cuts[-1], fails, deployment)
            for cut in cuts:
                await guarded(cut, afterwards, deployment)
                cut.requests = list(fake.requests) if cut.name == "stream" else []
            tg.cancel_scope.cancel()
    finally:
        for cut in cuts:
            if cut.gate is not None:
                open_gate(cut.gate)  # a tool process that outlived its server ends now
    return {cut.name: cut for cut in cuts}


async def first_client(cut: Cut, url: str) -> None:
    """The client that sent the turn waits for its answer, which the crash cuts off."""
    async with client_for(url, timeout=120) as client:
        try:
            cut.reply = await client.post(f"/v1/conversations/{cut.conversation_id}/messages",
                                          json={"content": cut.content})
        except httpx.HTTPError as exc:
            cut.reply = exc
        cut.replied.set()


async def at_the_kill_point(cut: Cut, deployment: Deployment) -> None:
    """Wait until the turn is mid-stream, in its tool (its side effect done), or waiting on a person."""
    assert cut.follower is not None
    started = await cut.follower.wait(named("turn.started"), BOUND)
    cut.turn_id = started.data["turn_id"]
    if cut.name == "stream":
        await cut.follower.wait(named("message.delta"), BOUND)  # the fake holds the stream open after it
    elif cut.name == "ask":
        cut.asked = (await cut.follower.wait(named("permission.requested"), BOUND)).data
        with anyio.fail_after(BOUND):  # its client does not stream: answered 202 at once, before the kill
            await cut.replied.wait()
    else:
        assert cut.log is not None
        log = cut.log
        await wait_until(lambda: len(lines(log)) == 1, BOUND)


async def goes_on(cut: Cut, deployment: Deployment) -> None:
    """After the crash: the turn resumes and (but `doomed`) ends."""
    assert cut.follower is not None
    await cut.follower.wait(lambda e: e.name == "turn.resumed" and e.data.get("turn_id") == cut.turn_id,
                            BOUND)
    cut.resumed.set()
    if cut.name in ("safe", "doomed"):
        assert cut.log is not None and cut.gate is not None
        log = cut.log
        await wait_until(lambda: len(lines(log)) == 2, BOUND)  # it runs again
        if cut.name == "doomed":
            return  # and is cut off there again
        open_gate(cut.gate)
    elif cut.name == "ask":
        cut.pending = await deployment.items(cut.conversation_id, "permissions")
        cut.decided = await deployment.request(
            "POST", f"/v1/conversations/{cut.conversation_id}/permissions/{cut.asked['request_id']}",
            json={"decision": "allow"})
    cut.end = await cut.follower.wait(ended(cut.turn_id), BOUND)


async def fails(cut: Cut, deployment: Deployment) -> None:
    assert cut.follower is not None
    cut.end = await cut.follower.wait(ended(cut.turn_id), BOUND)


async def afterwards(cut: Cut, deployment: Deployment) -> None:
    """A turn sent once the cut one ended (to a server that is up), then everything stored of both."""
    assert cut.follower is not None
    if cut.end is None:
        raise AssertionError("the cut turn never ended")
    r = await deployment.request("POST", f"/v1/conversations/{cut.conversation_id}/messages",
                                 json={"content": "marker"})
    assert r.status_code == 200, r.text
    cut.marker = r.json()
    await cut.follower.wait(ended(cut.marker["turn_id"]), BOUND)
    async with client_for(deployment.urls()[0]) as client:
        with anyio.fail_after(BOUND):
            cut.stored = await read_events(client, cut.conversation_id, ended(cut.marker["turn_id"]))
    cut.turns = await deployment.items(cut.conversation_id, "turns")
    cut.messages = await deployment.items(cut.conversation_id, "messages")
    cut.permissions = await deployment.items(cut.conversation_id, "permissions")
    resumed = f"turn {cut.turn_id} of conversation {cut.conversation_id} resumed"
    cut.resumed_by = [node.name for node in deployment.nodes
                      if any(resumed in line for run in node.runs for line in run.lines)]


async def after_every_resume(cuts: Sequence[Cut], then: Callable[[], Awaitable[None]]) -> None:
    with anyio.move_on_after(BOUND):
        for cut in cuts:
            await cut.resumed.wait()
    await then()


# --- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fake() -> FakeOpenAI:
    return FakeOpenAI()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("durable")


@pytest.fixture(scope="module")
def defs(fake: FakeOpenAI, root: Path) -> Iterator[Path]:
    with serve(fake.app) as fake_url:
        yield definitions(root / "defs", fake_url)


@pytest.fixture(scope="module")
async def sqlite_crash(defs: Path, root: Path, fake: FakeOpenAI) -> AsyncIterator[dict[str, Cut]]:
    """One `corral serve` on SQLite (CORRAL_MAX_ATTEMPTS=2), killed with five turns cut off, started again
    on the same state; killed and started again once more while `doomed` is in its tool again."""
    single = Deployment([Node("single", defs, root / "sqlite-state", env={"CORRAL_MAX_ATTEMPTS": "2"})],
                         restarts=True)
    try:
        await single.up()
        yield await cut_off(single, fake, root / "sqlite-work", doomed=True)
    finally:
        single.stop()


@pytest.fixture(scope="module")
def pair(postgres_server: PostgresServer, defs: Path, root: Path) -> Iterator[Deployment]:
    """Replicas `a` and `b` on one fresh database (lease LEASE_S, grace GRACE_S); turns go to `a`."""
    database = postgres_server.create_database()
    nodes = [Node(name, defs, root / f"pg-state-{name}", env={
        "CORRAL_DATABASE_URL": database, "CORRAL_LEASE_S": str(LEASE_S), "CORRAL_REPLICA_ID": name,
        "CORRAL_SHUTDOWN_GRACE_S": str(GRACE_S)}) for name in "ab"]
    cluster = Deployment(nodes, restarts=False)
    try:
        for node in nodes:
            node.launch()
        for node in nodes:
            node.ready()
        yield cluster
    finally:
        cluster.stop()
        with contextlib.suppress(RuntimeError):
            postgres_server.drop_database(database)


@pytest.fixture(scope="module")
async def postgres_crash(pair: Deployment, root: Path, fake: FakeOpenAI) -> dict[str, Cut]:
    """`a` killed with four turns cut off; `b` takes them over once the lease lapses (then `a` comes back,
    for the tests after these)."""
    await pair.up()
    a = pair.nodes[0]
    return await cut_off(pair, fake, root / "pg-work", when_resumed=a.start)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def crash(request: pytest.FixtureRequest) -> dict[str, Cut]:
    return request.getfixturevalue(f"{request.param}_crash")


# --- what came of each cut turn -----------------------------------------------------------------


def common(cut: Cut, *, roles: Sequence[str]) -> None:
    """What every cut turn shows: resumed once as attempt 2 (by the restarted server, or the other
    replica), ended once, a stream without gaps or duplicates (the same as the store's), and a
    transcript in which nothing is doubled."""
    assert not cut.ok(), cut.ok()
    assert cut.resumed_by in (["single"], ["b"]), cut.resumed_by
    assert cut.follower is not None
    assert cut.follower.check() == [], cut.follower.check()
    assert len(cut.follower.connections) >= 2, cut.follower.connections  # it did reconnect
    assert cut.stored == cut.events[: len(cut.stored)] and cut.events[0].id == 1, (
        summary(cut.stored), summary(cut.events))
    assert cut.of_turn("turn.resumed") == [{"turn_id": cut.turn_id, "attempt": 2}]
    ends = [e for e in cut.follower.of(cut.turn_id) if e.name in ("turn.completed", "turn.failed",
                                                                   "turn.cancelled")]
    assert ends == [cut.end], summary(ends)
    assert cut.names().count("turn.started") == 1
    # the next event after the cut turn's end is the next turn's start: nothing came late
    after = [e for e in cut.events if cut.end is not None and e.id == cut.end.id + 1]
    assert [(e.name, e.data["turn_id"]) for e in after] == [("turn.started", cut.marker["turn_id"])]
    turn = cut.turn()
    assert turn["attempts"] == 2, turn
    assert [r for r, _ in cut.said()] == list(roles), cut.said()
    seqs = [m["seq"] for m in cut.messages]
    assert seqs == list(range(1, len(seqs) + 1)), seqs
    assert cut.marker["status"] == "completed", cut.marker
    if cut.name != "ask":  # the first client's connection was cut with its server
        assert isinstance(cut.reply, httpx.HTTPError), cut.reply


async def test_killed_mid_model_stream_the_model_is_asked_again(crash: dict[str, Cut]) -> None:
    cut = crash["stream"]
    common(cut, roles=["user", "assistant"])
    turn = cut.turn()
    assert (turn["status"], turn["output"]) == ("completed", ANSWER), turn
    assert cut.said() == [("user", "hello"), ("assistant", ANSWER)]
    names = cut.names()
    resumed_at = names.index("turn.resumed")
    assert cut.follower is not None
    deltas = [e.data["text"] for e in cut.follower.of(cut.turn_id) if e.name == "message.delta"]
    before = names[:resumed_at].count("message.delta")
    assert before >= 1 and PARTIAL.startswith("".join(deltas[:before])), deltas  # the cut stream's text
    assert "".join(deltas[before:]) == ANSWER, deltas  # then the whole answer, once
    # the model request was made again, the same request: the cut one had committed nothing
    asked = [r.body for r in cut.requests if r.body["messages"][-1]["content"] == "hello"]
    assert len(asked) == 2 and asked[0]["messages"] == asked[1]["messages"], asked
    assert len(cut.requests) == 3  # and the marker's


async def test_killed_mid_tool_a_safe_tool_runs_again_with_the_same_key(crash: dict[str, Cut]) -> None:
    cut = crash["safe"]
    common(cut, roles=["user", "assistant", "tool", "assistant"])
    assert cut.log is not None
    key = execution_key(cut.turn_id, "call_1")
    assert lines(cut.log) == [key, key]  # run twice, with the same key both times
    assert cut.names().count("tool.started") == 1
    [finished] = cut.of_turn("tool.finished")
    assert not finished["is_error"] and "outcome" not in finished, finished
    turn = cut.turn()
    assert (turn["status"], turn["output"]) == ("completed", "safe: stepped"), turn


async def test_killed_mid_tool_an_unsafe_tool_is_not_run_again(crash: dict[str, Cut]) -> None:
    cut = crash["unsafe"]
    common(cut, roles=["user", "assistant", "tool", "assistant"])
    assert cut.log is not None
    assert len(lines(cut.log)) == 1  # its side effect, once
    assert cut.names().count("tool.started") == 1
    [finished] = cut.of_turn("tool.finished")
    assert (finished["outcome"], finished["is_error"]) == ("unknown", True), finished
    [result] = [m for m in cut.messages if m["turn_id"] == cut.turn_id and m["role"] == "tool"]
    assert (result["content"], result["is_error"]) == (UNKNOWN_OUTCOME, True), result
    turn = cut.turn()
    # the scripted model answers with the result it got: it was told the outcome is unknown
    assert turn["status"] == "completed" and "the outcome of this call is unknown" in turn["output"], turn


async def test_killed_waiting_on_a_permission_the_request_stays_answerable(crash: dict[str, Cut]) -> None:
    cut = crash["ask"]
    common(cut, roles=["user", "assistant", "tool", "assistant"])
    # its client, which does not stream, was answered at once: the turn waits on a person
    assert isinstance(cut.reply, httpx.Response) and cut.reply.status_code == 202, cut.reply
    assert cut.reply.json()["status"] == "waiting" and cut.reply.json()["turn_id"] == cut.turn_id
    request_id = cut.asked["request_id"]
    # after the crash, the same request, still pending; answered on the server that is up now
    assert [(p["request_id"], p["status"]) for p in cut.pending] == [(request_id, "pending")], cut.pending
    assert cut.decided is not None and cut.decided.status_code == 200, cut.decided
    assert cut.decided.json()["status"] == "allowed"
    assert [(p["request_id"], p["status"]) for p in cut.permissions] == [(request_id, "allowed")]
    assert cut.names().count("permission.requested") == 1  # never asked again
    assert cut.log is not None and lines(cut.log) == [execution_key(cut.turn_id, "call_1")]  # ran once
    turn = cut.turn()
    assert (turn["status"], turn["output"]) == ("completed", "asked: stepped"), turn


async def test_a_turn_cut_off_on_every_attempt_fails_interrupted(sqlite_crash: dict[str, Cut]) -> None:
    """CORRAL_MAX_ATTEMPTS=2: killed in its tool (attempt 1), resumed and killed in its tool again
    (attempt 2), it is not resumed a third time: the second restart fails it with `interrupted`."""
    cut = sqlite_crash["doomed"]
    assert not cut.ok(), cut.ok()
    assert cut.follower is not None and cut.follower.check() == [], cut.follower.check()
    assert cut.log is not None
    key = execution_key(cut.turn_id, "call_1")
    assert lines(cut.log) == [key, key]  # in its tool at each of the two kills
    assert cut.of_turn("turn.resumed") == [{"turn_id": cut.turn_id, "attempt": 2}]  # after the first kill
    assert cut.resumed_by == ["single"], cut.resumed_by  # by the first restart; the second failed it
    assert cut.end is not None and cut.end.name == "turn.failed", cut.end
    assert cut.end.data["error"]["code"] == "interrupted", cut.end
    ends = [n for n in cut.names() if n in ("turn.completed", "turn.failed", "turn.cancelled")]
    assert ends == ["turn.failed"]
    turn = cut.turn()
    assert (turn["status"], turn["error"]["code"], turn["attempts"]) == ("failed", "interrupted", 2), turn
    assert [r for r, _ in cut.said()] == ["user", "assistant"]  # its tool's result never came
    assert cut.marker["status"] == "completed" and cut.marker["output"] == "echo: marker", cut.marker


# --- PostgreSQL: a paused replica ----------------------------------------------------------------


async def test_a_replica_paused_past_its_lease_is_fenced_off(pair: Deployment, root: Path) -> None:
    """`a` is stopped (SIGSTOP) mid-tool; `b` takes the turn over after the lease and finishes it; then
    `a` goes on (SIGCONT) with its tool's result in hand: its writes are refused, nothing is doubled,
    and the turn ended once."""
    await pair.up()
    a, b = pair.nodes
    work = root / "paused"
    work.mkdir()
    log, gate = work / "log", work / "gate"
    conversation_id = await pair.conversation("worker")
    follower = Follower(conversation_id, pair.urls)
    replies: list[httpx.Response | httpx.HTTPError] = []
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(follower.run)
            tg.start_soon(_send, a.url, conversation_id, f"safe {log} {gate}", replies)
            turn_id = (await follower.wait(named("turn.started"))).data["turn_id"]
            await wait_until(lambda: len(lines(log)) == 1, BOUND)  # in its tool on a
            a.pause()
            try:
                follower.reconnect()  # a's stream went silent: the client moves to b
                resumed = await follower.wait(named("turn.resumed"), BOUND)
                assert resumed.data == {"turn_id": turn_id, "attempt": 2}
                await wait_until(lambda: len(lines(log)) == 2, BOUND)  # b runs the safe tool again
                open_gate(gate)  # both calls finish: b's, and a's (which a cannot read yet)
                end = await follower.wait(ended(turn_id), BOUND)
                assert end.name == "turn.completed", end
            finally:
                a.go_on()
            fenced = await anyio.to_thread.run_sync(
                a.server.wait_for_line, lambda line: turn_id in line and "took it over" in line, BOUND)
            assert fenced is not None, a.log()
            await wait_until(lambda: replies, BOUND)  # a's client gets the turn's answer, as b finished it
            async with client_for(b.url) as client:
                r = await client.post(f"/v1/conversations/{conversation_id}/messages", json={"content": "hi"})
            assert r.status_code == 200, r.text
            marker = r.json()["turn_id"]
            await follower.wait(ended(marker), BOUND)
            tg.cancel_scope.cancel()
    finally:
        open_gate(gate)
    assert follower.check() == [], follower.check()
    assert len(follower.connections) >= 2, follower.connections
    # a wrote nothing after it went on: the next event after the turn's end is the marker's start
    after = [e for e in follower.events if e.id > end.id]
    assert after == follower.of(marker), summary(follower.events)
    assert {e.name for e in after} == {"turn.started", "message.delta", "turn.completed"}, summary(after)
    names = [e.name for e in follower.of(turn_id)]
    assert names.count("tool.started") == names.count("tool.finished") == names.count("turn.resumed") == 1
    messages = await pair.items(conversation_id, "messages")
    assert [(m["role"], m["turn_id"]) for m in messages] == [
        ("user", turn_id), ("assistant", turn_id), ("tool", turn_id), ("assistant", turn_id),
        ("user", marker), ("assistant", marker)], messages
    turns = await pair.items(conversation_id, "turns")
    assert [(t["id"], t["status"], t["attempts"]) for t in turns] == [
        (turn_id, "completed", 2), (marker, "completed", 1)], turns
    key = execution_key(turn_id, "call_1")
    assert lines(log) == [key, key]
    [reply] = replies
    assert isinstance(reply, httpx.Response) and reply.status_code == 200, reply
    assert (reply.json()["turn_id"], reply.json()["status"]) == (turn_id, "completed"), reply.text
    assert [m["role"] for m in reply.json()["messages"]] == ["user", "assistant", "tool", "assistant"]


async def _send(url: str, conversation_id: str, content: str,
                replies: list[httpx.Response | httpx.HTTPError]) -> None:
    async with client_for(url, timeout=120) as client:
        try:
            replies.append(await client.post(f"/v1/conversations/{conversation_id}/messages",
                                             json={"content": content}))
        except httpx.HTTPError as exc:
            replies.append(exc)


# --- PostgreSQL: a rolling restart under load ----------------------------------------------------

CLIENTS = 4


@dataclass
class Load:
    """Clients each sending turns to their own conversation, one after another, to the replicas serving
    (in turn); each reads its conversation through a `Follower`."""

    cluster: Deployment
    stop: anyio.Event = field(default_factory=anyio.Event)
    followers: dict[int, Follower] = field(default_factory=dict)
    conversations: dict[int, str] = field(default_factory=dict)
    sent: dict[int, list[tuple[str, str]]] = field(default_factory=dict)  # (input, turn id) per client
    inflight: dict[int, str | None] = field(default_factory=dict)  # the replica a client waits on
    answers: list[dict[str, Any]] = field(default_factory=list)  # 200s
    handed_over: list[str] = field(default_factory=list)  # 503 overloaded naming the turn
    refused: int = 0  # 503 overloaded before a turn started: sent again elsewhere
    lost: list[str] = field(default_factory=list)  # connections that broke before an answer

    def done(self) -> int:
        return sum(len(v) for v in self.sent.values())

    async def client(self, index: int, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        conversation_id = await self.cluster.conversation("worker")
        follower = self.followers[index] = Follower(conversation_id, self.cluster.urls)
        self.conversations[index], self.sent[index], self.inflight[index] = conversation_id, [], None
        async with anyio.create_task_group() as tg:
            tg.start_soon(follower.run)
            task_status.started()
            n = 0
            while not self.stop.is_set():
                n += 1
                content = f"nap {index}-{n}"
                turn_id = await self.send(index, n, content)
                end = await follower.wait(ended(turn_id), 60)  # its outcome, from whichever replica
                assert end.name == "turn.completed", (end, summary(follower.events))
                self.sent[index].append((content, turn_id))
            tg.cancel_scope.cancel()

    async def send(self, index: int, n: int, content: str) -> str:
        """The turn's id, once it runs somewhere: from its answer, from a 503 that names it (handed
        over), or, when the answer was lost, from the conversation's turns (never a second turn: the
        Idempotency-Key makes a retry find the first)."""
        conversation_id = self.conversations[index]
        path = f"/v1/conversations/{conversation_id}/messages"
        for attempt in range(50):
            urls = self.cluster.urls()
            if not urls:
                await anyio.sleep(0.05)
                continue
            url = urls[(index + n + attempt) % len(urls)]
            self.inflight[index] = url
            try:
                async with client_for(url, timeout=60) as client:
                    r = await client.post(path, json={"content": content},
                                          headers={"Idempotency-Key": f"load-{index}-{n}"})
            except httpx.HTTPError as exc:
                self.lost.append(f"{content} on {url}: {exc!r}")
                turns = await self.cluster.items(conversation_id, "turns")
                found = [t["id"] for t in turns if t["input"] == content]
                if found:
                    return found[0]
                continue  # it never started: send it again
            finally:
                self.inflight[index] = None
            error = (r.json().get("error") or {}) if r.status_code != 200 else {}
            if r.status_code == 200:
                self.answers.append(r.json())
                return r.json()["turn_id"]
            if r.status_code == 503 and error.get("code") == "overloaded":
                turn_id = (error.get("details") or {}).get("turn_id")
                if turn_id:  # handed over: it goes on elsewhere, its outcome is read from there
                    self.handed_over.append(turn_id)
                    return turn_id
                self.refused += 1  # shutting down before the turn began
                continue
            raise AssertionError(f"{content} on {url}: {r.status_code} {r.text}")
        raise AssertionError(f"{content}: never accepted")

    def in_tool_on(self, node: Node) -> bool:
        """A client waits on `node` for a turn that is in its tool (the stop will cut through it)."""
        return any(self.inflight.get(i) == node.url and f.events and f.events[-1].name == "tool.started"
                   for i, f in self.followers.items())


async def test_a_rolling_restart_under_load_fails_no_turn(pair: Deployment) -> None:
    await pair.up()
    load = Load(pair)
    stops: list[tuple[str, int, float]] = []
    async with anyio.create_task_group() as tg:
        for index in range(CLIENTS):
            await tg.start(load.client, index)
        await wait_until(lambda: load.done() >= CLIENTS, 60)  # a steady load, on both replicas
        for node in pair.nodes:
            await wait_until(lambda node=node: load.in_tool_on(node), BOUND)
            began = time.monotonic()
            code = await node.terminate()
            stops.append((node.name, code, time.monotonic() - began))
            await node.start()  # again, on the same state; the other replica served meanwhile
            before = load.done()
            await wait_until(lambda before=before: load.done() >= before + CLIENTS, 60)
        load.stop.set()
    for name, code, took in stops:
        assert code in (0, -signal.SIGTERM) and took < GRACE_S + 10, (name, code, took, pair.log())
    assert load.done() >= 3 * CLIENTS
    assert all(a["status"] == "completed" for a in load.answers), load.answers
    resumed = []
    for index, follower in load.followers.items():
        assert follower.check() == [], (index, follower.check())
        ends = [e for e in follower.events if e.name in ("turn.completed", "turn.failed", "turn.cancelled")]
        assert {e.name for e in ends} == {"turn.completed"}, summary(ends)
        resumed += [e.data for e in follower.events if e.name == "turn.resumed"]
        turns = await pair.items(load.conversations[index], "turns")
        # every turn sent ran once (none doubled by a retry) and completed
        sent = load.sent[index]
        assert [(t["input"], t["id"]) for t in turns] == sent, (turns, sent)
        assert all(t["status"] == "completed" for t in turns), turns
    # the stops cut through running turns: handed over to the other replica, which resumed them
    assert resumed, (load.handed_over, load.lost, pair.log())
    assert all(r["attempt"] == 2 for r in resumed), resumed
    assert set(load.handed_over) <= {r["turn_id"] for r in resumed}, (load.handed_over, resumed)


