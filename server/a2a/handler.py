"""The A2A methods over `Conversations`: contexts are conversations, tasks are turns.

`SendMessage` starts a turn in the message's context (a new conversation
when it names none; its `messageId` is the turn's idempotency key, so a
retried message finds the turn it started) and answers with the task when
the turn ends or waits on a person (`waits.answer`, as the HTTP route does);
`SendStreamingMessage` streams the task, then its status and artifact
updates until it ends (or waits: input-required closes the stream, as A2A
has it). A message to a waiting task with a data part `{"request_id",
"decision"}` answers the request (`PermissionBroker.decide`, as the
permissions route does) and then follows the task on. `GetTask`,
`ListTasks`, `CancelTask` (`Conversations.interrupt`) and `SubscribeToTask`
read and act through the store and the conversation's events, so they work
for a turn running on any replica.

Not responsible for the card or the HTTP endpoint (`routes`), nor for how a
turn runs: every turn is started, followed and stopped through the runtime's
public surface, so what a turn does elsewhere holds here too.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.types.a2a_pb2 import (
    AgentCard,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskPushNotificationConfig,
)
from a2a.utils.errors import (
    ExtendedAgentCardNotConfiguredError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)

from ..errors import RequestError
from ..runtime import waits
from ..runtime.active_turn import ENDED_STATUSES, ActiveTurn
from ..runtime.steering import Steered
from ..service import Service
from ..store.base import TurnRecord
from . import listing, tasks
from .failures import speaks_a2a

MAX_KEY = 255  # an Idempotency-Key's length limit, for the messageId that serves as one


@dataclass(frozen=True)
class Call:
    """What a request to `/a2a/{ref}` runs on: the service, the reference, its agent, who asks."""

    service: Service
    ref: str
    name: str
    who: str


@dataclass(frozen=True)
class Started:
    turn: ActiveTurn
    text: str
    follow_from: int  # the seq after which its events are new to this request


def call_of(context: ServerCallContext) -> Call:
    return context.state["corral"]


def record_task(record: TurnRecord, requests: Any = None, history_length: int | None = None) -> Task:
    return tasks.task(turn_id=record.id, context_id=record.conversation_id, digest=record.digest,
                      status=record.status, text_in=record.input, output=record.output,
                      error=record.error, requests=requests, at=record.ended_at or record.started_at,
                      history_length=history_length)


class CorralHandler(RequestHandler):
    # --- messages ------------------------------------------------------------------

    @speaks_a2a
    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Task | Message:
        call = call_of(context)
        started = await self._start(call, params.message)
        if isinstance(started, Message):
            return started
        turn = started.turn
        if params.configuration.return_immediately:
            return record_task(turn.record)
        answer = await waits.answer(call.service.conversations, turn)
        if isinstance(answer, waits.Waiting):
            return tasks.task(turn_id=answer.turn_id, context_id=answer.conversation_id, digest=answer.digest,
                              status="waiting", text_in=started.text,
                              requests=[r.to_json() for r in answer.requests])
        return tasks.task(turn_id=answer.turn_id, context_id=answer.conversation_id, digest=answer.digest,
                          status=answer.status, text_in=started.text, output=answer.output,
                          error=answer.error)

    @speaks_a2a
    async def on_message_send_stream(self, params: SendMessageRequest,
                                     context: ServerCallContext) -> AsyncGenerator[Any]:
        call = call_of(context)
        started = await self._start(call, params.message)
        if isinstance(started, Message):
            yield started
            return
        record = started.turn.record
        yield tasks.task(turn_id=record.id, context_id=record.conversation_id, digest=record.digest,
                         status="running", text_in=started.text)
        async for event in self._follow(call, record, started.follow_from, stop_on_input=True):
            yield event

    async def _start(self, call: Call, message: Message) -> Started | Message:
        """The turn a message starts, or (a decision) the waiting turn it answers; a steered message's
        answer is a message naming the running task it went to."""
        decision = tasks.decision_of(message)
        if decision is not None:
            return await self._decide(call, message, *decision)
        text = tasks.text_of(message)
        if not text:
            raise RequestError("the message has no text part")
        conversations = call.service.conversations
        conversation_id = message.context_id
        if not conversation_id and message.task_id:
            conversation_id = (await self._turn(call, message.task_id)).conversation_id
        if conversation_id:
            conversation = await conversations.get(conversation_id)
            if conversation.agent_name != call.name:
                raise RequestError(f"context {conversation.id} belongs to agent {conversation.agent_name}",
                                   details={"context_id": conversation.id})
        else:
            conversation = await conversations.create(call.ref, None, {"source": "a2a"})
        key = message.message_id or None
        if key is not None and len(key) > MAX_KEY:
            raise RequestError(f"messageId is longer than {MAX_KEY} characters")
        try:
            turn = await conversations.send(conversation.id, text, idempotency_key=key)
        except Steered as steered:
            return tasks.agent_message(steered.turn_id, steered.conversation_id, "steered",
                                       f"The message was added to the running task {steered.turn_id}.")
        return Started(turn=turn, text=text, follow_from=max(turn.started_seq - 1, 0))

    async def _decide(self, call: Call, message: Message, request_id: str, decision: str) -> Started:
        if decision not in ("allow", "deny"):
            raise RequestError('a decision is "allow" or "deny"', details={"decision": decision})
        if not message.task_id:
            raise RequestError("a decision names the task (taskId) whose request it answers")
        record = await self._turn(call, message.task_id)
        await call.service.permissions.decide(record.conversation_id, request_id, decision == "allow",
                                              call.who)
        stored = ActiveTurn(record=record)  # followed through the store, wherever it runs
        stored.done.set()
        started_seq = await call.service.conversations.streams.started_seq(record.conversation_id, record.id)
        return Started(turn=stored, text=record.input, follow_from=max(started_seq - 1, 0))

    # --- tasks ---------------------------------------------------------------------

    async def _turn(self, call: Call, task_id: str) -> TurnRecord:
        """The turn `task_id` names, if it is this agent's."""
        record = await call.service.store.get_turn(task_id) if task_id else None
        if record is None or record.agent != call.name:
            raise TaskNotFoundError(f"agent {call.name} has no task {task_id!r}")
        return record

    async def _requests(self, call: Call, record: TurnRecord) -> Any:
        if record.status in ENDED_STATUSES:
            return None
        pending = await waits.pending_requests(call.service.store, record.conversation_id, record.id)
        return [r.to_json() for r in pending] or None

    @speaks_a2a
    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        call = call_of(context)
        record = await self._turn(call, params.id)
        history = params.history_length if params.HasField("history_length") else None
        return record_task(record, await self._requests(call, record), history)

    @speaks_a2a
    async def on_list_tasks(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        call = call_of(context)
        records = await listing.turns(call.service, call.name, params.context_id or None)
        return listing.page(records, params, lambda r: record_task(r, history_length=_history(params)))

    @speaks_a2a
    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Task | None:
        call = call_of(context)
        record = await self._turn(call, params.id)
        if record.status in ENDED_STATUSES:
            raise TaskNotCancelableError(f"task {record.id} has already ended ({record.status})")
        await call.service.conversations.interrupt(record.conversation_id)
        return record_task(await self._turn(call, params.id))

    @speaks_a2a
    async def on_subscribe_to_task(self, params: SubscribeToTaskRequest,
                                   context: ServerCallContext) -> AsyncGenerator[Any]:
        call = call_of(context)
        record = await self._turn(call, params.id)
        if record.status in ENDED_STATUSES:
            raise UnsupportedOperationError(f"task {record.id} has ended ({record.status}): read it with"
                                            " GetTask")
        yield record_task(record, await self._requests(call, record))
        started_seq = await call.service.conversations.streams.started_seq(record.conversation_id, record.id)
        async for event in self._follow(call, record, max(started_seq - 1, 0), stop_on_input=False):
            yield event

    async def _follow(self, call: Call, record: TurnRecord, after: int, *,
                      stop_on_input: bool) -> AsyncGenerator[Any]:
        """The turn's events after `after` as A2A events, until it ends (or, `stop_on_input`, asks a
        person: a request already answered, replayed, does not count)."""
        translate = tasks.EventTranslator(record.id, record.conversation_id)
        store = call.service.store
        events = call.service.conversations.events(record.conversation_id, after=after, until_turn=record.id)
        async for event in events:
            if event is None:
                continue
            if event.name == "permission.requested":
                asked = await store.get_permission(str(event.data.get("request_id")))
                if asked is None or asked.status != "pending":
                    continue
            for out in translate(event.name, event.data):
                yield out
            if stop_on_input and event.name == "permission.requested":
                return

    # --- what Corral does not offer --------------------------------------------------

    async def on_create_task_push_notification_config(
            self, params: TaskPushNotificationConfig,
            context: ServerCallContext) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError

    async def on_get_task_push_notification_config(self, params: GetTaskPushNotificationConfigRequest,
                                                   context: ServerCallContext) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError

    async def on_list_task_push_notification_configs(
            self, params: ListTaskPushNotificationConfigsRequest,
            context: ServerCallContext) -> ListTaskPushNotificationConfigsResponse:
        raise PushNotificationNotSupportedError

    async def on_delete_task_push_notification_config(self, params: DeleteTaskPushNotificationConfigRequest,
                                                      context: ServerCallContext) -> None:
        raise PushNotificationNotSupportedError

    async def on_get_extended_agent_card(self, params: GetExtendedAgentCardRequest,
                                         context: ServerCallContext) -> AgentCard:
        raise ExtendedAgentCardNotConfiguredError


def _history(params: ListTasksRequest) -> int | None:
    return params.history_length if params.HasField("history_length") else None
