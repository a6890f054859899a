"""SQLite tables of what was served: definitions and the files they point to, swaps, agent aliases.

A part of `SQLiteStore` (same connection, same transaction rules). Batches
go in with `executemany` inside one transaction (PostgreSQL sends arrays,
one statement: there each statement is a round trip).
"""

from __future__ import annotations

import json
from typing import Any

from .. import rows
from ..records import StoredDefinition, StoredFile
from ..statements import SQLITE as SQL
from .writes import Tables


class DefinitionTables(Tables):
    # definitions ever served, and their files

    async def save_definitions(self, definitions: list[StoredDefinition]) -> None:
        """Store each definition once: a digest already known is left as it was."""
        with self._write() as db:
            db.executemany(
                "INSERT OR IGNORE INTO definitions (digest, kind, name, spec, first_seen)"
                " VALUES (?, ?, ?, ?, ?)",
                [(d.digest, d.kind, d.name, rows.dumps(d.spec), d.first_seen) for d in definitions],
            )

    async def get_definition(self, digest: str) -> StoredDefinition | None:
        row = self._db.execute(SQL.get_definition, (digest,)).fetchone()
        return None if row is None else rows.definition(row)

    async def find_definitions(self, kind: str, name: str) -> list[StoredDefinition]:
        """Every version of one definition ever served, oldest first (for tests: no port has it)."""
        return [rows.definition(row) for row in self._db.execute(SQL.find_definitions, (kind, name))]

    async def save_files(self, files: list[StoredFile]) -> None:
        if not files:
            return
        with self._write() as db:
            db.executemany("INSERT OR IGNORE INTO files (digest, data, mode) VALUES (?, ?, ?)",
                           [(f.digest, f.data, f.mode) for f in files])

    async def get_file(self, digest: str) -> StoredFile | None:
        return rows.stored_file(self._db.execute(SQL.get_file, (digest,)).fetchone())

    # swaps and aliases

    async def record_swap(self, swap_id: str, at: float, status: str, report: dict[str, Any]) -> None:
        with self._write() as db:
            db.execute("INSERT INTO swaps (id, at, status, report) VALUES (?, ?, ?, ?)",
                       (swap_id, at, status, json.dumps(report, separators=(",", ":"))))

    async def list_swaps(self, *, limit: int = 50, after: str | None = None) -> list[dict[str, Any]]:
        """Newest first; swap ids sort by time, so `after` is a plain keyset on the id."""
        if after is None:
            found = self._db.execute(SQL.list_swaps, (limit,))
        else:
            found = self._db.execute(SQL.list_swaps_after, (after, limit))
        return [{"id": row[0], **json.loads(row[1])} for row in found]

    async def get_swap(self, swap_id: str) -> dict[str, Any] | None:
        row = self._db.execute(SQL.get_swap, (swap_id,)).fetchone()
        return None if row is None else json.loads(row[0])

    async def set_alias(self, agent: str, alias: str, digest: str, now: float) -> None:
        with self._write() as db:
            db.execute(SQL.set_alias, (agent, alias, digest, now))

    async def get_alias(self, agent: str, alias: str) -> str | None:
        row = self._db.execute(SQL.get_alias, (agent, alias)).fetchone()
        return None if row is None else row[0]

    async def list_aliases(self, agent: str) -> list[dict[str, Any]]:
        return [{"alias": a, "digest": d, "updated_at": u}
                for a, d, u in self._db.execute(SQL.list_aliases, (agent,))]

    async def delete_alias(self, agent: str, alias: str) -> bool:
        with self._write() as db:
            cursor = db.execute(SQL.delete_alias, (agent, alias))
        return cursor.rowcount > 0
