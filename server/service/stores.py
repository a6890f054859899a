"""Which store a server opens: the embedded SQLite file, or PostgreSQL for several replicas.

`CORRAL_DATABASE_URL` chooses: unset or `sqlite:///PATH` is SQLite (the
default file under the state directory), `postgresql://…` (or
`postgres://…`) is PostgreSQL, through the optional extra
`corral[postgres]`. Anything else is refused at start, by name.
"""

from __future__ import annotations

from ..errors import CorralError
from ..settings import Settings
from ..store.base import Store


def open_store(settings: Settings) -> Store:
    url = settings.database_url or ""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in ("postgresql", "postgres"):
        try:
            from ..store.postgres import PostgresStore
        except ImportError as exc:  # asyncpg is the optional extra
            raise CorralError(f"CORRAL_DATABASE_URL is PostgreSQL, but its driver is missing ({exc});"
                              " install corral[postgres]", code="invalid_request") from None
        return PostgresStore(url, replica=settings.replica)
    if url and scheme != "sqlite":
        raise CorralError("CORRAL_DATABASE_URL must start with sqlite:// or postgresql://",
                          code="invalid_request")
    from ..store.sqlite import SQLiteStore

    path = settings.database_path
    if url:
        path = url.split("://", 1)[1] or str(path)
    return SQLiteStore(path, replica=settings.replica)
