"""The status strings of turns, conversations and permission requests, as types.

They are public (§5, §8: `GET …/turns`, `GET /v1/conversations?status=`,
the permission audit) and stored as text; a `Literal` lets a checker catch a
misspelt one where a record is built or a status compared. The tuples list
each type's values, for the places that test membership at run time.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

# A turn runs, waits on a person's decision (`permission: ask`), or has ended one of three ways.
TurnStatus = Literal["running", "waiting", "completed", "failed", "cancelled"]
EndedStatus = Literal["completed", "failed", "cancelled"]
ENDED_STATUSES: Final[tuple[EndedStatus, ...]] = get_args(EndedStatus)

# A conversation is idle, busy with a turn, or waiting (its turn waits on a person).
ConversationStatus = Literal["idle", "busy", "waiting"]
CONVERSATION_STATUSES: Final[tuple[ConversationStatus, ...]] = get_args(ConversationStatus)

# A permission request: `cancelled` when its turn ended before anyone answered.
PermissionStatus = Literal["pending", "allowed", "denied", "expired", "cancelled"]
DECIDED: Final[tuple[PermissionStatus, ...]] = ("allowed", "denied")  # a person answered it
