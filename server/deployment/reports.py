"""What a swap reports (§4): frozen values, rendered as the contract's JSON by `to_json`.

`SwapReport` is returned by `POST /v1/definitions/reload`, stored in the
history, published on `/v1/events` and told to swap listeners; each surface
renders it, none re-reads a dict.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Change:
    kind: str
    name: str
    change: str  # added | changed | removed
    before: str | None  # the digest it had ("from")
    after: str | None  # the digest it has ("to")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "change": self.change, "from": self.before,
                "to": self.after}


@dataclass(frozen=True)
class BusyTurn:
    """A conversation mid-turn on an agent the swap changed or removed."""

    conversation_id: str
    agent: str
    digest: str
    turn_id: str
    since: str  # ISO 8601

    def to_json(self) -> dict[str, Any]:
        return {"conversation_id": self.conversation_id, "agent": self.agent, "digest": self.digest,
                "turn_id": self.turn_id, "since": self.since}


@dataclass(frozen=True)
class SwapReport:
    id: str
    at: str  # ISO 8601
    trigger: str  # watch | api | sighup | ...
    status: str  # applied | rejected | unchanged
    previous: str
    current: str
    changes: tuple[Change, ...] = ()
    busy: tuple[BusyTurn, ...] = ()
    errors: tuple[Mapping[str, Any], ...] = ()
    attempted: str | None = None  # the set digest a locked server refused
    replica: str | None = None  # which replica swapped (each replica swaps its own copy of the set)

    def touched_agents(self) -> set[str]:
        """Agents the swap changed or removed (whose running turns are busy)."""
        return {c.name for c in self.changes if c.kind == "Agent" and c.change != "added"}

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id, "at": self.at, "trigger": self.trigger, "status": self.status,
            "previous": self.previous, "current": self.current,
            "changes": [c.to_json() for c in self.changes], "busy": [b.to_json() for b in self.busy],
            "errors": [dict(e) for e in self.errors],
        }
        if self.attempted is not None:
            body["attempted"] = self.attempted
        if self.replica is not None:
            body["replica"] = self.replica
        return body

    def summary(self) -> str:
        """One readable log line."""
        head = f"swap {self.status} ({self.trigger}): {self.previous[:19]}"
        if self.status == "applied":
            counts: dict[str, int] = {}
            for change in self.changes:
                counts[change.change] = counts.get(change.change, 0) + 1
            detail = ", ".join(f"{n} {c}" for c, n in sorted(counts.items()))
            busy = f"; busy: {', '.join(b.conversation_id for b in self.busy)}" if self.busy else ""
            return f"{head} -> {self.current[:19]} [{detail}]{busy}"
        if self.status == "rejected":
            first = self.errors[0] if self.errors else {}
            where = f"{first.get('file')}:{first.get('line')}: " if first.get("file") else ""
            return f"{head} kept; {len(self.errors)} error(s), first: {where}{first.get('message', '')}"
        return head + " (no definition changed)"
