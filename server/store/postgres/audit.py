"""PostgreSQL table for the permission audit trail: who allowed or denied which tool call, when.

A part of `PostgresStore` (same pool, same rules: one statement per write).
"""

from __future__ import annotations

from ...statuses import PermissionStatus
from .. import rows
from ..records import PermissionRecord
from ..statements import POSTGRES as SQL
from .pool import PostgresBase


class AuditTables(PostgresBase):
    async def create_permission(self, record: PermissionRecord) -> None:
        await self._write(SQL.create_permission, *rows.permission_values(record))

    async def decide_permission(self, request_id: str, status: PermissionStatus, decided_by: str,
                                now: float) -> bool:
        """Only a pending request changes (the first decision wins, on whichever replica)."""
        return await self._write_status(SQL.decide_permission, request_id, status, decided_by, now) == 1

    async def get_permission(self, request_id: str) -> PermissionRecord | None:
        row = await self._read_row(SQL.get_permission, request_id)
        return None if row is None else rows.permission(row)

    async def list_permissions(self, conversation_id: str) -> list[PermissionRecord]:
        return [rows.permission(row) for row in await self._read(SQL.list_permissions, conversation_id)]
