"""SQLite table for the permission audit trail: who allowed or denied which tool call, when.

A part of `SQLiteStore` (same connection, same transaction rules).
"""

from __future__ import annotations

from ...statuses import PermissionStatus
from .. import rows
from ..records import PermissionRecord
from ..statements import SQLITE as SQL
from .writes import Tables


class AuditTables(Tables):
    async def create_permission(self, record: PermissionRecord) -> None:
        with self._write() as db:
            db.execute(SQL.create_permission, rows.permission_values(record))

    async def decide_permission(self, request_id: str, status: PermissionStatus, decided_by: str,
                                now: float) -> bool:
        with self._write() as db:
            cursor = db.execute(SQL.decide_permission, (request_id, status, decided_by, now))
        return cursor.rowcount == 1

    async def get_permission(self, request_id: str) -> PermissionRecord | None:
        row = self._db.execute(SQL.get_permission, (request_id,)).fetchone()
        return None if row is None else rows.permission(row)

    async def list_permissions(self, conversation_id: str) -> list[PermissionRecord]:
        return [rows.permission(row) for row in self._db.execute(SQL.list_permissions, (conversation_id,))]
