"""Steering (`if_busy: steer`, contract §10): a message sent to the turn that is running.

The message first passes the agent's `user_prompt_submit` hooks, as any
prompt does (one a hook blocks is refused with `prompt_blocked` and stored
nowhere; the context hooks add goes with it). It then waits in the store
for the turn (on whichever replica) to pick it up before its next model
request (`TurnRunner._steered`); the replica running it is told at once.
With an Idempotency-Key the key is recorded with the message, so a retry
answers the same turn and adds nothing.

A turn that ends without picking its messages up leaves each one a turn of
its own, in the order they came (`left_over`); whatever goes wrong there
is logged and never reaches the task group every turn runs in.

Not responsible for running turns: `Conversations` passes how to start one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from anyio.abc import TaskGroup

from ..deployment.registry import Registry
from ..errors import IdempotencyKeyReused
from ..store.base import ContextStore, ConversationRecord, TurnJournal
from ..tools.base import ToolContext
from .admission import Admission
from .loop import submitted
from .plans import Runtime
from .turn_runner import TurnRunner

log = logging.getLogger("corral.steering")

Send = Callable[[str, str], Awaitable[Any]]  # (conversation id, text): a turn of its own, enqueued


class Steers(ContextStore, TurnJournal, Protocol):
    """The store's ports steering uses: the steered messages, and the turn they are steered into."""


class Steered(Exception):
    """`if_busy: steer`: the message went to the running turn `turn_id` (HTTP answers 202)."""

    def __init__(self, conversation: ConversationRecord, turn_id: str):
        super().__init__(turn_id)
        self.conversation_id = conversation.id
        self.digest = conversation.digest
        self.turn_id = turn_id


class Steering:
    def __init__(self, store: Steers, registry: Registry, runtime: Runtime, runner: TurnRunner,
                 admission: Admission, ttl_s: float):
        self.store = store
        self.registry = registry
        self.runtime = runtime
        self.runner = runner
        self.admission = admission
        self.ttl_s = ttl_s  # how long an Idempotency-Key is remembered

    async def wanted(self, conversation: ConversationRecord) -> bool:
        """Whether the conversation's agent steers a message sent while it is busy (`on_busy: steer`)."""
        return (await self.registry.resolve(conversation.agent)).agent.on_busy == "steer"

    async def steer(self, conversation: ConversationRecord, text: str, key: str | None = None,
                    asked: str | None = None) -> None:
        """Add the message to the running turn (raise `Steered`); return when no turn runs to take it.

        A turn that ended meanwhile, without picking it up, leaves it to this request, which then
        starts a turn of its own (under its key, which no longer names a steered message).
        """
        if key is not None:
            await self._recorded(conversation, key, asked)
        holder = await self.admission.holder(conversation.id)
        if holder is None or not holder.turn_id.startswith("turn_"):  # idle, or a compaction
            return
        content = await self._prompt(conversation, holder.turn_id, text)
        now = time.time()
        steer_id = await self.store.add_steer(conversation.id, holder.turn_id, content, now, key=key,
                                              request=asked, since=now - self.ttl_s)
        if steer_id is None:  # a duplicate of this request recorded the key first
            assert key is not None
            await self._recorded(conversation, key, asked)
            raise Steered(conversation, holder.turn_id)
        if holder.replica == self.store.replica:
            self.runner.steered.add(holder.turn_id)  # after the row: a turn that looks finds it
        else:
            await self.store.notify({"t": "steer", "c": conversation.id, "turn": holder.turn_id,
                                     "to": holder.replica})
        still = await self.admission.holder(conversation.id)
        if (still is None or still.turn_id != holder.turn_id) and await self.store.drop_steers(
                conversation.id, holder.turn_id, steer_id):
            return  # it ended before taking the message
        raise Steered(conversation, holder.turn_id)

    async def _recorded(self, conversation: ConversationRecord, key: str, asked: str | None) -> None:
        """A message steered under `key` already: raise `Steered` naming its turn (or, for another
        request under the same key, `idempotency_key_reused`)."""
        found = await self.store.steer_key(conversation.id, key, time.time() - self.ttl_s)
        if found is None:
            return
        turn_id, request = found
        if request is not None and request != asked:
            raise IdempotencyKeyReused("this Idempotency-Key was used with a different request body",
                                       details={"turn_id": turn_id})
        raise Steered(conversation, turn_id)

    async def _prompt(self, conversation: ConversationRecord, turn_id: str, text: str) -> str:
        """The message past the hooks of the running turn's agent, as its prompt would pass them."""
        turn = await self.store.get_turn(turn_id)
        ref = f"{turn.agent}@{turn.digest}" if turn is not None else conversation.agent
        closure = await self.registry.resolve(ref)
        context = ToolContext(conversation_id=conversation.id, turn_id=turn_id, agent=closure.agent.name,
                              digest=closure.agent.digest, root=closure.root, environ=self.runtime.environ,
                              files=self.runtime.files)
        hooks = self.runtime.hooks(closure, context)
        return text if hooks is None else await submitted(hooks, text)

    def left_over(self, conversation_id: str, turn_id: str, tg: TaskGroup | None, send: Send) -> None:
        """A turn that ended here: the messages steered into it that it did not pick up each start a
        turn of their own, in order. (Several replicas: a notice may be late, so the store is asked.)"""
        if turn_id not in self.runner.steered and self.store.embedded:
            return
        self.runner.steered.discard(turn_id)
        if tg is not None:
            tg.start_soon(self._turns, conversation_id, turn_id, send)

    async def _turns(self, conversation_id: str, turn_id: str, send: Send) -> None:
        try:
            left = await self.store.drop_steers(conversation_id, turn_id)
        except Exception as exc:  # the task group every turn runs in must not end
            log.error("could not read the messages steered into turn %s: %s", turn_id, exc)
            return
        for content in left:
            try:
                await send(conversation_id, content)
            except Exception as exc:  # as above; the next message still gets its turn
                log.error("a message steered into turn %s of conversation %s was lost: %s", turn_id,
                          conversation_id, getattr(exc, "message", exc))

    def on_notice(self, notice: dict[str, Any]) -> None:
        """A replica's notice: a message steered into a turn running here, or a resync."""
        if notice.get("t") == "steer" and notice.get("to") == self.store.replica:
            self.runner.steered.add(str(notice.get("turn")))
        elif notice.get("t") == "resync":  # notices may have been lost: every turn here looks
            self.runner.steered.update(turn.id for turn in self.admission.running_turns())
            self.runner.contexts.forget()
