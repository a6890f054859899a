"""Several `corral serve` replicas on one PostgreSQL database act as one server.

Three replicas (`a`, `b`, `c`), each a real process with its own state
directory, share a fresh database on the session's PostgreSQL server and one
watched definitions directory. A turn is held open at a gate (see
`tests.support.trees`) on one replica while the test drives another, so
"busy elsewhere" is a state the test controls, not a race. A replica that a
test kills, or that must never have seen a file, is started by that test on
the same database; the reload case runs its own trio without watchers. The
MCP case puts a real nginx, configured from `examples/nginx/corral.conf`, in
front of two replicas.

Every wait is bounded; what a replica does in its own time (a watcher's swap,
a lease lapsing, a heartbeat) is awaited on the state it shows over HTTP.
"""

from __future__ import annotations

import contextlib
import re
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp.types as types
import pytest
from mcp import Client

from server.compiler.compiler import Compiler
from tests.support.client import Conversation
from tests.support.events import Event, conversation_events, ended, named, read_events, server_events
from tests.support.nginx import TEMPLATE, NginxProxy, render
from tests.support.postgres import PostgresServer
from tests.support.servers import ServerProcess
from tests.support.swaps import reload, swaps
from tests.support.trees import (
    agent_digest,
    edited_yaml,
    gated_definitions,
    open_gate,
    write_atomic,
    write_tree,
)

pytestmark = pytest.mark.anyio

LEASE_S = 2.0  # the trio's lease: short, so recovery is quick, yet well above a busy machine's hiccups
ERA = {"auto": "2026-07-28", "legacy": "2025-11-25"}
SCRIPT_V1 = "print('script v1')\n"
SCRIPT_V2 = "print('script v2')\n"
PROBE = "kind: Model\nname: probe\ndescription: probe {n}\nprovider: scripted\n"

EXTRA = {
    # `run` calls a command tool whose argv names a script in the definitions directory
    "scripted.yaml": """
        kind: Model
        name: m_script
        provider: scripted
        script:
          - when: "^run"
            tool_call: { name: version_script }
            reply: "ran {tool_result}"
        default: "script agent: {input}"
        ---
        kind: Tool
        name: version_script
        description: Print the script's version.
        command: { argv: [python3, scripts/version.py], timeout_s: 30 }
        ---
        kind: Agent
        name: scripter
        description: Runs a script from the definitions directory.
        model: m_script
        tools: [version_script]
    """,
    "scripts/version.py": SCRIPT_V1,
    # `ask` waits on a person's yes, which may come through any replica
    "asking.yaml": """
        kind: Model
        name: m_ask
        provider: scripted
        script:
          - when: "^ask"
            tool_call: { name: guarded }
            reply: "guarded said {tool_result}"
        ---
        kind: Tool
        name: guarded
        description: Runs only once a person allows it.
        permission: ask
        command: { argv: [python3, -c, "print('guarded ran')"], timeout_s: 30 }
        ---
        kind: Agent
        name: asker
        description: Asks before it runs its tool.
        model: m_ask
        tools: [guarded]
    """,
    # an agent with a hook: each replica that runs its turns keeps a transcript file of the conversation
    "hooked.yaml": """
        kind: Hook
        name: stop_reader
        event: Stop
        command: [python3, -c, "import sys; sys.stdin.read()"]
        ---
        kind: Agent
        name: hooked
        description: Has a hook, so hooks get a transcript_path.
        model: scripted
        hooks: [stop_reader]
    """,
    # the agent of the MCP case: no other case runs it, so its turn counts are the MCP calls'
    "relay.yaml": """
        kind: Agent
        name: relay
        description: Echoes what it is told.
        model: scripted
    """,
}


def definitions(root: Path) -> Path:
    """`gated` and `queued` (tests.support.trees), `edited` at v1, `scripter` and `relay`."""
    gated_definitions(root)
    write_atomic(root / "edited.yaml", edited_yaml("v1"))
    return write_tree(root, EXTRA)


def set_digest_of(root: Path) -> str:
    """The set digest `root` compiles to, offline."""
    return Compiler(root).compile().digest


