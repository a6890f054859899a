"""One process owns an embedded (SQLite) store: an exclusive lock next to its database file.

Durable turns recover at start-up everything the store holds as running,
since on the embedded store the only process that could have run them is a
previous run of this one. A second process on the same file would take the
live owner's turns over: so the owner holds `fcntl.flock` on `DB.owner`
(`.corral/corral.db.owner` by default) for its lifetime, and writes in it a
small JSON record, `{"pid", "command", "url"}` (`url` once `corral serve`
has bound its socket). The kernel drops the lock with the process, however
it ends, so a file left by a dead owner blocks nothing. PostgreSQL has no
owner: replicas share it by design, with leases.

`claim` takes the lock or raises `StateOwned` carrying the owner's record;
a process may claim again what it holds (the serve verb claims before its
app's lifespan does). Not responsible for what a refused process does next:
`corral serve` and `corral mcp` refuse, `corral chat` talks to the owner.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import StateOwned
from ..settings import Settings

URL_WAIT_S = 30.0  # how long `wait_for_url` waits for a starting server to bind


@dataclass
class Claim:
    """This process's hold on one store's lock file (released when the last holder releases it)."""

    path: Path
    fd: int
    command: str
    holders: int = 1

    def announce(self, url: str) -> None:
        """Record the URL this owner serves, for `corral chat` and for a refused second server."""
        self._write({"pid": os.getpid(), "command": self.command, "url": url})

    def _write(self, record: dict[str, Any]) -> None:
        data = json.dumps(record).encode()
        os.pwrite(self.fd, data, 0)
        os.ftruncate(self.fd, len(data))

    def release(self) -> None:
        with _guard:
            self.holders -= 1
            if self.holders > 0:
                return
            _held.pop(self.path, None)
            os.close(self.fd)  # drops the lock


_held: dict[Path, Claim] = {}
_guard = threading.Lock()


def lock_path(settings: Settings) -> Path | None:
    """The lock file of the settings' embedded store; None for PostgreSQL or an in-memory database."""
    if settings.replicated:
        return None
    url = settings.database_url or ""
    named = url.split("://", 1)[1] if "://" in url else ""  # as `service.stores.open_store` reads it
    database = Path(named) if named else settings.database_path
    if named == ":memory:":
        return None
    return database.parent.resolve() / f"{database.name}.owner"


def claim(settings: Settings, command: str) -> Claim | None:
    """Own the settings' embedded store (None: nothing to own); `StateOwned` when a live process does."""
    path = lock_path(settings)
    if path is None:
        return None
    with _guard:
        held = _held.get(path)
        if held is not None:
            held.holders += 1
            return held
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # never truncated: it may be the owner's record
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StateOwned(path, read_record(path)) from None
        held = _held[path] = Claim(path, fd, command)
    held._write({"pid": os.getpid(), "command": command, "url": None})
    return held


def read_record(path: Path) -> dict[str, Any]:
    """The owner's record; {} when it cannot be read (being written, or never written)."""
    try:
        record = json.loads(path.read_bytes() or b"{}")
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def wait_for_url(owned: StateOwned, bound_s: float = URL_WAIT_S) -> str | None:
    """The URL of an owner that is `corral serve` still starting (it has not bound yet), once it has;
    None when the owner serves no URL, or stops owning, or the bound passes first."""
    deadline = time.monotonic() + bound_s
    record = owned.record
    while record.get("command") == "serve" and not record.get("url") and time.monotonic() < deadline:
        time.sleep(0.1)  # the owner writes its URL once, when it has bound
        if not _still_owned(owned.path):
            return None
        record = read_record(owned.path)
    url = record.get("url")
    return url if isinstance(url, str) and url else None


def _still_owned(path: Path) -> bool:
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
