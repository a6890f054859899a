"""SQLite tables for deployments: the swap history and agent aliases.

A mixin of `SQLiteStore` (same connection, same transaction rules), kept
apart so each module stays about one thing.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any


class DeploymentTables:
    _db: sqlite3.Connection

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:  # provided by SQLiteStore
        raise NotImplementedError

    async def record_swap(self, swap_id: str, at: float, status: str, report: dict[str, Any]) -> None:
        with self._write() as db:
            db.execute("INSERT INTO swaps (id, at, status, report) VALUES (?, ?, ?, ?)",
                       (swap_id, at, status, json.dumps(report, separators=(",", ":"))))

    async def list_swaps(self, *, limit: int = 50, after: str | None = None) -> list[dict[str, Any]]:
        """Newest first; swap ids sort by time, so `after` is a plain keyset on the id."""
        if after is None:
            rows: Iterator[Any] = self._db.execute(
                "SELECT id, report FROM swaps ORDER BY id DESC LIMIT ?", (limit,))
        else:
            rows = self._db.execute(
                "SELECT id, report FROM swaps WHERE id < ? ORDER BY id DESC LIMIT ?", (after, limit))
        return [{"id": row[0], **json.loads(row[1])} for row in rows]

    async def get_swap(self, swap_id: str) -> dict[str, Any] | None:
        row = self._db.execute("SELECT report FROM swaps WHERE id = ?", (swap_id,)).fetchone()
        return None if row is None else json.loads(row[0])

    async def set_alias(self, agent: str, alias: str, digest: str, now: float) -> None:
        with self._write() as db:
            db.execute(
                "INSERT INTO aliases (agent, alias, digest, updated_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (agent, alias) DO UPDATE SET digest = excluded.digest,"
                " updated_at = excluded.updated_at",
                (agent, alias, digest, now),
            )

    async def get_alias(self, agent: str, alias: str) -> str | None:
        row = self._db.execute("SELECT digest FROM aliases WHERE agent = ? AND alias = ?",
                               (agent, alias)).fetchone()
        return None if row is None else row[0]

    async def list_aliases(self, agent: str) -> list[dict[str, Any]]:
        rows = self._db.execute(
            "SELECT alias, digest, updated_at FROM aliases WHERE agent = ? ORDER BY alias", (agent,))
        return [{"alias": a, "digest": d, "updated_at": u} for a, d, u in rows]

    async def delete_alias(self, agent: str, alias: str) -> bool:
        with self._write() as db:
            cursor = db.execute("DELETE FROM aliases WHERE agent = ? AND alias = ?", (agent, alias))
        return cursor.rowcount > 0
