"""The SQLite store (the default): one file, one process; `SQLiteStore` implements every port."""

from .store import SQLiteStore

__all__ = ["SQLiteStore"]
