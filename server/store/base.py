"""The store's ports, by role, and `Store`, all of them: everything that must survive a restart.

Conversations, their turns (each with the agent digest it ran on), the
transcript, the event log with per-conversation sequence numbers (what SSE
replays with `Last-Event-ID`), idempotency keys, and every definition spec
ever served (content-addressed, so a pinned digest resolves after edits and
restarts).

A store is responsible for atomicity of each call and for ordering
(sequence numbers strictly increasing within a conversation). It is not
responsible for busy/idle state in memory, for fan-out to live subscribers,
or for deciding what a turn does.

Lists are keyset-paginated: `after` is the last id/seq the caller saw, and
the caller asks for `limit + 1` rows to know whether there is a next page.

Several replicas share one store (PostgreSQL), so the store also decides who
runs a conversation's turn: `admit` puts a turn in the conversation's queue
(or refuses it under `reject`), `claim` makes the head of the queue the
conversation's holder under a lease with a fencing token, `release` lets the
next one in, and `renew_leases` (each replica's heartbeat) keeps a live
replica's leases; `recover_lapsed` ends the turns of a replica whose lease
lapsed. `notify`/`subscribe` carry small JSON notices between replicas
(PostgreSQL's LISTEN/NOTIFY); a store sends some itself, in the transaction
that makes them true (see `Notice`). The embedded SQLite store has one
process by design, so its notices go nowhere.

One port per role, each consumer annotated with the ones it uses:
`ConversationStore` (conversations and transcripts), `TurnJournal` (turns,
events, a turn's batched writes), `Coordination` (holders, queues, leases,
replicas), `DefinitionStore` (definitions, files, swaps, aliases),
`PermissionStore` (the audit trail), `ContextStore` (compacted views and
steered messages), `Lifecycle` (open, close, probe). Every port is also
`Notices`: who the store speaks for and what replicas tell each other. The
records are in `records` (re-exported here). Methods only tests use are not
in any port (`tests/support/stores.StoreForTests`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ..errors import DuplicateIdempotencyKey
from ..messages import Message
from ..statuses import ConversationStatus, PermissionStatus
from .evals import AliasRules, EvalRunQuery
from .records import (
    UNSET,
    Admitted,
    Claim,
    ContextView,
    ConversationRecord,
    EventRecord,
    Holder,
    MessageRecord,
    Notice,
    PermissionRecord,
    Recovered,
    ReplicaRecord,
    StoredDefinition,
    StoredFile,
    TurnRecord,
)

__all__ = [  # the records are re-exported: `from server.store.base import TurnRecord` is the usual import
    "UNSET",
    "Admitted",
    "Claim",
    "ContextStore",
    "ContextView",
    "ConversationRecord",
    "ConversationStore",
    "Coordination",
    "DefinitionStore",
    "DuplicateIdempotencyKey",
    "EvalStore",
    "EventRecord",
    "Holder",
    "Lifecycle",
    "MessageRecord",
    "Notice",
    "Notices",
    "PermissionRecord",
    "PermissionStore",
    "Recovered",
    "ReplicaRecord",
    "Store",
    "StoredDefinition",
    "StoredFile",
    "TurnJournal",
    "TurnRecord",
]


class Notices(Protocol):
    """Who the store speaks for, and what replicas tell each other; every port has it."""

    replica: str  # the replica this store speaks for: the "r" of its notices, the owner of its claims
    embedded: bool  # one process by design (SQLite): every lease it finds at start-up has lapsed

    async def notify(self, notice: Notice) -> None: ...  # to every other replica ("r" is added)
    def subscribe(self, handler: Callable[[Notice], None]) -> None: ...


class Lifecycle(Protocol):
    """Opening, closing, and telling whether the store can still commit (`store.health`)."""

    on_failure: Callable[[BaseException], None]  # a write failed: the store may be unwritable

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def probe(self) -> None: ...  # a small write; raises StorageError when it cannot commit


class ConversationStore(Notices, Protocol):
    """Conversations and their transcripts (a fork shares its source's: `forks`)."""

    async def create_conversation(self, conversation: ConversationRecord) -> None: ...
    async def get_conversation(self, conversation_id: str) -> ConversationRecord | None: ...
    async def list_conversations(
        self, *, agent: str | None = None, digest: str | None = None,
        status: ConversationStatus | None = None,
        limit: int = 50, after: str | None = None, archived: bool = False,
    ) -> list[ConversationRecord]: ...  # newest first; `after` is a conversation id; archived or not
    async def update_conversation(self, conversation_id: str, *, title: Any = UNSET, metadata: Any = UNSET,
                                  archived: Any = UNSET, now: float) -> bool: ...
    # ^ sets only the fields given (`UNSET`: left as it is; a title may be None) and `updated_at`;
    # returns whether the conversation exists (nothing given: nothing written)
    async def fork_conversation(self, source_id: str, new: ConversationRecord,
                                before_turn_id: str | None) -> bool: ...
    # ^ one transaction: `new` (its `forked_from` as given), sharing the source's transcript up to the
    # fork point (no message is copied: `forks`): the messages before the first message of the source's
    # turns that have not ended (running, waiting) and, with `before_turn_id`, of that turn and those
    # started after it (by (started_at, id)); messages the source holds from its own fork name no turn
    # of it and are always kept. They keep their seq (numbered from 1), body, `created_at` and
    # `turn_id` (the turn they were written in, so the history still groups by turn); no turn, event,
    # queue entry or permission goes with them: a fork starts with no turns of its own and an empty
    # event log, and its own messages are numbered after the shared ones. Returns False, writing
    # nothing, when the source does not exist or `before_turn_id` is not its turn
    async def delete_conversation(self, conversation_id: str) -> bool: ...  # with its turns, messages, events
    # ^ forks sharing its messages keep them (they pass to one fork: `forks`)
    async def append_messages(self, conversation_id: str, turn_id: str, messages: list[Message],
                              now: float) -> None: ...
    async def list_messages(self, conversation_id: str, *, limit: int = 1000,
                            after: int = 0) -> list[MessageRecord]: ...  # oldest first
    async def turn_messages(self, conversation_id: str, turn_id: str) -> list[MessageRecord]: ...
    # ^ the messages a turn wrote (each, exactly: an index lookup, not a read of the transcript)


class TurnJournal(Notices, Protocol):
    """Turns and the event log, and a turn's writes batched: one transaction each (what a turn commits
    per model step or tool result).

    Fencing: with `fence`, `append`, `end_turn` and `update_turn` (and `Coordination.release`) first
    check that the conversation's holder is still this turn on this replica under that fencing token,
    and raise `LeaseLost` (writing nothing) when it is not.
    """

    async def create_turn(self, turn: TurnRecord) -> None: ...  # raises DuplicateIdempotencyKey
    async def update_turn(self, turn_id: str, *, fence: int | None = None, **changes: Any) -> None: ...
    async def get_turn(self, turn_id: str) -> TurnRecord | None: ...
    async def list_turns(self, conversation_id: str, *, limit: int = 50,
                         after: str | None = None) -> list[TurnRecord]: ...  # oldest first
    async def find_turn_by_key(self, conversation_id: str, key: str, since: float) -> TurnRecord | None: ...
    async def running_turns(self) -> list[TurnRecord]: ...  # running or waiting, on every replica
    async def set_conversation_status(self, conversation_id: str, status: ConversationStatus,
                                      now: float) -> None: ...
    async def list_events(self, conversation_id: str, *, after: int = 0,
                          limit: int = 1000) -> list[EventRecord]: ...
    async def begin_turn(self, turn: TurnRecord, event: tuple[str, dict[str, Any]], now: float) -> int: ...
    # ^ create_turn + the conversation "busy" + the event (its `turn.started`); returns the event's seq
    async def append(self, conversation_id: str, turn_id: str, messages: list[Message],
                     events: list[tuple[str, dict[str, Any]]], now: float,
                     *, fence: int | None = None, usage: dict[str, int] | None = None) -> list[int]: ...
    # ^ messages to the transcript and events to the log, together; returns the events' seqs. `usage`:
    # the turn's usage so far, set with them (a resumed turn's budget starts from it)
    async def end_turn(self, turn_id: str, conversation_id: str, changes: dict[str, Any],
                       event: tuple[str, dict[str, Any]], now: float, *, fence: int | None = None) -> int: ...
    # ^ update_turn(changes) + the event (its ending) + the conversation "idle" + release(turn);
    # returns the event's seq. Notices as their single-write forms send.


class Coordination(Notices, Protocol):
    """Who runs a conversation's turn, across replicas (see the module docstring), and the replicas."""

    async def admit(self, conversation_id: str, turn_id: str, policy: str, now: float, lease_until: float,
                    *, key: str | None = None, request_digest: str | None = None) -> Admitted: ...
    # ^ one transaction, serialized per conversation: `key` (an Idempotency-Key) already named by a
    # queue entry or a turn of the conversation -> `joined`; `reject` with a holder or a queue ->
    # `busy`; `interrupt` marks every queue entry superseded and returns the holder as `cancel`; then
    # the turn joins the queue (position: arrival order across replicas), owned by this replica, the
    # entry's lease `lease_until`; if it is then first and the conversation has no holder, it is
    # claimed in the same transaction (`fence`), as `claim` would
    async def claim(self, conversation_id: str, turn_id: str, now: float, lease_until: float) -> Claim: ...
    # ^ superseded entry -> deleted, `superseded`; no holder and this entry first among those not
    # superseded -> holder = this turn on this replica, fence + 1, lease `lease_until`; else `Claim()`
    async def release(self, conversation_id: str, turn_id: str, *, fence: int | None = None) -> None: ...
    # ^ removes its queue entry, and the holder if it is this turn; a "queue" notice
    async def holder(self, conversation_id: str) -> Holder | None: ...
    async def renew_leases(self, lease_until: float) -> None: ...  # this replica's holders and entries
    async def recover_lapsed(self, now: float, *, starting: bool = False, lease_until: float = 0.0,
                             max_attempts: int = 0) -> list[Recovered]: ...
    # ^ conversations held by another replica whose lease ended before `now` (with `starting`, this
    # replica's own holders too, left by its previous run; an embedded store starting treats every
    # holder as lapsed, whatever its lease says; never this replica's while it runs): the holder's turn,
    # if running/waiting, becomes failed with `interrupted` and gets its `turn.failed` event, its
    # pending permissions are cancelled, the conversation goes idle, the holder is cleared; running or
    # waiting turns of a conversation with no holder are treated alike; queue entries whose lease
    # lapsed are deleted. A turn with fewer than `max_attempts` attempts is not failed but taken
    # over: this replica becomes the holder (fence + 1, lease `lease_until`), its `attempts` grows by
    # one, it gets a `turn.resumed` {turn_id, attempt} event, and its pending permissions stay pending
    async def hand_over(self, conversation_id: str, turn_id: str, fence: int) -> None: ...
    # ^ a replica stopping: the holder's lease lapses now (if `fence` still holds), so another replica
    # (or this one's next start) takes the turn over at once; a "handoff" notice tells the others

    # replicas (GET /v1/replicas)
    async def heartbeat(self, replica: ReplicaRecord) -> None: ...  # insert or update by id
    # heartbeat >= since, by id; running_turns counts the turns each holds now, not its heartbeat's
    async def list_replicas(self, since: float) -> list[ReplicaRecord]: ...
    async def remove_replica(self, replica_id: str) -> None: ...


class DefinitionStore(Notices, Protocol):
    """Every definition ever served and the files they point to (content-addressed, so a pin resolves
    on any replica, after edits and restarts), the swap history and agent aliases."""

    async def save_definitions(self, definitions: list[StoredDefinition]) -> None: ...  # known digests kept
    async def get_definition(self, digest: str) -> StoredDefinition | None: ...
    async def save_files(self, files: list[StoredFile]) -> None: ...  # known digests are skipped
    async def get_file(self, digest: str) -> StoredFile | None: ...
    # swaps: newest first; `after` is a swap id
    async def record_swap(self, swap_id: str, at: float, status: str, report: dict[str, Any]) -> None: ...
    async def list_swaps(self, *, limit: int = 50, after: str | None = None) -> list[dict[str, Any]]: ...
    async def get_swap(self, swap_id: str) -> dict[str, Any] | None: ...  # the report, as recorded
    async def set_alias(self, agent: str, alias: str, digest: str, now: float) -> None: ...
    async def get_alias(self, agent: str, alias: str) -> str | None: ...
    async def list_aliases(self, agent: str) -> list[dict[str, Any]]: ...
    async def delete_alias(self, agent: str, alias: str) -> bool: ...


class PermissionStore(Notices, Protocol):
    """Permission requests and their decisions: the audit trail of who allowed which tool call."""

    async def create_permission(self, record: PermissionRecord) -> None: ...
    async def decide_permission(self, request_id: str, status: PermissionStatus, decided_by: str,
                                now: float) -> bool: ...
    # ^ only a pending request changes; returns whether it did
    async def get_permission(self, request_id: str) -> PermissionRecord | None: ...
    async def list_permissions(self, conversation_id: str) -> list[PermissionRecord]: ...


class ContextStore(Notices, Protocol):
    """Context management (§10): compacted views, and messages steered into a running turn."""

    async def save_context_view(self, view: ContextView, turn_id: str, event: tuple[str, dict[str, Any]],
                                now: float, *, fence: int | None = None) -> int: ...
    # ^ the view and its event (`context.compacted`) in one transaction, fenced as `append` is (by
    # `turn_id`, the holder: a turn, or a compaction of its own); returns the event's seq
    async def get_context_view(self, conversation_id: str) -> ContextView | None: ...  # the latest
    async def add_steer(self, conversation_id: str, turn_id: str, content: str, now: float,
                        *, key: str | None = None, request: str | None = None,
                        since: float = 0.0) -> int | None: ...
    # ^ a message for the running turn `turn_id` to pick up; returns its id. With an Idempotency-Key
    # `key` (and the request's digest), the key is recorded with it, one transaction; a key recorded
    # at or after `since` adds nothing and answers None
    async def steer_key(self, conversation_id: str, key: str,
                        since: float) -> tuple[str, str | None] | None: ...
    # ^ the turn a message was steered into under `key` (recorded at or after `since`), and its request
    async def take_steers(self, conversation_id: str, turn_id: str, now: float,
                          *, fence: int | None = None) -> list[tuple[str, int]]: ...
    # ^ one transaction: the turn's pending messages, oldest first, move into the transcript as user
    # messages of the turn, each with its `message.steered` {turn_id, content} event; fenced as
    # `append` is; returns (content, event seq) of each (nothing pending: nothing written)
    async def drop_steers(self, conversation_id: str, turn_id: str,
                          steer_id: int | None = None) -> list[str]: ...
    # ^ deletes and returns the turn's pending messages (or only `steer_id`, and its key), oldest
    # first: what a turn that ended did not pick up


class EvalStore(Notices, Protocol):
    """Eval runs (§12): a run is saved `running`, then ended once (`end_eval_run` changes only a
    running one and says whether it did); the rules an alias follows, and its canary's draws."""

    async def save_eval_run(self, run: dict[str, Any], started_at: float) -> None: ...
    async def end_eval_run(self, run: dict[str, Any]) -> bool: ...
    async def get_eval_run(self, run_id: str) -> dict[str, Any] | None: ...
    async def list_eval_runs(self, query: EvalRunQuery) -> list[dict[str, Any]]: ...  # newest first
    async def set_alias_rules(self, agent: str, alias: str, rules: AliasRules) -> None: ...
    async def get_alias_rules(self, agent: str, alias: str) -> AliasRules: ...  # defaults when none
    # canaries: the digest each conversation created on an alias with a canary drew; per digest drawn,
    # the conversations created and their turns completed and failed
    async def record_canary_draw(self, agent: str, alias: str, conversation_id: str, digest: str,
                                 now: float) -> None: ...
    async def canary_counts(self, agent: str, alias: str) -> dict[str, dict[str, int]]: ...


class Store(Lifecycle, ConversationStore, TurnJournal, Coordination, DefinitionStore, PermissionStore,
            ContextStore, EvalStore, Protocol):
    """Every port, as one store implements them (what the composition root opens and hands out).

    Every write either commits or raises `StorageError` (and tells `on_failure` first).
    """
