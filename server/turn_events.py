"""Turn events: the tagged union a conversation's event stream carries (§5, §8).

Each event name on the wire (the SSE `event:` line, the store's `name`
column) is one frozen class here, its fields the keys of its `data`, in the
order clients have always seen them. `read(name, data)` turns a stored or
published `(name, data)` into its typed value, and `event.to_json()` gives
back exactly that `data` (same keys, same order: a replayed event is
byte-identical to the live one). Producers build the typed values; the
store keeps `(event.name, event.to_json())` as it always did.

What `read` cannot type exactly (a name this server does not know, keys it
does not expect, in another order: rows an older or newer replica wrote) is
`Unrecognized`, which keeps `data` as it was, so every reader still relays
it untouched.

This module is the shape of events only: it runs, persists and publishes
nothing. The server-wide stream's events (`conversation.status`,
`definitions.swapped`, ...) are not turn events and are not here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Final, Literal


class _Absent:
    """A key the event's `data` does not carry (`structured` of a turn without an output schema)."""

    _instance: _Absent | None = None

    def __new__(cls) -> _Absent:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Final = _Absent()


# The one field spelled differently on the wire: a tool event's `data.name` is the tool's name, and
# `name` is the event's own (the SSE `event:` line), so the field is called `tool` here.
_WIRE_KEY: Final = {"tool": "name"}
_FIELD: Final = {wire: field for field, wire in _WIRE_KEY.items()}


class _Event:
    """What every turn event does: its wire name (`name`) and its exact `data` (`to_json`)."""

    __slots__ = ()
    name: ClassVar[str]
    _keys: ClassVar[tuple[tuple[str, str], ...]]  # (wire key, field), in the wire's order

    def to_json(self) -> dict[str, Any]:
        """The event's `data` as the wire carries it; a key whose value is `ABSENT` is left out."""
        out = {}
        for key, field in self._keys:
            value = getattr(self, field)
            if value is not ABSENT:
                out[key] = value
        return out

    def wire(self) -> tuple[str, dict[str, Any]]:
        """`(name, data)`: what the store keeps and the hub publishes."""
        return self.name, self.to_json()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Any:
        """The typed value of `data`, or None when `to_json` could not give `data` back exactly."""
        if list(data) != [key for key, _ in cls._keys if key in data]:  # an unknown key, or another order
            return None
        try:
            return cls(**{_FIELD.get(key, key): value for key, value in data.items()})
        except TypeError:  # a required key missing
            return None


@dataclass(frozen=True, kw_only=True, slots=True)
class TurnStarted(_Event):
    """Always a turn's first event."""

    name: ClassVar[str] = "turn.started"
    turn_id: str
    digest: str
    agent: str
    trace_id: str | _Absent = ABSENT  # the trace every attempt of the turn goes on in (§13)
    traceparent: str | _Absent = ABSENT  # the request's, when it came with one
    tracestate: str | _Absent = ABSENT


@dataclass(frozen=True, kw_only=True, slots=True)
class MessageDelta(_Event):
    name: ClassVar[str] = "message.delta"
    text: str


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolStarted(_Event):
    name: ClassVar[str] = "tool.started"
    tool_call_id: str
    tool: str  # `name` on the wire
    arguments: Any
    usage: dict[str, Any] | _Absent = ABSENT  # the first call of a step: what the step's request used


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolFinished(_Event):
    """`outcome` is `"unknown"` for a call a crash cut off and that was not run again (§9)."""

    name: ClassVar[str] = "tool.finished"
    tool_call_id: str
    tool: str
    is_error: bool
    content: str
    hooks: list[dict[str, Any]] | _Absent = ABSENT  # the hooks that ran for the call (a turn's steps)
    outcome: Literal["unknown"] | _Absent = ABSENT


@dataclass(frozen=True, kw_only=True, slots=True)
class PermissionRequested(_Event):
    """A tool call waits on a person's decision (`request_id` names it)."""

    name: ClassVar[str] = "permission.requested"
    request_id: str
    turn_id: str
    tool_call_id: str | None
    tool: str
    arguments: Any
    reason: str | None
    expires_at: str


