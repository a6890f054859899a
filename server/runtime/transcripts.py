"""Recent conversations' transcripts, kept so a turn need not decode its whole history again.

Not responsible for what a request carries of it (`context`) or for writing it (the store).
"""

from __future__ import annotations

from collections import OrderedDict

from ..messages import Message
from ..store.base import ConversationStore


class Transcripts:
    """Recent conversations' transcripts, so a turn need not decode its whole history again.

    The store stays the source of truth: each use fetches what was appended after the last
    message seen (by this process or any other), so the cache is never stale, only shorter.
    """

    SIZE = 1000

    def __init__(self, store: ConversationStore):
        self.store = store
        # conversation -> (last seq, messages, the index of each turn's first message, the last turn id)
        self._cache: OrderedDict[str, tuple[int, list[Message], list[int], str | None]] = OrderedDict()

    async def history(self, conversation_id: str) -> list[Message]:
        last, messages, starts, turn = self._cache.pop(conversation_id, (0, [], [], None))
        while True:
            page = await self.store.list_messages(conversation_id, after=last, limit=1000)
            for record in page:
                if record.turn_id != turn:
                    starts.append(len(messages))
                    turn = record.turn_id
                messages.append(record.message)
            last = page[-1].seq if page else last
            if len(page) < 1000:
                break
        self._cache[conversation_id] = (last, messages, starts, turn)
        if len(self._cache) > self.SIZE:
            self._cache.popitem(last=False)
        return list(messages)

    def turn_starts(self, conversation_id: str) -> list[int] | None:
        """Where each turn begins in the history `history` last returned (None: not cached here)."""
        cached = self._cache.get(conversation_id)
        return cached[2] if cached is not None else None