def client_for(url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, timeout=30, trust_env=False)


@dataclass
class Cluster:
    """Replicas sharing one database and one definitions directory, each with its own state."""

    root: Path
    defs: Path
    database: str
    servers: dict[str, ServerProcess]

    def start(self, names: Sequence[str], *, lease_s: float = LEASE_S,
              args: Sequence[str] = ()) -> list[ServerProcess]:
        """Replicas named `names`, launched side by side, each awaited."""
        started = [ServerProcess(self.defs, self.root / f"state-{name}", args=args, env={
            "CORRAL_DATABASE_URL": self.database, "CORRAL_LEASE_S": str(lease_s),
            "CORRAL_REPLICA_ID": name}).launch() for name in names]
        self.servers.update(zip(names, started, strict=True))
        for server in started:
            server.start(timeout_s=60)
        return started

    def stop(self) -> None:
        for server in self.servers.values():
            server.kill()


@contextlib.contextmanager
def cluster_on(postgres: PostgresServer, root: Path) -> Iterator[Cluster]:
    """A cluster on a fresh database (dropped afterwards) and a fresh definitions tree under `root`."""
    cluster = Cluster(root, definitions(root / "defs"), postgres.create_database(), {})
    try:
        yield cluster
    finally:
        cluster.stop()
        with contextlib.suppress(RuntimeError):
            postgres.drop_database(cluster.database)


def watchers_live(servers: Sequence[ServerProcess], defs: Path, bound: float = 40) -> None:
    """Edit a probe definition until every replica serves it: from then on each watcher sees edits.

    A watcher may subscribe a moment after its server answers; an edit made
    before that would never be seen. Each attempt writes new content, so a
    replica that missed one edit catches up with the next.
    """
    deadline = time.monotonic() + bound
    for n in range(1, 1000):
        write_atomic(defs / "probe.yaml", PROBE.format(n=n))
        expected = set_digest_of(defs)
        attempt = time.monotonic() + 3
        while time.monotonic() < min(attempt, deadline):
            if all(httpx.get(s.url + "/readyz", trust_env=False).json().get("set_digest") == expected
                   for s in servers):
                return
            time.sleep(0.05)
        if time.monotonic() >= deadline:
            break
    raise AssertionError(f"the replicas' watchers never all served the probe within {bound}s")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, postgres_server: PostgresServer) -> Iterator[Cluster]:
    """Replicas a, b and c (watching the definitions), for every case that kills none of them."""
    with cluster_on(postgres_server, tmp_path_factory.mktemp("replicas")) as found:
        trio = found.start(["a", "b", "c"])
        watchers_live(trio, found.defs)
        yield found


@pytest.fixture
async def trio(cluster: Cluster) -> AsyncIterator[tuple[httpx.AsyncClient, ...]]:
    """Clients of replicas a, b and c."""
    async with client_for(cluster.servers["a"].url) as a, client_for(cluster.servers["b"].url) as b, \
            client_for(cluster.servers["c"].url) as c:
        yield a, b, c


async def readyz(client: httpx.AsyncClient) -> dict[str, Any]:
    r = await client.get("/readyz")
    assert r.status_code == 200, r.text
    return r.json()


