"""Turn events as typed values (`server.turn_events`): every event a real server sends reads as its class
and gives its data back key for key; what cannot be typed exactly is relayed untouched."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from server import turn_events
from server.turn_events import (
    ABSENT,
    ContextCompacted,
    MessageDelta,
    MessageSteered,
    PermissionRequested,
    ToolFinished,
    ToolStarted,
    TurnCancelled,
    TurnCompleted,
    TurnFailed,
    TurnResumed,
    TurnStarted,
    Unrecognized,
)
from tests.support.client import Conversation
from tests.support.events import ended
from tests.support.servers import corral_server
from tests.support.trees import gated_definitions, open_gate

# The turn events CONTRACT §5 names (SSE `event:` names).
CONTRACT_NAMES = {
    "turn.started", "message.delta", "tool.started", "tool.finished", "permission.requested", "turn.resumed",
    "message.steered", "context.compacted", "turn.completed", "turn.failed", "turn.cancelled",
}

# One event of each kind, as its producer writes it: (name, data, the typed value).
SAMPLES: list[tuple[str, dict[str, Any], Any]] = [
    ("turn.started", {"turn_id": "turn_1", "digest": "sha256:ab", "agent": "a"},
     TurnStarted(turn_id="turn_1", digest="sha256:ab", agent="a")),
    ("message.delta", {"text": "hé"}, MessageDelta(text="hé")),
    ("tool.started", {"tool_call_id": "c1", "name": "gate", "arguments": {"path": "/x", "n": [1, 2]}},
     ToolStarted(tool_call_id="c1", tool="gate", arguments={"path": "/x", "n": [1, 2]})),
    ("tool.finished", {"tool_call_id": "c1", "name": "gate", "is_error": False, "content": "ok"},
     ToolFinished(tool_call_id="c1", tool="gate", is_error=False, content="ok")),
    ("tool.finished", {"tool_call_id": "c1", "name": "gate", "is_error": True, "content": "?",
                       "outcome": "unknown"},
     ToolFinished(tool_call_id="c1", tool="gate", is_error=True, content="?", outcome="unknown")),
    ("permission.requested", {"request_id": "perm_1", "turn_id": "turn_1", "tool_call_id": "c1", "name": "rm",
                              "arguments": {}, "reason": None, "expires_at": "2026-01-01T00:00:00Z"},
     PermissionRequested(request_id="perm_1", turn_id="turn_1", tool_call_id="c1", tool="rm", arguments={},
                         reason=None, expires_at="2026-01-01T00:00:00Z")),
    ("turn.resumed", {"turn_id": "turn_1", "attempt": 2}, TurnResumed(turn_id="turn_1", attempt=2)),
    ("message.steered", {"turn_id": "turn_1", "content": "also"},
     MessageSteered(turn_id="turn_1", content="also")),
    ("context.compacted", {"turn_id": None, "strategy": "truncate", "before": 900, "after": 200,
                           "messages": 4, "source": "estimated"},
     ContextCompacted(turn_id=None, strategy="truncate", before=900, after=200, messages=4,
                      source="estimated")),
    ("turn.completed", {"turn_id": "turn_1", "output": "{}", "stop_reason": "end_turn",
                        "usage": {"input_tokens": 3, "output_tokens": 4}, "structured": {}},
     TurnCompleted(turn_id="turn_1", output="{}", stop_reason="end_turn",
                   usage={"input_tokens": 3, "output_tokens": 4}, structured={})),
    ("turn.failed", {"turn_id": "turn_1", "error": {"code": "interrupted", "message": "stopped"}},
     TurnFailed(turn_id="turn_1", error={"code": "interrupted", "message": "stopped"})),
    ("turn.cancelled", {"turn_id": "turn_1"}, TurnCancelled(turn_id="turn_1")),
]


def _exact(name: str, data: dict[str, Any]) -> Any:
    """The typed value of (name, data), checked to give back exactly `data` (same keys, same order)."""
    event = turn_events.read(name, data)
    assert event.name == name
    assert json.dumps(event.to_json()) == json.dumps(data), (event, data)
    return event


def test_the_union_has_every_event_the_contract_names() -> None:
    assert {kind.name for kind in turn_events.KINDS} == CONTRACT_NAMES
    assert {name for name, _, _ in SAMPLES} == CONTRACT_NAMES


@pytest.mark.parametrize(("name", "data", "typed"), SAMPLES, ids=[f"{n}-{i}" for i, (n, _, _) in
                                                                   enumerate(SAMPLES)])
def test_each_event_reads_as_its_class_and_back_to_its_exact_data(name: str, data: dict[str, Any],
                                                                   typed: Any) -> None:
    assert _exact(name, data) == typed
    assert typed.wire() == (name, data) and list(typed.to_json()) == list(data)


def test_a_completed_turn_without_an_output_schema_has_no_structured_key() -> None:
    event = TurnCompleted(turn_id="t", output="hi", stop_reason="end_turn", usage={})
    assert event.structured is ABSENT and "structured" not in event.to_json()


@pytest.mark.parametrize(("name", "data"), [
    ("turn.started", {"digest": "d", "turn_id": "t", "agent": "a"}),  # another order
    ("turn.started", {"turn_id": "t", "digest": "d"}),  # a key missing
    ("message.delta", {"text": "x", "seq": 1}),  # a key it does not know
    ("definitions.swapped", {"id": "swap_1"}),  # not a turn event
])
def test_what_cannot_be_typed_exactly_is_relayed_as_it_is(name: str, data: dict[str, Any]) -> None:
    event = turn_events.read(name, data)
    assert isinstance(event, Unrecognized)
    assert event.wire() == (name, data) and list(event.to_json()) == list(data)


def test_a_turn_ends_with_its_own_ending_typed_or_not() -> None:
    assert turn_events.ends(TurnCancelled(turn_id="t"), "t")
    assert not turn_events.ends(TurnCancelled(turn_id="t"), "u")
    assert not turn_events.ends(TurnStarted(turn_id="t", digest="d", agent="a"), "t")
    assert turn_events.ends(turn_events.read("turn.failed", {"turn_id": "t", "error": {}, "later": 1}), "t")
    assert turn_events.turn_of(MessageDelta(text="x")) is None


# --- what a real server sends ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("turn-events")
    with corral_server(gated_definitions(root / "defs"), root / "state") as url:
        yield url


@pytest.mark.anyio
async def test_every_event_a_server_sends_is_typed_exactly(base_url: str, tmp_path: Path) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=10, trust_env=False) as client:
        completed, cancelled = [await Conversation.create(client, "gated") for _ in range(2)]
        gate = tmp_path / "open"
        open_gate(gate)
        with anyio.fail_after(20):
            streamed = await completed.stream(f"wait {gate}")
            replayed = await completed.events(ended(streamed[0].data["turn_id"]))
            async with anyio.create_task_group() as tg:
                tg.start_soon(cancelled.send, f"wait {tmp_path / 'never'}")
                turn_id = await cancelled.started()
                r = await client.post(f"{cancelled.path}/interrupt")
                assert r.json() == {"interrupted": True, "turn_id": turn_id}
            replayed += await cancelled.events(ended(turn_id))
    names = [e.name for e in replayed]
    assert {"turn.started", "tool.started", "tool.finished", "message.delta", "turn.completed",
            "turn.cancelled"} <= set(names), names
    as_streamed = [(e.id, e.name, e.data) for e in streamed]
    assert as_streamed == [(e.id, e.name, e.data) for e in replayed[:len(streamed)]]
    for e in replayed:
        assert not isinstance(_exact(e.name, e.data), Unrecognized), e
