"""Conversations: the runtime's face to the surfaces (HTTP, MCP, the OpenAI route, the console).

Responsible for the conversations themselves (create, read, update its
title, metadata and archived flag, fork, delete), and for what a request
asks of one: `send` a message (validated; steered into the running turn
under `if_busy: steer`, `steering`; else a new turn, once per
Idempotency-Key, `idempotency`), `interrupt` its turn wherever it runs, read
a turn's `result` and its `events`, and its context (`context`, `compact`,
§10). Each of those is a line or two over the collaborator that owns it,
all given by the composition root (`server.service`).

Not responsible for a turn's lifecycle (`turn_lifecycle`: admitted, begun,
run, ended once), what a turn does (`turn_runner`, `loop`), how it is built
(`plans`), or which definitions are current (`registry`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import anyio

from ..deployment import canaries
from ..deployment.registry import Registry, split_ref
from ..errors import ConversationBusy, ConversationNotFound, RequestError, StorageError, TurnNotFound
from ..ids import new_id
from ..messages import Message
from ..store.base import ConversationRecord, EventRecord, Store, TurnRecord
from .active_turn import ActiveTurn, TurnResult
from .admission import Admission
from .bounds import waited
from .context import Contexts
from .elsewhere import TurnsElsewhere
from .idempotency import IdempotencyKeys, request_digest
from .plans import Runtime
from .steering import Steering
from .streams import EventStreams
from .structured import OutputSchema
from .turn_lifecycle import TurnLifecycle
from .turn_results import TurnResults

log = logging.getLogger("corral.conversations")


@dataclass(kw_only=True, eq=False)
class Conversations:
    """What the surfaces ask of conversations, over the collaborators that do it."""

    store: Store
    registry: Registry
    runtime: Runtime
    admission: Admission
    keys: IdempotencyKeys
    steering: Steering
    turns: TurnLifecycle
    elsewhere: TurnsElsewhere
    streams: EventStreams
    results: TurnResults
    contexts: Contexts

    # --- this replica's turns --------------------------------------------------

    @property
    def accepting(self) -> bool:
        """Whether new turns are let in (False once the server stops)."""
        return self.turns.accepting

    @accepting.setter
    def accepting(self, value: bool) -> None:
        self.turns.accepting = value

    async def run(self, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """Own the task group turns run in, until cancelled."""
        await self.turns.run(task_status)

    def running_turns(self) -> list[ActiveTurn]:
        return self.turns.running_turns()

    async def drain(self, grace_s: float, *, hand_off: bool = False) -> None:
        """See `TurnLifecycle.drain`."""
        await self.turns.drain(grace_s, hand_off=hand_off)

    async def resume(self, turn: TurnRecord, fence: int) -> None:
        """Run the next attempt of a turn this replica took over (its replica stopped or died)."""
        await self.turns.resume(await self.get(turn.conversation_id), turn, fence)

    def on_notice(self, notice: dict[str, Any]) -> None:
        """A replica's notice: a message steered into a turn running here, or a resync."""
        self.steering.on_notice(notice)
        if notice.get("t") == "resync":  # what this replica knows of every conversation's view may be stale
            self.contexts.forget()

    # --- conversations -------------------------------------------------------

    async def create(self, agent: str, title: str | None, metadata: dict[str, Any],
                     history: Sequence[Message] = ()) -> ConversationRecord:
        """A new conversation; `history`: messages it begins with (the OpenAI route's earlier ones)."""
        if title is not None and "\x00" in title:
            raise RequestError("the title must not contain NUL characters")
        drawn = await canaries.draw(self.store, agent)  # an alias with a canary: pinned to the side drawn
        agent = drawn.ref if drawn is not None else agent
        closure = await self.registry.resolve(agent)
        now = time.time()
        record = ConversationRecord(
            id=new_id("conv"), agent=agent, agent_name=closure.agent.name, digest=closure.agent.digest,
            pinned=split_ref(agent)[1] is not None, title=title, metadata=metadata,
            status="idle", created_at=now, updated_at=now,
        )
        await self.store.create_conversation(record)
        if history:
            await self.store.append_messages(record.id, "", list(history), time.time())
        if drawn is not None:
            await drawn.record(self.store, record.id)
        return record

    async def get(self, conversation_id: str) -> ConversationRecord:
        record = await self.store.get_conversation(conversation_id)
        if record is None:
            raise ConversationNotFound(f"no conversation {conversation_id!r}",
                                       details={"conversation_id": conversation_id})
        return record

    async def update(self, conversation_id: str, **fields: Any) -> ConversationRecord:
        """Rename, replace the metadata, archive or unarchive (`fields`: title, metadata, archived)."""
        title = fields.get("title")
        if title is not None and "\x00" in title:
            raise RequestError("the title must not contain NUL characters")
        if not await self.store.update_conversation(conversation_id, now=time.time(), **fields):
            raise ConversationNotFound(f"no conversation {conversation_id!r}",
                                       details={"conversation_id": conversation_id})
        return await self.get(conversation_id)

    async def fork(self, conversation_id: str, *, before_turn_id: str | None = None, agent: str | None = None,
                   title: str | None = None) -> ConversationRecord:
        """A new conversation holding the transcript up to (not including) `before_turn_id`, or all of it.

        Only turns that ended are shared (a running turn's messages are not), and no turn or event:
        the fork starts with an empty event log (see `Store.fork_conversation`). It runs on `agent`
        (any reference, resolved as at creation), else on the source's reference as it was asked
        for (a pinned source's fork stays pinned); it keeps the source's metadata, and its title
        unless one is given; it is not archived. `forked_from` names the source and the turn.
        """
        if title is not None and "\x00" in title:
            raise RequestError("the title must not contain NUL characters")
        source = await self.get(conversation_id)
        if before_turn_id is not None:
            turn = await self.store.get_turn(before_turn_id)
            if turn is None or turn.conversation_id != source.id:
                raise _turn_not_found(source.id, before_turn_id)
        ref = agent or source.agent
        closure = await self.registry.resolve(ref)
        now = time.time()
        record = ConversationRecord(
            id=new_id("conv"), agent=ref, agent_name=closure.agent.name, digest=closure.agent.digest,
            pinned=split_ref(ref)[1] is not None, title=source.title if title is None else title,
            metadata=source.metadata, status="idle", created_at=now, updated_at=now,
            forked_from={"conversation_id": source.id, "turn_id": before_turn_id},
        )
        if not await self.store.fork_conversation(source.id, record, before_turn_id):
            await self.get(source.id)  # deleted meanwhile: conversation_not_found
            raise _turn_not_found(source.id, before_turn_id or "")
        return record

    async def delete(self, conversation_id: str) -> None:
        holder = await self.admission.holder(conversation_id)
        if holder is not None:
            raise ConversationBusy("the conversation has a turn running; interrupt it first",
                                   details={"turn_id": holder.turn_id})
        if not await self.store.delete_conversation(conversation_id):
            raise ConversationNotFound(f"no conversation {conversation_id!r}")
        await self.forget(conversation_id)
        try:  # the other replicas' hooks may have a transcript file of it too
            await self.store.notify({"t": "deleted", "c": conversation_id})
        except StorageError as exc:  # it is deleted all the same: a file left behind is all that is lost
            log.warning("replicas were not told conversation %s was deleted: %s", conversation_id, exc)

    async def forget(self, conversation_id: str) -> None:
        """Remove what this replica keeps of a deleted conversation outside the store: the transcript
        file hooks read (`transcript_path`)."""
        await self.runtime.forget_transcript(conversation_id)

    # --- a message, a turn ---------------------------------------------------

    async def send(self, conversation_id: str, text: str, *, if_busy: str | None = None,
                   idempotency_key: str | None = None, output: OutputSchema | None = None) -> ActiveTurn:
        """Start a turn (or find the one this idempotency key started); returns once it is begun.

        `output`: the JSON this turn's answer must be, instead of the agent's `output_schema` (the
        OpenAI route's `response_format`); held in memory only, so a turn resumed elsewhere after a
        crash runs on the agent's own."""
        if "\x00" in text:  # no store keeps it as text (PostgreSQL refuses it), and no model reads it
            raise RequestError("the message must not contain NUL characters")
        conversation = await self.get(conversation_id)
        self.turns.check_open()
        asked = request_digest(text, if_busy) if idempotency_key else None
        if if_busy == "steer" or (if_busy is None and await self.steering.wanted(conversation)):
            if not idempotency_key or not await self.keys.known(conversation_id, idempotency_key):
                # raises Steered, unless no turn runs to take it
                await self.steering.steer(conversation, text, idempotency_key, asked)
            if_busy = "enqueue"  # a turn of its own, as `enqueue` would start it
        if not idempotency_key or not asked:
            return await self.turns.start(conversation, text, if_busy, output=output)
        start = partial(self.turns.start, conversation, text, if_busy, idempotency_key, asked, output)
        return await self.keys.once(conversation_id, idempotency_key, asked, start=start, stored=self._found)

    async def _found(self, turn: TurnRecord) -> ActiveTurn:
        return await self.elsewhere.found(turn, self.turns.tg)

    async def interrupt(self, conversation_id: str) -> str | None:
        """Cancel the running turn, on whichever replica it runs; returns its id, or None when idle."""
        await self.get(conversation_id)
        turn = self.admission.running(conversation_id)
        if turn is not None:
            turn.cancel()
            with waited(10, f"turn {turn.id} was told to stop but has not ended", turn_id=turn.id):
                await turn.done.wait()
            return turn.id
        holder = await self.admission.holder(conversation_id)
        if holder is None:
            return None
        await self.admission.cancel(holder)
        with waited(10, f"turn {holder.turn_id} was told to stop but has not ended", turn_id=holder.turn_id):
            await self.elsewhere.ended(conversation_id, holder.turn_id)
        return holder.turn_id

    async def result(self, turn: ActiveTurn) -> TurnResult:
        """The answer of a turn, once it has ended (see `TurnResults.result`)."""
        return await self.results.result(turn)

    def events(self, conversation_id: str, after: int = 0,
               until_turn: str | None = None) -> AsyncIterator[EventRecord | None]:
        """See `EventStreams.events`."""
        return self.streams.events(conversation_id, after, until_turn)

    # --- context (§10) -----------------------------------------------------------

    async def context(self, conversation_id: str, known: ConversationRecord | None = None) -> dict[str, Any]:
        """What the conversation's next model request will carry: window, tokens used and their source
        (`known`: the conversation's record, already read by the caller)."""
        conversation = known if known is not None and known.id == conversation_id else await self.get(
            conversation_id)
        closure = await self.registry.resolve(conversation.agent)
        return await self.contexts.usage(conversation.id, closure)

    async def compact(self, conversation_id: str) -> dict[str, Any]:
        """Compact the conversation's context now (under the threshold too); 409 while a turn runs.

        The compaction holds the conversation as a turn would (no turn starts meanwhile), and commits
        its view with its `context.compacted` event under that hold."""
        conversation = await self.get(conversation_id)
        closure = await self.registry.resolve(conversation.agent)
        async with self.admission.holding(conversation.id, new_id("compact")) as (holder, fence):
            return await self.contexts.compact_now(conversation.id, closure, holder, fence)


def _turn_not_found(conversation_id: str, turn_id: str) -> TurnNotFound:
    return TurnNotFound(f"conversation {conversation_id!r} has no turn {turn_id!r}",
                        details={"conversation_id": conversation_id, "turn_id": turn_id})