async def replicas(client: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    """`GET /v1/replicas`, by replica id."""
    r = await client.get("/v1/replicas")
    assert r.status_code == 200, r.text
    return {item["id"]: item for item in r.json()["items"]}


async def converged(clients: Sequence[httpx.AsyncClient], expected: str, bound: float = 20) -> None:
    """Wait until every replica's `/readyz` names `expected` as its set digest."""
    with anyio.fail_after(bound):
        while [(await readyz(c))["set_digest"] for c in clients] != [expected] * len(clients):
            await anyio.sleep(0.05)


def busy_turn_id(reply: httpx.Response) -> str:
    assert reply.status_code == 409, reply.text
    error = reply.json()["error"]
    assert error["code"] == "conversation_busy", error
    return error["details"]["turn_id"]


async def queued(conversation: Conversation, key: str) -> str:
    """Wait until the request sent (elsewhere) with Idempotency-Key `key` is in the conversation's queue.

    Probed with the same key, another body and `reject`: while the busy
    conversation has no turn under that key, that is a 409; once the key
    names one, it is 422 `idempotency_key_reused`, naming the queued turn.
    """
    with anyio.fail_after(15):
        while True:
            probe = await conversation.client.post(f"{conversation.path}/messages", headers={
                "Idempotency-Key": key}, json={"content": f"probe for {key}", "if_busy": "reject"})
            if probe.status_code == 422:
                assert probe.json()["error"]["code"] == "idempotency_key_reused", probe.text
                return probe.json()["error"]["details"]["turn_id"]
            busy_turn_id(probe)
            await anyio.sleep(0.02)


# --- the replicas and their conversations --------------------------------------------------------


async def test_replicas_lists_all_three_with_set_digest_and_heartbeat(trio, tmp_path: Path) -> None:
    a, b, c = trio
    ready = [await readyz(x) for x in trio]
    assert [r["replica"] for r in ready] == ["a", "b", "c"]
    digest = ready[0]["set_digest"]
    assert digest.startswith("sha256:") and {r["set_digest"] for r in ready} == {digest}

    def shows(listed: dict[str, dict[str, Any]], running: str | None = None) -> bool:
        """Every replica alive, on `digest`, and running a turn only if it is `running`."""
        return all(listed[n]["alive"] and listed[n]["set_digest"] == digest
                   and listed[n]["running_turns"] == (n == running) for n in "abc")

    with anyio.fail_after(10):  # each replica writes its heartbeat (and its set digest) every lease_s / 3
        while not shows(first := await replicas(b)):
            await anyio.sleep(0.05)
    for name in "abc":
        assert first[name]["started_at"] <= first[name]["heartbeat_at"], first[name]
        assert first[name]["self"] is (name == "b"), first[name]
    gate = tmp_path / "gate"
    conversation = await Conversation.create(a, "gated")
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(conversation.send, f"wait {gate}")
            await conversation.through(c).started()
            # the heartbeats go on, and a's carries the turn it runs
            while not (shows(later := await replicas(c), running="a")
                       and all(later[n]["heartbeat_at"] > first[n]["heartbeat_at"] for n in "abc")):
                await anyio.sleep(0.05)
            open_gate(gate)
    assert conversation.replies[0].json()["status"] == "completed"


async def test_turns_alternating_replicas_make_one_transcript_in_order(trio) -> None:
    a, b, c = trio
    conversation = await Conversation.create(a, "gated")
    order = [a, b, c, a, b, c]
    answers = [await conversation.through(x).say(f"hello {i}", bound=15) for i, x in enumerate(order)]
    assert [x["output"] for x in answers] == [f"echo: hello {i}" for i in range(6)]
    said = [(m["role"], m["content"]) for m in await conversation.through(c).messages()]
    assert said == [pair for i in range(6)
                    for pair in (("user", f"hello {i}"), ("assistant", f"echo: hello {i}"))]
    turns = await conversation.through(b).turns()
    assert [(t["id"], t["status"]) for t in turns] == [(x["turn_id"], "completed") for x in answers]
    events = await conversation.through(b).events(ended(answers[-1]["turn_id"]))
    assert [e.id for e in events] == sorted({e.id for e in events})
    assert [(e.name, e.data["turn_id"]) for e in events if e.name in ("turn.started", "turn.completed")] == [
        (name, x["turn_id"]) for x in answers for name in ("turn.started", "turn.completed")]


async def test_concurrent_sends_through_two_replicas_run_one_reject_one(trio, tmp_path: Path) -> None:
    a, b, c = trio
    conversation = await Conversation.create(a, "gated")
    gate = tmp_path / "gate"
    replies: list[httpx.Response] = []
    rejected = anyio.Event()

    async def send(client: httpx.AsyncClient) -> None:
        reply = await conversation.through(client).send(f"wait {gate}")
        replies.append(reply)
        if reply.status_code == 409:
            rejected.set()

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(send, a)
            tg.start_soon(send, b)
            with anyio.move_on_after(15):  # had both been admitted, both would wait at the gate
                await rejected.wait()
            third = await conversation.through(c).send("hello")  # and a third replica names the turn too
            open_gate(gate)
    assert sorted(r.status_code for r in replies) == [200, 409], [r.text for r in replies]
    ok = next(r for r in replies if r.status_code == 200).json()
    busy = next(r for r in replies if r.status_code == 409)
    assert busy_turn_id(busy) == busy_turn_id(third) == ok["turn_id"]
    assert ok["status"] == "completed"
    assert [t["id"] for t in await conversation.through(c).turns()] == [ok["turn_id"]]


async def test_a_permission_decided_on_another_replica_lets_the_turn_go_on(trio) -> None:
    """The call waits on a, whose answer (not streamed) is 202 at once; a retry of it on c answers the
    same; the request is seen on c and answered on b; c's `/v1/events` follows a's conversation through
    waiting and back; a read of the turn held on c (`?wait=S`) ends with the turn on a."""
    a, b, c = trio
    conversation = await Conversation.create(a, "asker")
    held: dict[str, Any] = {}

    async def read_when_ended(turn_id: str) -> None:
        reply = await c.get(f"{conversation.path}/turns/{turn_id}", params={"wait": 60})
        assert reply.status_code == 200, reply.text
        held.update(reply.json())

    with anyio.fail_after(30):
        async with server_events(c) as feed:
            first = await conversation.send("ask now", key="k-ask")
            assert first.status_code == 202, first.text
            retry = await conversation.through(c).send("ask now", key="k-ask")  # the turn runs on a
            assert retry.status_code == 202 and retry.json() == first.json(), retry.text
            asked = (await conversation.through(c).events(named("permission.requested")))[-1].data
            assert [r["request_id"] for r in first.json()["permission_requests"]] == [asked["request_id"]]
            async with anyio.create_task_group() as tg:
                tg.start_soon(read_when_ended, first.json()["turn_id"])
                decided = await b.post(f"{conversation.path}/permissions/{asked['request_id']}",
                                       json={"decision": "allow"})
                assert decided.status_code == 200 and decided.json()["status"] == "allowed", decided.text
            for status in ("busy", "waiting", "idle"):
                await feed.wait(lambda e, s=status: e.name == "conversation.status"
                                and e.data == {"conversation_id": conversation.id, "status": s})
            answer = await conversation.through(b).send("ask now", key="k-ask")
    assert (held["status"], held["output"]) == ("completed", "guarded said guarded ran"), held
    assert answer.status_code == 200, answer.text
    assert (answer.json()["status"], answer.json()["output"]) == ("completed", "guarded said guarded ran")


async def test_interrupt_through_another_replica_cancels_the_turn(trio, tmp_path: Path) -> None:
    a, b, c = trio
    conversation = await Conversation.create(a, "gated")
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(conversation.send, f"wait {tmp_path / 'never'}")  # held on a
            turn_id = await conversation.through(b).started()
            r = await b.post(f"{conversation.path}/interrupt")
            assert r.status_code == 200 and r.json() == {"interrupted": True, "turn_id": turn_id}, r.text
        held = conversation.replies[0]
        assert held.status_code == 200 and held.json()["turn_id"] == turn_id, held.text
        assert held.json()["status"] == "cancelled"
        events = await conversation.through(c).events(ended(turn_id))
        assert events[-1].name == "turn.cancelled"
        assert (await conversation.through(c).get())["status"] == "idle"
        again = await conversation.through(c).send("hello")
    assert again.status_code == 200 and again.json()["output"] == "echo: hello", again.text
    assert [t["status"] for t in await conversation.through(b).turns()] == ["cancelled", "completed"]


async def test_sse_on_one_replica_streams_a_turn_running_on_another(trio, tmp_path: Path) -> None:
    a, b, c = trio
    conversation = await Conversation.create(a, "gated")
    gate = tmp_path / "gate"
    seen: list[Event] = []
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(conversation.send, f"wait {gate}")  # held on a
            async with conversation_events(b, conversation.id) as events:
                first = await anext(events)
                # read while the turn is held: b saw a's turn start before anything let it go on
                assert first.name == "turn.started" and conversation.replies == []
                seen.append(first)
                open_gate(gate)
                async for event in events:
                    seen.append(event)
                    if ended()(event):
                        break
    turn_id = first.data["turn_id"]
    assert conversation.replies[0].json()["turn_id"] == turn_id
    names = [e.name for e in seen]
    assert names[-1] == "turn.completed" and {"tool.started", "tool.finished", "message.delta"} <= set(names)
    assert [e.id for e in seen] == sorted({e.id for e in seen})
    assert all(e.data.get("turn_id", turn_id) == turn_id for e in seen)
    with anyio.fail_after(15):  # resuming on a third replica: exactly what followed, from either point
        for after in (0, 2):
            resumed = await read_events(c, conversation.id, ended(turn_id), last_event_id=seen[after].id)
            assert resumed == seen[after + 1:]


async def test_one_idempotency_key_sent_to_two_replicas_makes_one_turn(trio, tmp_path: Path) -> None:
    a, b, c = trio
    conversation = await Conversation.create(a, "gated")
    gate = tmp_path / "gate"
    streamed: list[Event] = []
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(conversation.send, f"wait {gate}", key="k"))  # held on a
            turn_id = await conversation.through(c).started()
            # the same request on b joins the running turn: its stream starts with that turn
            async with conversation.through(b).streaming(f"wait {gate}", key="k") as events:
                async for event in events:
                    streamed.append(event)
                    if event.name == "turn.started":
                        open_gate(gate)
        retry = await conversation.through(c).send(f"wait {gate}", key="k")
    first = conversation.replies[0]
    assert first.status_code == retry.status_code == 200, (first.text, retry.text)
    assert first.json()["turn_id"] == turn_id and retry.json() == first.json()
    assert streamed[0].data["turn_id"] == streamed[-1].data["turn_id"] == turn_id
    assert streamed[-1].name == "turn.completed"
    assert [t["id"] for t in await conversation.through(b).turns()] == [turn_id]

    for _ in range(3):  # sent at once to every replica, the requests race differently each time
        racing = await Conversation.create(b, "gated")
        replies: list[httpx.Response] = []

        async def send(client: httpx.AsyncClient, racing: Conversation = racing,
                       replies: list[httpx.Response] = replies) -> None:
            replies.append(await racing.through(client).send("hello", key="same"))

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                for client in trio:
                    tg.start_soon(send, client)
        assert [r.status_code for r in replies] == [200] * 3, [r.text for r in replies]
        assert len({r.json()["turn_id"] for r in replies}) == 1
        assert len(await racing.through(c).turns()) == 1


