"""Conversation routes: create, read, list, update, fork, delete, send, transcript, turns, events."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal, cast

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import RequestError
from ..runtime import waits
from ..runtime.records import Records
from ..runtime.steering import Steered
from ..statuses import CONVERSATION_STATUSES, ConversationStatus
from ..store.base import ConversationRecord, EventRecord, TurnRecord
from ..turn_events import ends
from .plumbing import KEEP_ALIVE, BrokenOff, iso, page, page_params, read_json, sse_frame, sse_response

MAX_METADATA_BYTES = 16 * 1024  # §10: metadata is at most 16 KiB as (compact, UTF-8) JSON


def _small(metadata: dict[str, Any]) -> dict[str, Any]:
    size = len(json.dumps(metadata, ensure_ascii=False, separators=(",", ":")).encode())
    if size > MAX_METADATA_BYTES:
        raise ValueError(f"metadata is {size} bytes as JSON; at most {MAX_METADATA_BYTES} are kept")
    return metadata


Metadata = Annotated[dict[str, Any], AfterValidator(_small)]


class CreateConversation(BaseModel):
    model_config = ConfigDict(extra="forbid")
    agent: str = Field(min_length=1, max_length=200)
    title: str | None = Field(default=None, max_length=500)
    metadata: Metadata = Field(default_factory=dict)


class UpdateConversation(BaseModel):
    """PATCH: the fields given change (at least one); a null title clears it."""

    model_config = ConfigDict(extra="forbid")
    title: str | None = Field(default=None, max_length=500)
    metadata: Metadata = Field(default_factory=dict)  # replaces the metadata whole
    archived: StrictBool = False


class ForkConversation(BaseModel):
    model_config = ConfigDict(extra="forbid")
    before_turn_id: str | None = Field(default=None, min_length=1, max_length=200)
    agent: str | None = Field(default=None, min_length=1, max_length=200)
    title: str | None = Field(default=None, max_length=500)


class SendMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    content: str = Field(min_length=1)
    stream: StrictBool = False
    if_busy: Literal["reject", "enqueue", "interrupt", "steer"] | None = None


def _conversations(request: Request):
    return request.app.state.service.conversations


def _records(request: Request) -> Records:
    return request.app.state.service.records


def conversation_json(c: ConversationRecord) -> dict[str, Any]:
    return {
        "id": c.id, "agent": c.agent, "agent_name": c.agent_name, "digest": c.digest,
        "pinned": c.pinned, "status": c.status, "title": c.title, "metadata": c.metadata,
        "created_at": iso(c.created_at), "updated_at": iso(c.updated_at),
        "archived": c.archived, "forked_from": c.forked_from,
    }


def turn_json(t: TurnRecord) -> dict[str, Any]:
    return {
        "id": t.id, "conversation_id": t.conversation_id, "agent": t.agent, "digest": t.digest,
        "status": t.status, "stop_reason": t.stop_reason, "usage": t.usage, "error": t.error,
        "attempts": t.attempts,
        "input": t.input, "output": t.output,
        "started_at": iso(t.started_at), "ended_at": iso(t.ended_at),
    }


async def create_conversation(request: Request) -> Response:
    body = await read_json(request, CreateConversation)
    record = await _conversations(request).create(body.agent, body.title, body.metadata)
    return JSONResponse(conversation_json(record), status_code=201)


async def list_conversations(request: Request) -> Response:
    limit, cursor = page_params(request)
    q = request.query_params
    status = q.get("status")
    if status is not None and status not in CONVERSATION_STATUSES:
        raise RequestError("status must be idle, busy or waiting")
    archived = q.get("archived", "false")
    if archived not in ("true", "false"):
        raise RequestError("archived must be true or false")
    records = await _records(request).conversations(
        agent=q.get("agent"), digest=q.get("digest"), status=cast(ConversationStatus | None, status),
        archived=archived == "true", limit=limit + 1, after=cursor,
    )
    return JSONResponse(page([conversation_json(r) for r in records], limit, lambda c: c["id"]))


async def get_conversation(request: Request) -> Response:
    record = await _conversations(request).get(request.path_params["id"])
    return JSONResponse(await _with_turns(request, record))


async def _with_turns(request: Request, record: ConversationRecord) -> dict[str, Any]:
    """A conversation as GET answers it: with the digest of every turn."""
    body = conversation_json(record)
    turns = await _records(request).turns(record.id)
    body["turns"] = [{"id": t.id, "digest": t.digest, "status": t.status} for t in turns]
    return body


async def update_conversation(request: Request) -> Response:
    body = await read_json(request, UpdateConversation)
    if not body.model_fields_set:
        raise RequestError("give at least one of title, metadata, archived")
    record = await _conversations(request).update(request.path_params["id"],
                                                  **body.model_dump(include=body.model_fields_set))
    return JSONResponse(await _with_turns(request, record))


async def fork_conversation(request: Request) -> Response:
    body = await read_json(request, ForkConversation)
    record = await _conversations(request).fork(request.path_params["id"], before_turn_id=body.before_turn_id,
                                                agent=body.agent, title=body.title)
    return JSONResponse(conversation_json(record) | {"turns": []}, status_code=201)  # GET's shape


async def delete_conversation(request: Request) -> Response:
    await _conversations(request).delete(request.path_params["id"])
    return Response(status_code=204)


async def send_message(request: Request) -> Response:
    conversations = _conversations(request)
    body = await read_json(request, SendMessage)
    key = request.headers.get("idempotency-key") or None
    if key is not None and len(key) > 255:
        raise RequestError("Idempotency-Key is longer than 255 characters")
    try:
        turn = await conversations.send(request.path_params["id"], body.content,
                                        if_busy=body.if_busy, idempotency_key=key)
    except Steered as steered:  # into the running turn: it answers, this request does not wait for it
        return JSONResponse({"turn_id": steered.turn_id}, status_code=202)
    if not body.stream:  # the result, or at once (202) what the turn waits on
        answer = await waits.answer(conversations, turn)
        return JSONResponse(answer.to_json(), status_code=202 if isinstance(answer, waits.Waiting) else 200)
    events = conversations.events(turn.record.conversation_id, after=max(turn.started_seq - 1, 0),
                                  until_turn=turn.id)
    return sse_response(_frames(events, turn.id), request.app.state.service.metrics)


async def get_context(request: Request) -> Response:
    """What the conversation's next model request will carry (window, tokens used and their source)."""
    return JSONResponse(await _conversations(request).context(request.path_params["id"]))


