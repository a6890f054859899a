"""PostgreSQL tables of what was served and decided: definitions, swaps, aliases, permission requests.

A mixin of `PostgresStore` (same pool, same rules: one statement per write).
Batches go in as arrays (`unnest`), one statement whatever their size.
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from .base import PermissionRecord, StoredDefinition
from .postgres_pool import PostgresBase, dumps, notice_sql

_PERMISSION_COLUMNS = ("id, conversation_id, turn_id, tool_call_id, tool, arguments, reason, status,"
                       " requested_at, expires_at, decided_by, decided_at")


def _definition(row: asyncpg.Record) -> StoredDefinition:
    fields = dict(row)
    fields["spec"] = json.loads(fields["spec"])
    return StoredDefinition(**fields)


def _permission(row: asyncpg.Record) -> PermissionRecord:
    fields = dict(row)
    fields["arguments"] = json.loads(fields["arguments"])
    return PermissionRecord(**fields)


class RecordTables(PostgresBase):
    # definitions ever served

    async def save_definitions(self, definitions: list[StoredDefinition]) -> None:
        """Store each definition once: a digest already known is left as it was."""
        if not definitions:
            return
        await self._write(
            "INSERT INTO definitions (digest, kind, name, spec, first_seen)"
            " SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::float8[])"
            " ON CONFLICT (digest) DO NOTHING",
            [d.digest for d in definitions], [d.kind for d in definitions], [d.name for d in definitions],
            [dumps(d.spec) for d in definitions], [d.first_seen for d in definitions])

    async def get_definition(self, digest: str) -> StoredDefinition | None:
        row = await self._read_row(
            "SELECT kind, name, digest, spec, first_seen FROM definitions WHERE digest = $1", digest)
        return None if row is None else _definition(row)

    async def find_definitions(self, kind: str, name: str) -> list[StoredDefinition]:
        """Every version of one definition ever served, oldest first."""
        rows = await self._read(
            "SELECT kind, name, digest, spec, first_seen FROM definitions WHERE kind = $1 AND name = $2"
            " ORDER BY first_seen, digest", kind, name)
        return [_definition(row) for row in rows]

    # swaps and aliases

    async def record_swap(self, swap_id: str, at: float, status: str, report: dict[str, Any]) -> None:
        """Store the report and tell the other replicas (they read it back with `get_swap`)."""
        notice = notice_sql("swap", r="$5::text", id="id")
        await self._write(
            "WITH stored AS (INSERT INTO swaps (id, at, status, report) VALUES ($1, $2, $3, $4) RETURNING id)"
            f" SELECT {notice} FROM stored",
            swap_id, at, status, json.dumps(report, separators=(",", ":")), self.replica)

    async def list_swaps(self, *, limit: int = 50, after: str | None = None) -> list[dict[str, Any]]:
        """Newest first; swap ids sort by time, so `after` is a plain keyset on the id."""
        if after is None:
            rows = await self._read("SELECT id, report FROM swaps ORDER BY id DESC LIMIT $1", limit)
        else:
            rows = await self._read("SELECT id, report FROM swaps WHERE id < $1 ORDER BY id DESC LIMIT $2",
                                    after, limit)
        return [{"id": row[0], **json.loads(row[1])} for row in rows]

    async def get_swap(self, swap_id: str) -> dict[str, Any] | None:
        row = await self._read_row("SELECT report FROM swaps WHERE id = $1", swap_id)
        return None if row is None else json.loads(row[0])

    async def set_alias(self, agent: str, alias: str, digest: str, now: float) -> None:
        await self._write(
            "INSERT INTO aliases (agent, alias, digest, updated_at) VALUES ($1, $2, $3, $4)"
            " ON CONFLICT (agent, alias) DO UPDATE SET digest = excluded.digest,"
            " updated_at = excluded.updated_at", agent, alias, digest, now)

    async def get_alias(self, agent: str, alias: str) -> str | None:
        row = await self._read_row("SELECT digest FROM aliases WHERE agent = $1 AND alias = $2", agent, alias)
        return None if row is None else row[0]

    async def list_aliases(self, agent: str) -> list[dict[str, Any]]:
        rows = await self._read(
            "SELECT alias, digest, updated_at FROM aliases WHERE agent = $1 ORDER BY alias", agent)
        return [{"alias": a, "digest": d, "updated_at": u} for a, d, u in rows]

    async def delete_alias(self, agent: str, alias: str) -> bool:
        return await self._write_status(
            "DELETE FROM aliases WHERE agent = $1 AND alias = $2", agent, alias) > 0

    # permission requests and decisions

    async def create_permission(self, record: PermissionRecord) -> None:
        r = record
        await self._write(
            "INSERT INTO permissions (id, conversation_id, turn_id, tool_call_id, tool, arguments, reason,"
            " status, requested_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            r.id, r.conversation_id, r.turn_id, r.tool_call_id, r.tool, json.dumps(r.arguments), r.reason,
            r.status, r.requested_at, r.expires_at)

    async def decide_permission(self, request_id: str, status: str, decided_by: str, now: float) -> bool:
        """Only a pending request changes (the first decision wins, on whichever replica)."""
        return await self._write_status(
            "UPDATE permissions SET status = $2, decided_by = $3, decided_at = $4"
            " WHERE id = $1 AND status = 'pending'", request_id, status, decided_by, now) == 1

    async def get_permission(self, request_id: str) -> PermissionRecord | None:
        row = await self._read_row(f"SELECT {_PERMISSION_COLUMNS} FROM permissions WHERE id = $1", request_id)
        return None if row is None else _permission(row)

    async def list_permissions(self, conversation_id: str) -> list[PermissionRecord]:
        rows = await self._read(
            f"SELECT {_PERMISSION_COLUMNS} FROM permissions WHERE conversation_id = $1"
            " ORDER BY requested_at, id", conversation_id)
        return [_permission(row) for row in rows]