async def test_enqueue_across_replicas_keeps_arrival_order(trio, tmp_path: Path) -> None:
    a, b, c = trio
    conversation = await Conversation.create(a, "queued")
    gate = tmp_path / "gate"
    replies: dict[str, httpx.Response] = {}

    async def send(client: httpx.AsyncClient, content: str, key: str | None = None) -> None:
        replies[content] = await conversation.through(client).send(content, key=key)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(send, a, f"wait {gate}")
            held = await conversation.through(c).started()
            tg.start_soon(send, b, "X", "key-x")
            x = await queued(conversation.through(a), "key-x")  # X is in the queue before Y is sent
            tg.start_soon(send, c, "Y", "key-y")
            y = await queued(conversation.through(a), "key-y")
            open_gate(gate)
    assert {k: r.status_code for k, r in replies.items()} == {f"wait {gate}": 200, "X": 200, "Y": 200}, [
        r.text for r in replies.values()]
    assert [replies[k].json()["output"] for k in ("X", "Y")] == ["echo: X", "echo: Y"]
    turns = await conversation.through(b).turns()
    assert [(t["id"], t["status"]) for t in turns] == [(turn, "completed") for turn in (held, x, y)]
    assert turns[0]["ended_at"] <= turns[1]["started_at"] and turns[1]["ended_at"] <= turns[2]["started_at"]
    said = [m["content"] for m in await conversation.through(c).messages() if m["role"] == "user"]
    assert said == [f"wait {gate}", "X", "Y"]