async def compact(request: Request) -> Response:
    """Compact the conversation's context now."""
    return JSONResponse(await _conversations(request).compact(request.path_params["id"]))


async def _frames(events: AsyncIterator[EventRecord | None],
                  until_turn: str | None = None) -> AsyncIterator[bytes]:
    """SSE frames of a conversation's events; they end cleanly only after `until_turn`'s terminal event.
    Events that stop before it (the server stops; for a conversation's stream, which has no end, at
    any time) break the stream off, so a client cannot take it for finished (§8)."""
    async for record in events:
        if record is None:
            yield KEEP_ALIVE
            continue
        event = record.event
        yield sse_frame(event.name, event.to_json(), record.seq)
        if until_turn is not None and ends(event, until_turn):
            return
    raise BrokenOff


async def list_messages(request: Request) -> Response:
    service = request.app.state.service
    record = await service.conversations.get(request.path_params["id"])
    limit, cursor = page_params(request, default=100)
    after = _int_cursor(cursor)
    rows = await service.records.messages(record.id, limit=limit + 1, after=after)
    items = [{"seq": r.seq, "turn_id": r.turn_id, "created_at": iso(r.created_at), **r.message.to_json()}
             for r in rows]
    return JSONResponse(page(items, limit, lambda m: m["seq"]))


async def list_turns(request: Request) -> Response:
    service = request.app.state.service
    record = await service.conversations.get(request.path_params["id"])
    limit, cursor = page_params(request)
    turns = await service.records.turns(record.id, limit=limit + 1, after=cursor)
    return JSONResponse(page([turn_json(t) for t in turns], limit, lambda t: t["id"]))


async def conversation_events(request: Request) -> Response:
    conversations = _conversations(request)
    record = await conversations.get(request.path_params["id"])
    after = _int_cursor(request.headers.get("last-event-id") or request.query_params.get("after"))
    return sse_response(_frames(conversations.events(record.id, after=after)),
                        request.app.state.service.metrics)


async def interrupt(request: Request) -> Response:
    turn_id = await _conversations(request).interrupt(request.path_params["id"])
    return JSONResponse({"interrupted": turn_id is not None, "turn_id": turn_id})


def _int_cursor(raw: str | None) -> int:
    if not raw:
        return 0
    try:
        value = int(raw)
    except ValueError:
        raise RequestError("event and message cursors are integers") from None
    if value < 0:
        raise RequestError("event and message cursors are not negative")
    return value


routes = [
    Route("/v1/conversations", create_conversation, methods=["POST"]),
    Route("/v1/conversations", list_conversations, methods=["GET"]),
    Route("/v1/conversations/{id}", get_conversation, methods=["GET"]),
    Route("/v1/conversations/{id}", update_conversation, methods=["PATCH"]),
    Route("/v1/conversations/{id}", delete_conversation, methods=["DELETE"]),
    Route("/v1/conversations/{id}/fork", fork_conversation, methods=["POST"]),
    Route("/v1/conversations/{id}/messages", send_message, methods=["POST"]),
    Route("/v1/conversations/{id}/context", get_context, methods=["GET"]),
    Route("/v1/conversations/{id}/compact", compact, methods=["POST"]),
    Route("/v1/conversations/{id}/messages", list_messages, methods=["GET"]),
    Route("/v1/conversations/{id}/turns", list_turns, methods=["GET"]),
    Route("/v1/conversations/{id}/events", conversation_events, methods=["GET"]),
    Route("/v1/conversations/{id}/interrupt", interrupt, methods=["POST"]),
]