@dataclass(frozen=True, kw_only=True, slots=True)
class TurnResumed(_Event):
    """Another replica (or the next start) goes on with a turn whose replica stopped (§9)."""

    name: ClassVar[str] = "turn.resumed"
    turn_id: str
    attempt: int


@dataclass(frozen=True, kw_only=True, slots=True)
class MessageSteered(_Event):
    name: ClassVar[str] = "message.steered"
    turn_id: str
    content: str


@dataclass(frozen=True, kw_only=True, slots=True)
class ContextCompacted(_Event):
    """`turn_id` is the turn that compacted, or what held the conversation for `POST …/compact`."""

    name: ClassVar[str] = "context.compacted"
    turn_id: str | None
    strategy: str
    before: int
    after: int
    messages: int
    source: str


@dataclass(frozen=True, kw_only=True, slots=True)
class TurnCompleted(_Event):
    name: ClassVar[str] = "turn.completed"
    turn_id: str
    output: str
    stop_reason: str
    usage: Mapping[str, int]
    structured: Any = ABSENT  # the output's value, when the turn had an output schema


@dataclass(frozen=True, kw_only=True, slots=True)
class TurnFailed(_Event):
    name: ClassVar[str] = "turn.failed"
    turn_id: str
    error: Mapping[str, Any]  # the error envelope's body: {"code", "message", "details"?}


@dataclass(frozen=True, kw_only=True, slots=True)
class TurnCancelled(_Event):
    name: ClassVar[str] = "turn.cancelled"
    turn_id: str


@dataclass(frozen=True, slots=True)
class Unrecognized:
    """An event `read` could not type exactly: relayed as it is."""

    name: str
    data: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return dict(self.data)

    def wire(self) -> tuple[str, dict[str, Any]]:
        return self.name, self.to_json()


TurnEnded = TurnCompleted | TurnFailed | TurnCancelled
TurnEvent = (TurnStarted | MessageDelta | ToolStarted | ToolFinished | PermissionRequested | TurnResumed
             | MessageSteered | ContextCompacted | TurnCompleted | TurnFailed | TurnCancelled | Unrecognized)

KINDS: Final[tuple[type[_Event], ...]] = (
    TurnStarted, MessageDelta, ToolStarted, ToolFinished, PermissionRequested, TurnResumed, MessageSteered,
    ContextCompacted, TurnCompleted, TurnFailed, TurnCancelled)
ENDINGS: Final = (TurnCompleted, TurnFailed, TurnCancelled)  # a turn ends with exactly one of these
ENDING_NAMES: Final = tuple(kind.name for kind in ENDINGS)
_BY_NAME: Final = {kind.name: kind for kind in KINDS}


def _wire_keys(kind: type[_Event]) -> tuple[tuple[str, str], ...]:
    return tuple((_WIRE_KEY.get(f.name, f.name), f.name) for f in fields(kind))  # type: ignore[arg-type]


for _kind in KINDS:
    _kind._keys = _wire_keys(_kind)


def read(name: str, data: Mapping[str, Any]) -> TurnEvent:
    """The typed value of a stored or published event; `Unrecognized` when it cannot be typed exactly."""
    kind = _BY_NAME.get(name)
    event = kind.from_json(data) if kind is not None else None
    return event if event is not None else Unrecognized(name, data)


def turn_of(event: TurnEvent) -> str | None:
    """The turn an event names, if it names one (`message.delta` and `tool.*` do not); read from the
    data of one that could not be typed too, so a row of another version still ends its turn's stream."""
    if isinstance(event, Unrecognized):
        return event.data.get("turn_id")
    return getattr(event, "turn_id", None)


def ends(event: TurnEvent, turn_id: str) -> bool:
    """Whether `event` is the end of turn `turn_id`."""
    return event.name in ENDING_NAMES and turn_of(event) == turn_id
