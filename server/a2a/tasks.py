"""Corral's turns as A2A tasks, and a turn's events as A2A stream events.

A task is a turn (task id = turn id) and its context the turn's conversation.
States: `running` is WORKING, `waiting` (a tool call waits on `ask`) is
INPUT_REQUIRED, and the three endings are COMPLETED, FAILED and CANCELED.
The answer is one text artifact (`answer`); a task that waits names its
permission requests in a data part of its status message (`{"permission_requests":
[{request_id, tool, input, expires_at}]}`), and one that failed carries the
error envelope's body in its status message's metadata (`error`).

Pure functions: no store, no I/O.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from a2a.helpers import get_data_parts, get_text_parts
from a2a.types.a2a_pb2 import (
    ROLE_AGENT,
    ROLE_USER,
    TASK_STATE_CANCELED,
    TASK_STATE_COMPLETED,
    TASK_STATE_FAILED,
    TASK_STATE_INPUT_REQUIRED,
    TASK_STATE_WORKING,
    Artifact,
    Message,
    Part,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from google.protobuf.struct_pb2 import Struct, Value
from google.protobuf.timestamp_pb2 import Timestamp

ANSWER = "answer"  # the id and name of the one artifact a task has: the turn's answer
STATES: dict[str, TaskState] = {
    "running": TASK_STATE_WORKING, "waiting": TASK_STATE_INPUT_REQUIRED, "completed": TASK_STATE_COMPLETED,
    "failed": TASK_STATE_FAILED, "cancelled": TASK_STATE_CANCELED,
}
STATUSES = {state: status for status, state in STATES.items()}
ENDED = frozenset({TASK_STATE_COMPLETED, TASK_STATE_FAILED, TASK_STATE_CANCELED})


def text_of(message: Message) -> str:
    """The text a message says: its text parts, joined."""
    return "\n".join(get_text_parts(message.parts))


def decision_of(message: Message) -> tuple[str, str] | None:
    """The `{"request_id", "decision"}` data part of a message answering a permission request, if any."""
    for data in get_data_parts(message.parts):
        if isinstance(data, dict) and {"request_id", "decision"} <= data.keys():
            return str(data["request_id"]), str(data["decision"])
    return None


def _struct(value: dict[str, Any]) -> Struct:
    out = Struct()
    out.update(value)
    return out


def _data_part(value: dict[str, Any]) -> Part:
    return Part(data=Value(struct_value=_struct(value)), media_type="application/json")


def _stamp(at: float | None) -> Timestamp:
    stamp = Timestamp()
    stamp.FromNanoseconds(int((at if at is not None else time.time()) * 1e9))
    return stamp


def agent_message(task_id: str, context_id: str, suffix: str, text: str, *,
                  data: dict[str, Any] | None = None, metadata: dict[str, Any] | None = None) -> Message:
    parts = [Part(text=text)] + ([_data_part(data)] if data is not None else [])
    message = Message(message_id=f"{task_id}-{suffix}", context_id=context_id, task_id=task_id,
                      role=ROLE_AGENT, parts=parts)
    if metadata:
        message.metadata.CopyFrom(_struct(metadata))
    return message


def waiting_message(task_id: str, context_id: str, requests: Sequence[dict[str, Any]]) -> Message:
    """The status message of a task waiting on a person: what it asks, and how to answer."""
    tools = ", ".join(sorted({str(r.get("tool") or r.get("name")) for r in requests}))
    text = (f"A tool call ({tools}) waits on a person's decision: send a message to this task with a data"
            ' part {"request_id": …, "decision": "allow" or "deny"}, or answer through the'
            " permissions route.")
    return agent_message(task_id, context_id, "asks", text, data={"permission_requests": list(requests)})


def status_message(task_id: str, context_id: str, status: str,
                   error: dict[str, Any] | None) -> Message | None:
    """What a task's status says besides its state: why it failed or stopped (a completed task's answer
    is its artifact, and the last message of its history)."""
    if status == "failed" and error:
        return agent_message(task_id, context_id, "error", f"[{error.get('code')}] {error.get('message')}",
                             metadata={"error": error})
    if status == "cancelled":
        return agent_message(task_id, context_id, "cancelled", "the task was cancelled")
    return None


def task(*, turn_id: str, context_id: str, digest: str, status: str, text_in: str, output: str | None = None,
         error: dict[str, Any] | None = None, requests: Sequence[dict[str, Any]] | None = None,
         at: float | None = None, history_length: int | None = None) -> Task:
    """A turn as an A2A task (`requests`: the permission requests it waits on, if it waits)."""
    state = STATES.get(status, TASK_STATE_WORKING)
    if requests:
        state = TASK_STATE_INPUT_REQUIRED
    message = (waiting_message(turn_id, context_id, requests) if requests
               else status_message(turn_id, context_id, status, error))
    out = Task(id=turn_id, context_id=context_id,
               status=TaskStatus(state=state, message=message, timestamp=_stamp(at)),
               metadata=_struct({"digest": digest}))
    history = [Message(message_id=f"{turn_id}-in", context_id=context_id, task_id=turn_id, role=ROLE_USER,
                       parts=[Part(text=text_in)])]
    if status == "completed":
        out.artifacts.append(Artifact(artifact_id=ANSWER, name=ANSWER, parts=[Part(text=output or "")]))
        history.append(agent_message(turn_id, context_id, "out", output or ""))
    if history_length is not None:
        history = history[len(history) - history_length:] if history_length else []
    out.history.extend(history)
    return out


def status_event(task_id: str, context_id: str, state: TaskState, message: Message | None = None,
                 metadata: dict[str, Any] | None = None) -> TaskStatusUpdateEvent:
    event = TaskStatusUpdateEvent(task_id=task_id, context_id=context_id,
                                  status=TaskStatus(state=state, message=message, timestamp=_stamp(None)))
    if metadata:
        event.metadata.CopyFrom(_struct(metadata))
    return event


def answer_event(task_id: str, context_id: str, text: str, *, append: bool,
                 last: bool) -> TaskArtifactUpdateEvent:
    artifact = Artifact(artifact_id=ANSWER, name=ANSWER, parts=[Part(text=text)])
    return TaskArtifactUpdateEvent(task_id=task_id, context_id=context_id, append=append, last_chunk=last,
                                   artifact=artifact)


class EventTranslator:
    """One turn's Corral events (`message.delta`, `tool.*`, `permission.requested`, the ending) as A2A
    stream events. The answer streams as appended chunks of its artifact; the ending sends it whole
    (`append` false), since text said before a tool call is not part of the answer."""

    def __init__(self, task_id: str, context_id: str):
        self.task_id, self.context_id = task_id, context_id
        self.streamed = False

    def __call__(self, name: str, data: dict[str, Any]) -> list[Any]:
        t, c = self.task_id, self.context_id
        if name == "message.delta":
            append, self.streamed = self.streamed, True
            return [answer_event(t, c, str(data.get("text", "")), append=append, last=False)]
        if name in ("tool.started", "tool.finished"):
            tool = {"event": name, "tool": data.get("name")}
            return [status_event(t, c, TASK_STATE_WORKING, metadata=tool)]
        if name == "permission.requested":
            request = {"request_id": data.get("request_id"), "tool": data.get("name"),
                       "input": data.get("arguments"), "expires_at": data.get("expires_at")}
            return [status_event(t, c, TASK_STATE_INPUT_REQUIRED, waiting_message(t, c, [request]))]
        if name == "turn.completed":
            output = str(data.get("output") or "")
            return [answer_event(t, c, output, append=False, last=True),
                    status_event(t, c, TASK_STATE_COMPLETED)]
        if name == "turn.failed":
            failure = status_message(t, c, "failed", data.get("error"))
            return [status_event(t, c, TASK_STATE_FAILED, failure)]
        if name == "turn.cancelled":
            return [status_event(t, c, TASK_STATE_CANCELED, status_message(t, c, "cancelled", None))]
        return []