# --- definitions across replicas -----------------------------------------------------------------


async def test_a_pin_of_an_edited_script_runs_the_old_script_on_a_new_replica(cluster: Cluster, trio) -> None:
    a = trio[0]
    v1 = agent_digest(cluster.defs, "scripter")
    served = await a.get("/v1/agents/scripter")
    assert served.status_code == 200 and served.json()["digest"] == v1, served.text
    pinned = await Conversation.create(a, f"scripter@{v1}")
    write_atomic(cluster.defs / "scripts" / "version.py", SCRIPT_V2)
    v2 = agent_digest(cluster.defs, "scripter")
    assert v2 != v1
    (late,) = cluster.start(["late"])  # it never saw version 1 of the script
    try:
        async with client_for(late.url) as client:
            with anyio.fail_after(30):
                old = await pinned.through(client).say("run")
                new = await (await Conversation.create(client, "scripter")).say("run")
    finally:
        late.terminate()
    assert (old["digest"], old["output"].strip()) == (v1, "ran script v1"), old
    assert (new["digest"], new["output"].strip()) == (v2, "ran script v2"), new


async def test_an_edit_swaps_every_replica_and_each_report_lists_the_busy_turn(cluster: Cluster, trio,
                                                                              tmp_path: Path) -> None:
    a, b, _ = trio
    conversation = await Conversation.create(a, "edited")
    gate = tmp_path / "gate"
    before = (await readyz(b))["set_digest"]
    with anyio.fail_after(40):
        async with anyio.create_task_group() as tg:
            tg.start_soon(conversation.send, f"wait {gate}")  # busy on a
            turn_id = await conversation.through(b).started()
            write_atomic(cluster.defs / "edited.yaml", edited_yaml("v2"))
            expected = set_digest_of(cluster.defs)
            assert expected != before
            await converged(trio, expected)
            history = await swaps(b)
            open_gate(gate)
    held = conversation.replies[0].json()
    assert (held["turn_id"], held["output"]) == (turn_id, "v1 passed the gate")  # it ended on the old digest
    reports = {r.get("replica"): r for r in history if r["current"] == expected and r["status"] == "applied"}
    assert set(reports) == {"a", "b", "c"}, history[:5]
    for name, report in reports.items():
        busy = [(x["conversation_id"], x["turn_id"], x["agent"]) for x in report["busy"]]
        assert (conversation.id, turn_id, "edited") in busy, (name, report)
        change = next(x for x in report["changes"] if (x["kind"], x["name"]) == ("Agent", "edited"))
        assert change["change"] == "changed" and change["from"] == held["digest"]


