"""What the surfaces read of conversations: the list, each one's turns, its transcript, its permission audit.

The read side of the run stage. HTTP and MCP read through it (and change
things through `Conversations`), never through the store: the store stays
the runtime's port, whose shape the surfaces do not depend on. Each read is
one store read, answered as the store gives it; lists are keyset-paginated
as the store's are (`after` is the last id or seq seen, and a caller that
wants to know whether a next page exists asks for `limit + 1`).

Not responsible for checking that a conversation exists (`Conversations.get`)
nor for rendering what it returns (the surfaces).
"""

from __future__ import annotations

from ..statuses import ConversationStatus
from ..store.base import ConversationRecord, MessageRecord, PermissionRecord, Store, TurnRecord

EVERY_TURN = 10_000  # as many turns as a conversation's GET shows


class Records:
    def __init__(self, store: Store):
        self.store = store

    async def conversations(self, *, agent: str | None, digest: str | None, status: ConversationStatus | None,
                            archived: bool, limit: int, after: str | None) -> list[ConversationRecord]:
        """Newest first; archived ones only when `archived`, else only the others."""
        return await self.store.list_conversations(agent=agent, digest=digest, status=status, limit=limit,
                                                   after=after, archived=archived)

    async def turns(self, conversation_id: str, *, limit: int = EVERY_TURN,
                    after: str | None = None) -> list[TurnRecord]:
        """Oldest first."""
        return await self.store.list_turns(conversation_id, limit=limit, after=after)

    async def messages(self, conversation_id: str, *, limit: int, after: int) -> list[MessageRecord]:
        """The transcript, oldest first, after seq `after`."""
        return await self.store.list_messages(conversation_id, limit=limit, after=after)

    async def permissions(self, conversation_id: str) -> list[PermissionRecord]:
        """Every permission request of the conversation and how it was decided (the audit trail)."""
        return await self.store.list_permissions(conversation_id)
