"""This process as one replica: its heartbeat, its leases, recovery, and what the others tell it.

Every `lease_s / 3` seconds a replica writes its heartbeat (id, start, set
digest, turns running here) and renews the leases of the conversations it
holds, in the store. Every second (or sooner, when a stopping replica says
it handed its turns over) it takes over the turns of any other replica whose
leases lapsed (that replica died, stopped, or stopped renewing): each runs
again here from its last checkpoint, as its next attempt, until
`max_attempts`; after that it fails with `interrupted` and its conversation
goes idle, so none stays busy for ever. At start-up it does the same for
what its own previous run left (the embedded store: everything).

Notices from other replicas arrive from the store's listener and are
handled here in order: an event another replica persisted wakes this
replica's readers of that conversation; a conversation's status and a swap
go out on this replica's `/v1/events`; a released conversation wakes the
turns queued for it here; a cancel reaches the turn it names; a permission
decision reaches the call waiting on it; a message steered into a turn
running here has it look for the message; a reload reloads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ..deployment.swaps import Swapper
from ..errors import StorageError
from ..metrics import Metrics
from ..runtime.conversations import Conversations
from ..runtime.events import EventHub
from ..runtime.permissions import PermissionBroker
from ..store.base import Coordination, DefinitionStore, Notice, Recovered, ReplicaRecord

log = logging.getLogger("corral.replicas")
BACKLOG = 10_000  # notices waiting to be handled; beyond it, a resync


class Replicated(Coordination, DefinitionStore, Protocol):
    """The store's ports a replica uses: leases, heartbeats and notices, and the swaps others record."""


