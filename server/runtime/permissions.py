"""Permission requests: a tool call that needs a person's yes.

`ask` pauses the call: the request is recorded, a `permission.requested`
event goes out, the turn and its conversation show `waiting`, and the call
resumes when `POST /v1/conversations/{id}/permissions/{request_id}` answers,
or is denied when the request expires (or is recorded as cancelled when its
turn ends first). Every request and decision is kept (who, when, what) as an
audit trail. The decision may reach any replica: the store records it, and a
"permission" notice tells every replica to read it (`on_notice`), so it
reaches the call wherever its turn runs now, also a turn that moved from
the replica that received it. A turn that takes over after the decision
finds it recorded (`request`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import anyio

from ..clock import iso
from ..errors import PermissionNotFound, RequestError
from ..ids import new_id
from ..statuses import DECIDED, PermissionStatus
from ..store.base import Notice, PermissionRecord, PermissionStore
from ..tools.base import ToolContext
from ..turn_events import PermissionRequested


@dataclass
class _Waiter:
    conversation_id: str
    answered: anyio.Event = field(default_factory=anyio.Event)
    allowed: bool = False


class PermissionBroker:
    def __init__(self, store: PermissionStore, timeout_s: float):
        self.store = store
        self.timeout_s = timeout_s
        self._waiting: dict[str, _Waiter] = {}

    async def request(self, ctx: ToolContext, tool: str, arguments: dict[str, Any],
                      reason: str | None) -> tuple[bool, str]:
        """Wait for a decision; returns (allowed, why).

        A resumed turn (its replica stopped) asks again for the same call: the request made by
        its earlier attempt stands, pending or answered, so the person's answer is not lost.
        """
        now = time.time()
        earlier = await self._earlier(ctx)
        if earlier is not None and earlier.status in DECIDED:
            allowed = earlier.status == "allowed"
            return allowed, "allowed" if allowed else "denied by a person"
        record = earlier if earlier is not None and earlier.status == "pending" else PermissionRecord(
            id=new_id("perm"), conversation_id=ctx.conversation_id, turn_id=ctx.turn_id,
            tool_call_id=ctx.call_id, tool=tool, arguments=arguments, reason=reason, status="pending",
            requested_at=now, expires_at=now + self.timeout_s,
        )
        if record is not earlier:
            await self.store.create_permission(record)
        waiter = self._waiting[record.id] = _Waiter(ctx.conversation_id)
        unanswered: tuple[PermissionStatus, str] = ("cancelled", "cancellation")  # the turn ended first
        try:
            if ctx.channel is not None:
                await ctx.channel.waiting(True)
                if record is not earlier:
                    await ctx.channel.emit(PermissionRequested(
                        request_id=record.id, turn_id=ctx.turn_id, tool_call_id=ctx.call_id, tool=tool,
                        arguments=arguments, reason=reason, expires_at=iso(record.expires_at)))
            # a decision that came while no replica waited (between the crash and the resume)
            if record is earlier:
                await self.on_notice({"t": "permission", "id": record.id})
            with anyio.move_on_after(max(record.expires_at - time.time(), 0)):
                await waiter.answered.wait()
            unanswered = ("expired", "expiry")
        finally:
            self._waiting.pop(record.id, None)
            with anyio.CancelScope(shield=True):
                if not waiter.answered.is_set():
                    await self.store.decide_permission(record.id, *unanswered, time.time())
                if ctx.channel is not None:
                    await ctx.channel.waiting(False)
        if not waiter.answered.is_set():
            return False, f"the permission request expired after {record.expires_at - record.requested_at:g}s"
        return waiter.allowed, "allowed" if waiter.allowed else "denied by a person"

    async def _earlier(self, ctx: ToolContext) -> PermissionRecord | None:
        """The request an earlier attempt of this turn made for this call, if any (the latest)."""
        if not ctx.call_id:
            return None
        found = [p for p in await self.store.list_permissions(ctx.conversation_id)
                 if p.turn_id == ctx.turn_id and p.tool_call_id == ctx.call_id]
        return found[-1] if found else None

    async def decide(self, conversation_id: str, request_id: str, allow: bool, who: str) -> PermissionRecord:
        record = await self.store.get_permission(request_id)
        if record is None or record.conversation_id != conversation_id:
            raise PermissionNotFound(f"no permission request {request_id!r} in this conversation")
        status = "allowed" if allow else "denied"
        if not await self.store.decide_permission(request_id, status, who, time.time()):
            raise RequestError(f"permission request {request_id} was already {record.status}",
                               code="conflict", details={"status": record.status})
        waiter = self._waiting.get(request_id)
        if waiter is not None:
            waiter.allowed = allow
            waiter.answered.set()
        if not self.store.embedded:
            # Every replica is told, the one waiting here too: a call waiting here may belong to a turn
            # another replica has taken over meanwhile (this one paused past its lease), whose new
            # owner waits on the same request; this replica's stale call finds its lease gone before
            # it acts on the answer (`TurnChannel.confirm`).
            await self.store.notify({"t": "permission", "id": request_id})
        updated = await self.store.get_permission(request_id)
        assert updated is not None
        return updated

    async def on_notice(self, notice: Notice) -> None:
        """Another replica recorded a decision: a call waiting here goes on."""
        if notice.get("t") == "resync":
            request_ids = list(self._waiting)
        elif notice.get("t") == "permission":
            request_ids = [str(notice.get("id"))]
        else:
            return
        for request_id in request_ids:
            waiter = self._waiting.get(request_id)
            if waiter is None:
                continue
            record = await self.store.get_permission(request_id)
            if record is not None and record.status in DECIDED:
                waiter.allowed = record.status == "allowed"
                waiter.answered.set()
