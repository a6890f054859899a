"""How a fork shares its source's messages instead of copying them (CONTRACT §10), in both stores.

A conversation's row names where the start of its transcript lives:
`shares_from` (a conversation) and `shared_upto` (a seq). Its messages
numbered up to `shared_upto` are that conversation's messages with the same
numbers (which may in turn be shared from further up), and its own rows are
numbered after them. A conversation that shares nothing has NULL and 0 and
holds all its rows. So a fork costs one row whatever the transcript's length,
and its numbering is its source's: a fork's message n is its source's message
n, which keeps every seq a compacted view or a client saw meaningful.

Reading a transcript walks the chain (the conversation, what it shares from,
what that shares from ...: a few rows) and reads each link's rows in its
range, oldest link first: `segments`.

A fork is made at the source's last message before the first message of a
turn it leaves out (a turn still running, or the cut turn and those after):
a conversation's turns run one at a time, so what a fork leaves out is the
end of the transcript. Its row points at the link of the chain that holds
that message (not at the source when the source's own rows start later), so
a fork of a fork that added nothing adds no link. A chain is as long as the
line of forks that each added messages before being forked again.

Deleting a conversation that forks share from hands its rows to the fork
that needs the most of them (`UPDATE` of their conversation id: nothing is
copied, the storage does not grow), which takes over its place in the chain
(its `shares_from`, `shared_upto`); the other forks then share from that one.
The rows no fork needs go with the conversation. The price is that the
hand-over rewrites each handed row once (the delete of a conversation with
forks writes what they share). The alternatives were worse:
copying the prefix into each fork on delete costs what forking must not, and
keeping a deleted conversation's row as a tombstone would make every read of
conversations (lists, admission, recovery) tell the tombstones apart.
"""

from __future__ import annotations

from collections.abc import Sequence

# (conversation whose rows to read, after this seq, up to this seq; None: no upper bound)
Segment = tuple[str, int, int | None]
CHAIN_LIMIT = 10_000  # a chain longer than this is a bug (a cycle): the walk stops there


def chain_sql(param: str) -> str:
    """The chain of the conversation `param` names, from itself up: (id, shares_from, shared_upto) rows."""
    return (
        "WITH RECURSIVE chain (id, base, upto, depth) AS ("
        f" SELECT id, shares_from, shared_upto, 0 FROM conversations WHERE id = {param}"
        " UNION ALL SELECT c.id, c.shares_from, c.shared_upto, chain.depth + 1"
        f" FROM chain JOIN conversations c ON c.id = chain.base WHERE chain.depth < {CHAIN_LIMIT})"
        " SELECT id, base, upto FROM chain ORDER BY depth"
    )


def segments(chain: Sequence[tuple[str, str | None, int]]) -> list[Segment]:
    """Where a transcript's messages are, oldest first, from its chain: (id, shares_from, shared_upto)
    rows from the conversation itself up to the first that shares nothing. Empty ranges are left out."""
    found: list[Segment] = []
    upper: int | None = None
    for conversation_id, _, upto in chain:
        if upper is None or upper > upto:
            found.append((conversation_id, upto, upper))
        upper = upto if upper is None else min(upper, upto)
    found.reverse()
    return found


def fork_base(chain: Sequence[tuple[str, str | None, int]], point: int) -> tuple[str | None, int]:
    """What a fork at `point` (its last shared seq) shares from: the link of the source's chain whose own
    rows hold that message, and `point`; nothing (None, 0) when `point` is 0."""
    if point <= 0:
        return None, 0
    for conversation_id, _, upto in chain:
        if point > upto:
            return conversation_id, point
    raise AssertionError("the chain's last link shares nothing: it holds every seq above 0")


def heir_place(shares_from: str | None, shared_upto: int, heir_upto: int) -> tuple[str | None, int]:
    """Where the heir of a deleted conversation (which shared `shares_from` up to `shared_upto`) shares
    from once it holds the rows it shared from it (those up to `heir_upto`): the deleted one's place,
    unless the heir shared less than that (a fork made before forks shared can), then only its own."""
    upto = min(shared_upto, heir_upto)
    return (shares_from if upto > 0 else None), upto


# A fork made before version 9 holds a copy of its source's transcript (numbered as the source's) up to
# its fork point, then its own messages: the rows equal to the source's, from 1, become shared, and go.
# Every fork's point is found before any row goes (a source may itself be a fork with a copy).
# Written for both stores (each store's `migrations` runs them).
SHARE_COPIES = (
    "UPDATE conversations SET shares_from = forked_from_conversation, shared_upto = COALESCE(("
    " SELECT MIN(f.seq) FROM messages f WHERE f.conversation_id = conversations.id AND NOT EXISTS ("
    " SELECT 1 FROM messages s WHERE s.conversation_id = conversations.forked_from_conversation"
    " AND s.seq = f.seq AND s.turn_id = f.turn_id AND s.body = f.body AND s.created_at = f.created_at"
    " )) - 1, (SELECT MAX(seq) FROM messages WHERE conversation_id = conversations.id), 0)"
    " WHERE forked_from_conversation IN (SELECT id FROM conversations)",
    "UPDATE conversations SET shares_from = NULL WHERE shared_upto = 0",
    "DELETE FROM messages WHERE conversation_id IN (SELECT id FROM conversations WHERE shared_upto > 0)"
    " AND seq <= (SELECT shared_upto FROM conversations c WHERE c.id = messages.conversation_id)",
)