class Replica:
    def __init__(self, store: Replicated, *, lease_s: float, max_attempts: int, hub: EventHub,
                 conversations: Conversations, permissions: PermissionBroker, swapper: Swapper,
                 set_digest: Callable[[], str], metrics: Metrics):
        self.store = store
        self.metrics = metrics
        self.id = store.replica
        self.lease_s = lease_s
        self.max_attempts = max_attempts
        self.hub = hub
        self.conversations = conversations
        self.admission = conversations.admission
        self._sweep_now = anyio.Event()
        self.permissions = permissions
        self.swapper = swapper
        self.set_digest = set_digest
        self.started_at = time.time()
        self._send: MemoryObjectSendStream[Notice]
        self._receive: MemoryObjectReceiveStream[Notice]
        self._send, self._receive = anyio.create_memory_object_stream(BACKLOG)
        self._overflowed = False
        self._tg: TaskGroup

    async def recover_at_start(self) -> list[Recovered]:
        """Resume the turns this replica's previous run left (the embedded store: every unfinished
        turn); those out of attempts fail. Call with the conversations' task group running."""
        return await self._recover(starting=True)

    async def run(self, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """Heartbeat, renew, take over others' lapsed turns, and handle notices, until cancelled."""
        self.store.subscribe(self._arrived)
        await self._beat()
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(self._handle_notices)
            if not self.store.embedded:  # one process: nothing of another can lapse after the start
                tg.start_soon(self._sweep)
            task_status.started()
            while True:
                await anyio.sleep(self.lease_s / 3)
                await self._beat()

    async def _sweep(self) -> None:
        """Take over lapsed turns: every second (a lease can lapse any time), or at once on a handoff."""
        interval = min(1.0, self.lease_s / 3)
        while True:
            with anyio.move_on_after(interval):
                await self._sweep_now.wait()
            self._sweep_now = anyio.Event()
            try:
                await self._recover(starting=False)
            except StorageError:
                log.warning("replica %s could not look for lapsed leases", self.id)

    async def _recover(self, *, starting: bool) -> list[Recovered]:
        now = time.time()
        recovered = await self.store.recover_lapsed(now, starting=starting, lease_until=now + self.lease_s,
                                                    max_attempts=self.max_attempts)
        for r in recovered:
            conversation_id = r.turn.conversation_id
            self.metrics.recovered.inc()
            self.hub.poke(conversation_id)
            if r.resumed:
                await self.conversations.resume(r.turn, r.fence)
                continue
            log.warning("turn %s of conversation %s failed: it was cut off %d time(s)", r.turn.id,
                        conversation_id, r.turn.attempts)
            self.hub.publish_global("conversation.status", {"conversation_id": conversation_id,
                                                            "status": "idle"})
            self.admission.wake(conversation_id)
        return recovered

    async def leave(self) -> None:
        """A clean stop: this replica is no longer listed."""
        try:
            await self.store.remove_replica(self.id)
        except StorageError:
            log.warning("could not remove replica %s from the store", self.id)

    async def reload_everywhere(self, trigger: str) -> Any:
        """Reload here, and tell every other replica to reload too; returns this replica's report."""
        report = await self.swapper.reload(trigger)
        try:
            await self.store.notify({"t": "reload", "trigger": trigger})
        except StorageError:
            log.warning("could not tell the other replicas to reload")
        return report

    async def heard_from(self, since: float) -> list[ReplicaRecord]:
        """The replicas whose heartbeat is later than `since` (this one included)."""
        return await self.store.list_replicas(since)

    async def _beat(self) -> None:
        now = time.time()
        try:
            await self.store.renew_leases(now + self.lease_s)
            await self.store.heartbeat(ReplicaRecord(
                id=self.id, started_at=self.started_at, heartbeat_at=now, set_digest=self.set_digest(),
                running_turns=len(self.admission.running_turns())))
            alive = await self.store.list_replicas(now - self.lease_s)
            self.metrics.replicas.set(len(alive))
        except StorageError:
            log.warning("replica %s could not write its heartbeat", self.id)

    def _arrived(self, notice: Notice) -> None:
        try:
            self._send.send_nowait(notice)
        except anyio.WouldBlock:
            self._overflowed = True  # handled as a resync once the backlog drains

    async def _handle_notices(self) -> None:
        async for notice in self._receive:
            try:
                await self._handle(notice)
            except Exception:
                log.exception("could not handle a notice from replica %s", notice.get("r"))
            if self._overflowed and self._receive.statistics().current_buffer_used == 0:
                self._overflowed = False
                await self._handle({"t": "resync"})

    async def _handle(self, notice: Notice) -> None:
        kind = notice.get("t")
        self.metrics.notices.inc(str(kind))
        handler = self._HANDLERS.get(str(kind))
        if handler is not None:
            await handler(self, notice)

    async def _event(self, notice: Notice) -> None:
        self.hub.poke(str(notice["c"]))

    async def _status(self, notice: Notice) -> None:
        self.hub.publish_global("conversation.status",
                                {"conversation_id": notice["c"], "status": notice["st"]})

    async def _queue(self, notice: Notice) -> None:
        self.admission.on_notice(notice)

    async def _permission(self, notice: Notice) -> None:
        await self.permissions.on_notice(notice)

    async def _swap(self, notice: Notice) -> None:
        report = await self.store.get_swap(str(notice["id"]))
        if report is None:
            return
        name = "definitions.rejected" if report.get("status") == "rejected" else "definitions.swapped"
        self.hub.publish_global(name, report)

    async def _reload(self, notice: Notice) -> None:
        # in the background: notices keep flowing while it compiles
        self._tg.start_soon(self.swapper.reload, f"replica {notice.get('r')}")

    async def _handoff(self, notice: Notice) -> None:
        self._sweep_now.set()

    async def _steer(self, notice: Notice) -> None:
        self.conversations.on_notice(notice)

    async def _deleted(self, notice: Notice) -> None:
        await self.conversations.forget(str(notice["c"]))

    async def _resync(self, notice: Notice) -> None:
        self.hub.poke_all()
        self.admission.on_notice(notice)
        self.conversations.on_notice(notice)
        await self.permissions.on_notice(notice)

    _HANDLERS: dict[str, Callable[[Replica, Notice], Awaitable[None]]] = {
        "event": _event, "status": _status, "queue": _queue, "cancel": _queue, "permission": _permission,
        "swap": _swap, "reload": _reload, "resync": _resync, "handoff": _handoff, "steer": _steer,
        "deleted": _deleted,
    }
