"""Content-addressed copies of the files definitions point to.

A digest covers the content of a tool's script, a hook's script, an MCP
server's script and a skill's files. For a pinned conversation, or a turn
that started before an edit, "what runs is exactly what was reviewed" means
running that content, not whatever the file says now. So every file of every
served definition is kept here by digest (`STATE/files/<hex>/<name>`), and
executors resolve a file through `FileVault.resolve` (or take its bytes from
`FileVault.read`): the file on disk when it still has the expected digest,
else the kept copy, else a clear error. Files are read with
`sources.read_regular`, so a FIFO planted where a file was is never opened.

The kept copies are this replica's; the registry also saves every file in
the store by digest, and `put`s it here when a definition another replica
compiled is resolved, so a pin runs the same content on every replica.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from ..canonical import PREFIX, digest_bytes
from ..compiler.sources import read_regular


class FileChanged(Exception):
    """A file no longer has the content a definition was compiled with, and no copy was kept."""


class FileVault:
    def __init__(self, directory: Path | None):
        self.directory = directory

    def _kept(self, digest: str, rel: str) -> Path | None:
        if self.directory is None:
            return None
        return self.directory / digest.removeprefix(PREFIX) / Path(rel).name

    def keep(self, base: Path, files: Mapping[str, str]) -> None:
        """Copy each `base/rel` whose content has the listed digest, unless already kept."""
        for rel, digest in files.items():
            kept = self._kept(digest, rel)
            if kept is None or kept.exists():
                continue
            try:
                data = read_regular(base / rel)
                mode = os.stat(base / rel).st_mode & 0o777
            except OSError:
                continue
            if digest_bytes(data) != digest:
                continue  # edited since compile: the next compile will keep the new content
            self.put(rel, digest, data, mode)

    def put(self, rel: str, digest: str, data: bytes, mode: int) -> None:
        """Keep `data` as the content of `rel` with this digest (checked: a bad copy is refused)."""
        kept = self._kept(digest, rel)
        if kept is None or kept.exists() or digest_bytes(data) != digest:
            return
        kept.parent.mkdir(parents=True, exist_ok=True)
        tmp = kept.with_name(kept.name + ".tmp")
        tmp.write_bytes(data)
        os.chmod(tmp, mode & 0o777)
        os.replace(tmp, kept)

    def resolve(self, base: Path, rel: str, digest: str) -> Path:
        path = base / rel
        try:
            if digest_bytes(read_regular(path)) == digest:
                return path
        except OSError:
            pass
        kept = self._kept(digest, rel)
        if kept is not None and kept.exists():
            return kept
        raise _changed(rel, digest)

    def read(self, base: Path, rel: str, digest: str) -> bytes:
        """The compiled content of `base/rel` itself, checked as read (no window for a swap after it)."""
        try:
            data = read_regular(base / rel)
            if digest_bytes(data) == digest:
                return data
        except OSError:
            pass
        kept = self._kept(digest, rel)
        try:
            if kept is not None:
                return read_regular(kept)
        except OSError:
            pass
        raise _changed(rel, digest)

    def kept(self, rel: str, digest: str) -> Path | None:
        """The kept copy alone (for a definition rebuilt from the store, whose files have no place)."""
        path = self._kept(digest, rel)
        return path if path is not None and path.exists() else None

    def argv(self, base: Path, items: Iterable[str], files: Mapping[str, str]) -> list[str]:
        """Argv with every element naming a definition file resolved to the compiled content."""
        return [str(self.resolve(base, item, files[item])) if item in files else item for item in items]


def _changed(rel: str, digest: str) -> FileChanged:
    return FileChanged(f"{rel} changed since this definition was compiled ({digest[:19]}…)"
                       " and no copy of the compiled content was kept")


NO_VAULT = FileVault(None)  # disk only: for callers outside a server (tests, the CLI)
