"""A turn's steps and trace id, read from what the turn already committed (§13).

No step is written anywhere: the turn's events (`turn.started` with its
`trace_id`, `turn.resumed`, `tool.started`/`tool.finished`,
`context.compacted`, `message.steered`), its messages (each assistant
message ends a model step) and its permission requests (asked, answered)
are read back and laid out as `[{"kind", "name", "started_at", "ended_at",
"attempt", "outcome", "usage"?}]`, oldest first, whether or not any trace is
exported. A step begins where the one before it ended (the turn's start, a
tool's result, a compaction): a model step from then to its message, a
compaction likewise. A tool call cut off by a crash is `interrupted` in its
attempt, and the next attempt's run of it (if its tool is safe to run
again) is a step of that attempt. A model step's usage is what the first
`tool.started` after it says it used; an ended turn's one step with none
(its last, normally) used the rest of the turn's usage.
The hooks that ran inside a tool call are listed in its `tool.finished`
(`hooks`), and are steps from there; the turn's other hooks (session_start,
user_prompt_submit, stop) commit nothing of their own and are spans only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..clock import iso
from ..messages import AssistantMessage
from ..store.base import EventRecord, MessageRecord, PermissionRecord, Store, TurnRecord
from .active_turn import TERMINAL_EVENTS

PAGE = 1000
BOUNDARIES = ("turn.started", "turn.resumed", "tool.finished", "message.steered", "context.compacted")


@dataclass
class _Timeline:
    turn: TurnRecord
    attempt: int = 1
    since: float = 0.0  # where the next step begins
    steps: list[dict[str, Any]] = field(default_factory=list)
    open_tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    models: list[dict[str, Any]] = field(default_factory=list)  # the model steps, in order

    def step(self, kind: str, name: str, started: float, ended: float | None, outcome: str,
             attempt: int | None = None) -> dict[str, Any]:
        step = {"kind": kind, "name": name, "started_at": iso(started),
                "ended_at": None if ended is None else iso(ended), "attempt": attempt or self.attempt,
                "outcome": outcome}
        self.steps.append(step)
        return step

    def event(self, event: EventRecord) -> None:
        data, at = event.data, event.created_at
        if event.name == "turn.resumed":
            self.attempt = int(data.get("attempt") or self.attempt + 1)
            for step in self.open_tools.values():  # cut off with its attempt; the next one may run it again
                step.update(ended_at=iso(at), outcome="interrupted")
            self.open_tools.clear()
        elif event.name == "tool.started":
            if isinstance(data.get("usage"), dict) and self.models:  # what the step that asked used
                self.models[-1]["usage"] = dict(data["usage"])
            self.open_tools[str(data.get("tool_call_id"))] = self.step(
                "tool", str(data.get("name")), at, None, "running" if self.running else "unfinished")
        elif event.name == "tool.finished":
            self._finished(data, at)
        elif event.name == "context.compacted" and data.get("turn_id") == self.turn.id:
            self.step("compaction", str(data.get("strategy")), self.since, at, "ok")
        if event.name in BOUNDARIES:
            self.since = at

    def _finished(self, data: dict[str, Any], at: float) -> None:
        step = self.open_tools.pop(str(data.get("tool_call_id")), None)
        if step is None:  # started by an earlier attempt: this attempt's run of it began as it resumed
            step = self.step("tool", str(data.get("name")), self.since, None, "")
        step["ended_at"] = iso(at)
        step["outcome"] = data.get("outcome") or ("error" if data.get("is_error") else "ok")
        for run in data.get("hooks") or ():  # the hooks that ran inside the call
            if isinstance(run, dict):
                self.steps.append({"kind": "hook", "name": str(run.get("name")), "attempt": self.attempt,
                                   "started_at": run.get("started_at"), "ended_at": run.get("ended_at"),
                                   "outcome": str(run.get("outcome"))})

    def model(self, message: MessageRecord) -> None:
        self.models.append(self.step("model", self.turn.agent, self.since, message.created_at, "ok"))
        self.since = message.created_at

    def remainder(self) -> None:
        """An ended turn's one model step whose usage no tool call carried (its last, usually) used
        what the turn used beyond the others."""
        left = [m for m in self.models if "usage" not in m]
        if self.running or len(left) != 1 or not self.turn.usage:
            return
        used = {k: int(self.turn.usage.get(k) or 0) for k in ("input_tokens", "output_tokens")}
        for m in self.models:
            for k in used:
                used[k] -= int(m.get("usage", {}).get(k) or 0)
        if min(used.values()) >= 0:
            left[0]["usage"] = used

    @property
    def running(self) -> bool:
        return self.turn.ended_at is None


async def steps_of(store: Store, turn: TurnRecord) -> dict[str, Any]:
    """`{"trace_id", "steps"}` of `turn`, from its events, messages and permission requests."""
    events = await _events(store, turn)
    started = next((e for e in events if e.name == "turn.started"), None)
    timeline = _Timeline(turn, since=started.created_at if started else turn.started_at)
    replies = [m for m in await store.turn_messages(turn.conversation_id, turn.id)
               if isinstance(m.message, AssistantMessage)]
    # in commit order: a step's message commits with (or before) the events that follow it
    for item in sorted([*events, *replies], key=lambda r: (r.created_at, isinstance(r, EventRecord))):
        if isinstance(item, EventRecord):
            timeline.event(item)
        else:
            timeline.model(item)
    timeline.remainder()
    permissions = [p for p in await store.list_permissions(turn.conversation_id) if p.turn_id == turn.id]
    steps = timeline.steps + [_permission(p, events) for p in permissions]
    steps.sort(key=lambda s: s["started_at"])
    trace_id = started.data.get("trace_id") if started else None
    return {"trace_id": trace_id if isinstance(trace_id, str) else None, "steps": steps}


def _permission(p: PermissionRecord, events: list[EventRecord]) -> dict[str, Any]:
    attempt = 1
    for event in events:
        if event.name == "turn.resumed" and event.created_at <= p.requested_at:
            attempt = int(event.data.get("attempt") or attempt + 1)
    return {"kind": "permission", "name": p.tool, "started_at": iso(p.requested_at),
            "ended_at": None if p.decided_at is None else iso(p.decided_at), "attempt": attempt,
            "outcome": p.status}


async def _events(store: Store, turn: TurnRecord) -> list[EventRecord]:
    """The conversation's events from `turn`'s `turn.started` to its ending (its turns run one at a
    time: what lies between is the turn's)."""
    out: list[EventRecord] = []
    after, inside = 0, False
    while True:
        page = await store.list_events(turn.conversation_id, after=after, limit=PAGE)
        for event in page:
            after = event.seq
            mine = event.data.get("turn_id") == turn.id
            if event.name == "turn.started" and mine:
                inside = True
            if inside:
                out.append(event)
                if event.name in TERMINAL_EVENTS and mine:
                    return out
        if len(page) < PAGE:
            return out