async def test_a_mended_rejection_is_announced_as_a_swap_everywhere_and_kept(cluster: Cluster, trio) -> None:
    """A broken edit rejected by every replica, then undone: each replica's `unchanged` report is kept in
    the history and reaches every replica's `/v1/events` as `definitions.swapped`, never as a rejection."""
    a, _, c = trio
    path = cluster.defs / "edited.yaml"
    good = path.read_text()

    def reports(status: str) -> Callable[[Event], bool]:
        return lambda e: e.data.get("status") == status

    with anyio.fail_after(40):
        async with server_events(c) as feed:
            write_atomic(path, good.replace("model: m_edited", "model: m_missing"))
            for replica in ("a", "b", "c"):
                await feed.wait(lambda e, r=replica: reports("rejected")(e) and e.data.get("replica") == r)
            write_atomic(path, good)
            for replica in ("a", "b", "c"):
                await feed.wait(lambda e, r=replica: reports("unchanged")(e) and e.data.get("replica") == r)
            history = await swaps(a)
    named = {(e.name, e.data["status"]) for e in feed.seen if e.name.startswith("definitions.")}
    assert named == {("definitions.rejected", "rejected"), ("definitions.swapped", "unchanged")}, named
    latest = {}
    for report in reversed(history):  # oldest first: the last one seen per replica is its latest
        latest[report.get("replica")] = report["status"]
    assert {latest[r] for r in ("a", "b", "c")} == {"unchanged"}, history[:6]


