"""PostgreSQL tables of what was served: definitions and the files they point to, swaps, agent aliases.

A part of `PostgresStore` (same pool, same rules: one statement per write).
Batches go in as arrays (`unnest`), one statement whatever their size.
"""

from __future__ import annotations

import json
from typing import Any

from .. import rows
from ..records import StoredDefinition, StoredFile
from ..statements import POSTGRES as SQL
from .pool import PostgresBase, notice_sql


class DefinitionTables(PostgresBase):
    # definitions ever served, and their files

    async def save_definitions(self, definitions: list[StoredDefinition]) -> None:
        """Store each definition once: a digest already known is left as it was."""
        if not definitions:
            return
        await self._write(
            "INSERT INTO definitions (digest, kind, name, spec, first_seen)"
            " SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::float8[])"
            " ON CONFLICT (digest) DO NOTHING",
            [d.digest for d in definitions], [d.kind for d in definitions], [d.name for d in definitions],
            [rows.dumps(d.spec) for d in definitions], [d.first_seen for d in definitions])

    async def get_definition(self, digest: str) -> StoredDefinition | None:
        row = await self._read_row(SQL.get_definition, digest)
        return None if row is None else rows.definition(row)

    async def find_definitions(self, kind: str, name: str) -> list[StoredDefinition]:
        """Every version of one definition ever served, oldest first (for tests: no port has it)."""
        return [rows.definition(row) for row in await self._read(SQL.find_definitions, kind, name)]

    async def save_files(self, files: list[StoredFile]) -> None:
        if not files:
            return
        await self._write(
            "INSERT INTO files (digest, data, mode) SELECT * FROM unnest($1::text[], $2::bytea[], $3::int[])"
            " ON CONFLICT (digest) DO NOTHING",
            [f.digest for f in files], [f.data for f in files], [f.mode for f in files])

    async def get_file(self, digest: str) -> StoredFile | None:
        return rows.stored_file(await self._read_row(SQL.get_file, digest))

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
            found = await self._read(SQL.list_swaps, limit)
        else:
            found = await self._read(SQL.list_swaps_after, after, limit)
        return [{"id": row[0], **json.loads(row[1])} for row in found]

    async def get_swap(self, swap_id: str) -> dict[str, Any] | None:
        row = await self._read_row(SQL.get_swap, swap_id)
        return None if row is None else json.loads(row[0])

    async def set_alias(self, agent: str, alias: str, digest: str, now: float) -> None:
        await self._write(SQL.set_alias, agent, alias, digest, now)

    async def get_alias(self, agent: str, alias: str) -> str | None:
        row = await self._read_row(SQL.get_alias, agent, alias)
        return None if row is None else row[0]

    async def list_aliases(self, agent: str) -> list[dict[str, Any]]:
        found = await self._read(SQL.list_aliases, agent)
        return [{"alias": a, "digest": d, "updated_at": u} for a, d, u in found]

    async def delete_alias(self, agent: str, alias: str) -> bool:
        return await self._write_status(SQL.delete_alias, agent, alias) > 0
