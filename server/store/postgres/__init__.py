"""The PostgreSQL store: what several replicas share; `PostgresStore` implements every port."""

from .store import PostgresStore

__all__ = ["PostgresStore"]