async def test_a_reload_or_sighup_on_one_replica_reloads_every_replica(postgres_server: PostgresServer,
                                                                      tmp_path: Path) -> None:
    with cluster_on(postgres_server, tmp_path) as cluster:
        servers = cluster.start(["r1", "r2", "r3"], args=("--no-watch",))
        async with client_for(servers[0].url) as r1, client_for(servers[1].url) as r2, \
                client_for(servers[2].url) as r3:
            digest = (await readyz(r1))["set_digest"]
            await converged([r2, r3], digest)
            write_atomic(cluster.defs / "edited.yaml", edited_yaml("v2"))
            report = await reload(r1)
            v2 = set_digest_of(cluster.defs)
            assert report["status"] == "applied", report
            assert (report["previous"], report["current"]) == (digest, v2), report
            await converged([r2, r3], v2)

            write_atomic(cluster.defs / "edited.yaml", edited_yaml("v3"))
            servers[1].signal(signal.SIGHUP)
            v3 = set_digest_of(cluster.defs)
            await converged([r1, r2, r3], v3)
            history = await swaps(r3)
    for current in (v2, v3):
        applied = {r.get("replica") for r in history if r["current"] == current and r["status"] == "applied"}
        assert applied == {"r1", "r2", "r3"}, history


# --- a replica dies ------------------------------------------------------------------------------


async def test_a_killed_replica_leaves_no_conversation_busy(cluster: Cluster, trio, tmp_path: Path) -> None:
    a, b, c = trio
    gate = tmp_path / "never"
    (doomed,) = cluster.start(["doomed"], lease_s=1.0)
    try:
        async with client_for(doomed.url) as d:
            conversation = await Conversation.create(d, "gated")
            with anyio.fail_after(20):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(conversation.try_send, f"wait {gate}")  # held on the doomed replica
                    turn_id = await conversation.through(a).started()
                    assert (await conversation.through(b).get())["status"] == "busy"
                    doomed.kill()  # SIGKILL
        assert len(conversation.lost) == 1  # its client never got an answer
        with anyio.fail_after(5 * LEASE_S):  # a few lease periods: the lease lapses, another takes over
            while (await conversation.through(b).get())["status"] != "idle":
                await anyio.sleep(0.05)
        # taken over and run on from its checkpoint (durable turns): the gate call's outcome is unknown
        turns = await conversation.through(c).turns()
        assert [(t["id"], t["status"], t["attempts"]) for t in turns] == [(turn_id, "completed", 2)], turns
        again = await conversation.through(c).say("hello", bound=15)
        assert again["output"] == "echo: hello"
        with anyio.fail_after(5 * LEASE_S):  # the killed replica drops out of the live list
            while (gone := (await replicas(a)).get("doomed")) is not None and gone["alive"]:
                await anyio.sleep(0.1)
        listed = await replicas(a)
        assert all(listed[name]["alive"] for name in "abc"), listed
    finally:
        open_gate(gate)  # a gate tool that outlived its server would end now


# --- MCP behind a round-robin load balancer ------------------------------------------------------


def test_the_tested_nginx_config_is_the_documented_one() -> None:
    """The proxy below runs `examples/nginx/corral.conf` with only its three ports replaced."""
    documented = TEMPLATE.read_text("utf-8")
    assert render(documented, 8430, ["http://127.0.0.1:8431", "http://127.0.0.1:8432"]) == documented
    rendered = render(documented, 9000, ["http://127.0.0.1:9001", "http://127.0.0.1:9002", "http://127.0.0.1:9003"])
    directives = [line.split("#")[0].strip() for line in rendered.splitlines()]
    assert "listen 127.0.0.1:9000;" in directives and not any("843" in d for d in directives)
    assert [d.split()[1] for d in directives if d.startswith("server 127.")] == [
        "127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9003"]


def relay_turns(metrics: str) -> int:
    line = r'^corral_turns_total\{agent="relay",outcome="completed"\} (\d+)'
    match = re.search(line, metrics, re.MULTILINE)
    return int(match.group(1)) if match else 0


