"""Rows of the PostgreSQL store back into records: the columns each record reads, and its decoding.

Shared by the store's modules; the columns are named, never `*`, because
the conversation's row also carries what no record shows (its sequence
counters and its holder).
"""

from __future__ import annotations

import json

import asyncpg

from .base import ConversationRecord, TurnRecord

CONVERSATION_COLUMNS = ("id, agent, agent_name, digest, pinned, title, metadata, status, created_at,"
                        " updated_at, archived, forked_from_conversation, forked_from_turn")
TURN_COLUMNS = ("id, conversation_id, agent, digest, status, input, output, stop_reason, usage, error,"
                " idempotency_key, request_digest, started_at, ended_at, attempts")
# what update_turn may change; the JSON ones are encoded on the way in
TURN_UPDATES = frozenset({"status", "output", "stop_reason", "usage", "error", "ended_at", "idempotency_key"})
TURN_JSON = frozenset({"usage", "error"})


def conversation_record(row: asyncpg.Record) -> ConversationRecord:
    fields = dict(row)
    fields["metadata"] = json.loads(fields["metadata"])
    source, turn = fields.pop("forked_from_conversation"), fields.pop("forked_from_turn")
    fields["forked_from"] = None if source is None else {"conversation_id": source, "turn_id": turn}
    return ConversationRecord(**fields)


def turn_record(row: asyncpg.Record) -> TurnRecord:
    fields = dict(row)
    fields["usage"] = json.loads(fields["usage"])
    if fields["error"] is not None:
        fields["error"] = json.loads(fields["error"])
    return TurnRecord(**fields)
