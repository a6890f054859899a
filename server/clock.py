"""Timestamps as the API writes them: ISO 8601 in UTC, milliseconds, `Z`."""

from __future__ import annotations

from datetime import UTC, datetime


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