def mcp_posts(server: ServerProcess) -> int:
    """The `/mcp` requests a replica logged (uvicorn's access log)."""
    return sum('"POST /mcp HTTP/1.1"' in line for line in server.stderr.splitlines())


def text_of(result: types.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_mcp_through_nginx_in_front_of_two_replicas(cluster: Cluster, trio, mode: str) -> None:
    a, b, c = trio
    pair = [cluster.servers["a"], cluster.servers["b"]]
    posts = [mcp_posts(s) for s in pair]
    turns = [relay_turns((await x.get("/metrics")).text) for x in (a, b)]
    words = ["two", "three", "four", "five"]
    with NginxProxy([s.url for s in pair]) as proxy:
        with anyio.fail_after(40):
            async with Client(proxy.url + "/mcp", mode=mode) as client:
                assert client.protocol_version == ERA[mode]
                listed = {t.name for t in (await client.list_tools()).tools}
                assert {"relay", "gated", "queued"} <= listed
                first = await client.call_tool("relay", {"message": "one"})
                assert not first.is_error and text_of(first) == "echo: one", text_of(first)
                conversation = first.structured_content["conversation_id"]
                for word in words:  # one conversation, continued through whichever replica answers
                    result = await client.call_tool("relay", {"message": word,
                                                              "conversation_id": conversation})
                    assert not result.is_error and text_of(result) == f"echo: {word}", text_of(result)
                    assert result.structured_content["conversation_id"] == conversation
                elsewhere = await client.call_tool("relay", {"message": "six"})
                assert text_of(elsewhere) == "echo: six"
                assert elsewhere.structured_content["conversation_id"] != conversation
        served, log = proxy.served_by(), proxy.access_log()
    assert set(served) == {s.url.removeprefix("http://") for s in pair}, log
    assert all(mcp_posts(s) > before for s, before in zip(pair, posts, strict=True))
    ran = [relay_turns((await x.get("/metrics")).text) - before
           for x, before in zip((a, b), turns, strict=True)]
    assert sum(ran) == 6 and min(ran) >= 1, ran  # every call ran once, on both replicas between them
    messages = await Conversation(c, {"id": conversation}).messages()
    said = [m["content"] for m in messages if m["role"] == "user"]
    assert said == ["one", *words]


async def test_deleting_a_conversation_removes_its_transcript_file_on_every_replica(
        cluster: Cluster, trio) -> None:
    a, b, c = trio
    conversation = await Conversation.create(a, "hooked")
    files = [cluster.root / f"state-{name}" / "transcripts" / f"{conversation.id}.jsonl" for name in "ab"]
    for client in (a, b):  # a turn on each: each writes the file its hook reads
        assert (await conversation.through(client).say("hello"))["output"] == "echo: hello"
    assert all(f.is_file() for f in files)
    r = await c.delete(conversation.path)
    assert r.status_code == 204, r.text
    with anyio.fail_after(15):  # the others hear of it from the notice c sends
        while any(f.exists() for f in files):
            await anyio.sleep(0.02)


async def test_steer_through_another_replica_reaches_the_running_turn(trio, tmp_path: Path) -> None:
    a, b, c = trio
    conversation = await Conversation.create(a, "gated")
    gate = tmp_path / "gate"
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(conversation.send, f"wait {gate}")  # held on a
            turn_id = await conversation.through(b).started()
            r = await b.post(f"{conversation.path}/messages",
                             json={"content": "steered from b", "if_busy": "steer"})
            assert r.status_code == 202 and r.json() == {"turn_id": turn_id}, r.text
            open_gate(gate)  # a picks the message up before its next model request
        [held] = conversation.replies
        assert held.status_code == 200 and held.json()["output"] == "echo: steered from b", held.text
        events = await conversation.through(c).events(ended(turn_id))
    assert [e.data for e in events if e.name == "message.steered"] == [
        {"turn_id": turn_id, "content": "steered from b"}]
    messages = await conversation.through(c).messages()
    assert [(m["role"], m["content"]) for m in messages if m["role"] == "user"] == [
        ("user", f"wait {gate}"), ("user", "steered from b")]
    assert {m["turn_id"] for m in messages} == {turn_id}
