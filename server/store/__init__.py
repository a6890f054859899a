"""Persistence: one port (`base.Store`), a SQLite implementation (the default)."""
