"""`ListTasks`: an agent's turns, newest first, filtered and paged as A2A asks.

With a `contextId`, the turns of that conversation; without, the turns of
the agent's newest `MAX_CONVERSATIONS` conversations (an A2A client that
wants older ones names their context). The page token is an offset into
that list, as text.
"""

from __future__ import annotations

from collections.abc import Callable

from a2a.types.a2a_pb2 import ListTasksRequest, ListTasksResponse, Task
from a2a.utils.constants import DEFAULT_LIST_TASKS_PAGE_SIZE, MAX_LIST_TASKS_PAGE_SIZE

from ..errors import RequestError
from ..service import Service
from ..store.base import TurnRecord
from .tasks import STATUSES

MAX_CONVERSATIONS = 100
MAX_TURNS = 10_000  # of one conversation


async def turns(service: Service, agent: str, context_id: str | None) -> list[TurnRecord]:
    """The agent's turns (of one context, or of its newest conversations), newest first."""
    if context_id:
        conversation = await service.conversations.get(context_id)
        if conversation.agent_name != agent:
            raise RequestError(f"context {context_id} belongs to agent {conversation.agent_name}")
        ids = [conversation.id]
    else:
        ids = [c.id for c in await service.store.list_conversations(agent=agent, limit=MAX_CONVERSATIONS)]
    found: list[TurnRecord] = []
    for conversation_id in ids:
        found += await service.store.list_turns(conversation_id, limit=MAX_TURNS)
    return sorted(found, key=lambda t: (t.ended_at or t.started_at, t.id), reverse=True)


def page(records: list[TurnRecord], params: ListTasksRequest,
         as_task: Callable[[TurnRecord], Task]) -> ListTasksResponse:
    size = params.page_size or DEFAULT_LIST_TASKS_PAGE_SIZE
    if not 0 < size <= MAX_LIST_TASKS_PAGE_SIZE:
        raise RequestError(f"pageSize is between 1 and {MAX_LIST_TASKS_PAGE_SIZE}")
    try:
        start = int(params.page_token or 0)
    except ValueError:
        raise RequestError("pageToken is not one this server gave") from None
    if params.status:
        wanted = STATUSES.get(params.status)
        records = [r for r in records if r.status == wanted]
    if params.HasField("status_timestamp_after"):
        after = params.status_timestamp_after.ToNanoseconds() / 1e9
        records = [r for r in records if (r.ended_at or r.started_at) > after]
    chosen = records[start:start + size]
    more = start + size < len(records)
    return ListTasksResponse(tasks=[as_task(r) for r in chosen], page_size=size, total_size=len(records),
                             next_page_token=str(start + size) if more else "")
