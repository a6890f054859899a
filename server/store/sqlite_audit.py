"""SQLite table for the permission audit trail: who allowed or denied which tool call, when.

A mixin of `SQLiteStore` (same connection, same transaction rules).
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import AbstractContextManager

from .base import PermissionRecord


def _record(row: sqlite3.Row) -> PermissionRecord:
    fields = dict(row)
    fields["arguments"] = json.loads(fields["arguments"])
    return PermissionRecord(**fields)


class AuditTables:
    _db: sqlite3.Connection

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:  # provided by SQLiteStore
        raise NotImplementedError

    async def create_permission(self, record: PermissionRecord) -> None:
        r = record
        with self._write() as db:
            db.execute(
                "INSERT INTO permissions (id, conversation_id, turn_id, tool_call_id, tool, arguments,"
                " reason, status, requested_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (r.id, r.conversation_id, r.turn_id, r.tool_call_id, r.tool, json.dumps(r.arguments),
                 r.reason, r.status, r.requested_at, r.expires_at),
            )

    async def decide_permission(self, request_id: str, status: str, decided_by: str, now: float) -> bool:
        with self._write() as db:
            cursor = db.execute(
                "UPDATE permissions SET status = ?, decided_by = ?, decided_at = ?"
                " WHERE id = ? AND status = 'pending'", (status, decided_by, now, request_id))
        return cursor.rowcount == 1

    async def get_permission(self, request_id: str) -> PermissionRecord | None:
        row = self._db.execute("SELECT * FROM permissions WHERE id = ?", (request_id,)).fetchone()
        return None if row is None else _record(row)

    async def list_permissions(self, conversation_id: str) -> list[PermissionRecord]:
        rows = self._db.execute(
            "SELECT * FROM permissions WHERE conversation_id = ? ORDER BY requested_at, id",
            (conversation_id,))
        return [_record(row) for row in rows]
