"""Finding and reading definition files in a directory.

Responsible for: which files are definitions (`*.yaml`, `*.yml`, and
`SKILL.md` in a folder of its own, whose other files are that skill's
resources rather than definitions), reading them safely (size cap, strict
UTF-8, no symlink out of the directory), and splitting them into parsed
documents. Results are cached by file identity, so a recompile after a
one-file edit reparses one file.

`read_regular` is the one way a definition file is read, here and in every
module that reads one (normalize, vault, the skill tools): only a regular
file is opened, so a FIFO, socket or device planted in the directory is an
error naming it, never an open that blocks forever.

Paths are confined here too: `confine` is the one check that a path named in
a definition stays inside the definition directory.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from ..canonical import digest_bytes
from ..errors import DefinitionError
from .yamltext import ParsedDocument, Position, YAMLProblem, parse_yaml

MAX_FILE_BYTES = 1024 * 1024
YAML_SUFFIXES = (".yaml", ".yml")
SKILL_FILE = "SKILL.md"
IGNORED_FILES = {"corral.lock"}


@dataclass(frozen=True)
class SourceDocument:
    """One document of one file, before validation."""

    file: str  # relative to the definition directory, POSIX separators
    parsed: ParsedDocument
    base: Path  # the directory relative paths in this document start from
    skill_folder: Path | None = None  # set for a SKILL.md document
    body: str = ""  # the Markdown after a SKILL.md front matter


class PathEscape(ValueError):
    pass


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


class NotRegularFile(OSError):
    """A path that exists but is not a regular file; `strerror` reads "is a FIFO, not a regular file"."""

    def __init__(self, path: str | Path, mode: int):
        self.what = next((name for test, name in _KINDS if test(mode)), "a special file")
        self.is_dir = stat.S_ISDIR(mode)
        super().__init__(errno.EISDIR if self.is_dir else errno.EINVAL,
                         f"is {self.what}, not a regular file", str(path))


def regular_stat(path: str | Path) -> os.stat_result:
    """`stat` (following symlinks) of a regular file; `NotRegularFile` for anything else."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFile(path, st.st_mode)
    return st


# O_NONBLOCK: should a FIFO replace the file between the stat and the open, the open returns
# at once (and fstat refuses it) instead of waiting for a writer; O_NOCTTY: a terminal never
# becomes the controlling one.
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def read_regular(path: str | Path) -> bytes:
    """The bytes of the regular file at `path`; anything else is refused without being opened."""
    regular_stat(path)
    fd = os.open(path, _OPEN_FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(path, st.st_mode)
        with open(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


def confine(root: Path, base: Path, written: str) -> Path:
    """Resolve `written` (relative to `base`) and insist it stays inside `root`."""
    if os.path.isabs(written):
        raise PathEscape(f"{written!r} is an absolute path; use a path inside the definition directory")
    if "\0" in written:  # no OS takes it, and os.path.realpath raises ValueError rather than OSError
        raise PathEscape(f"{written!r} holds a NUL character; no file has that name")
    resolved = (base / written).resolve()
    if resolved != root and root not in resolved.parents:
        raise PathEscape(f"{written!r} resolves outside the definition directory")
    return resolved


def relative(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix() or "."


def definition_files(root: Path) -> tuple[list[Path], list[DefinitionError]]:
    """Every definition file under `root`, sorted; symlinks out are errors."""
    found: list[Path] = []
    errors: list[DefinitionError] = []
    pending = [root]
    while pending:
        folder = pending.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            errors.append(DefinitionError(
                file=relative(root, folder), message=f"cannot read: {exc.strerror}"
            ))
            continue
        if folder != root and any(e.name == SKILL_FILE for e in entries):
            found.append(folder / SKILL_FILE)
            continue
        for entry in entries:
            if entry.name.startswith(".") or entry.name in IGNORED_FILES:
                continue
            kind = _entry_kind(root, entry, errors)
            if kind == "dir":
                pending.append(Path(entry.path))
            elif kind in ("file", "other") and entry.name.endswith(YAML_SUFFIXES):
                found.append(Path(entry.path))  # "other": read_file refuses it, naming it
    return sorted(found, key=lambda p: p.parts), errors  # the order of Path comparison, cheaper


def _entry_kind(root: Path, entry: os.DirEntry, errors: list[DefinitionError]) -> str:
    """"dir", "file" (regular), "other" (a FIFO, socket, device), or "" for what is not walked
    (symlinks to what is already inside, dangling symlinks)."""
    if entry.is_symlink():
        path = Path(entry.path)
        target = path.resolve()
        if target != root and root not in target.parents:
            if target.is_dir() or entry.name.endswith(YAML_SUFFIXES):
                errors.append(DefinitionError(
                    file=relative(root, path), message="symlink points outside the definition directory"
                ))
            return ""
        if target.is_dir():
            return ""  # inside already: walking it twice would duplicate every document
    if entry.is_dir():
        return "dir"
    if entry.is_file():
        return "file"
    return "other" if os.path.exists(entry.path) else ""


def _decode(rel: str, data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise _FileProblem(f"not UTF-8 text (byte 0x{data[exc.start]:02x})", Position(line, column)) from None


class _FileProblem(Exception):
    def __init__(self, message: str, position: Position | None = None):
        super().__init__(message)
        self.message = message
        self.position = position or Position(1, 1)


def read_file(root: Path, path: Path) -> tuple[list[SourceDocument], list[DefinitionError]]:
    rel = relative(root, path)
    try:
        size = regular_stat(path).st_size
        if size > MAX_FILE_BYTES:
            raise _FileProblem(f"file is {size} bytes; the limit is {MAX_FILE_BYTES}")
        text = _decode(rel, read_regular(path))
        if path.name == SKILL_FILE:
            return [_skill_document(rel, path, text)], []
        parsed = parse_yaml(text)
    except (_FileProblem, YAMLProblem) as exc:
        pos = exc.position
        return [], [DefinitionError(file=rel, line=pos.line, column=pos.column, message=exc.message)]
    except NotRegularFile as exc:
        return [], [DefinitionError(file=rel, message=exc.strerror)]
    except OSError as exc:
        return [], [DefinitionError(file=rel, message=f"cannot read: {exc.strerror}")]
    return [SourceDocument(file=rel, parsed=doc, base=path.parent) for doc in parsed], []


def _skill_document(rel: str, path: Path, text: str) -> SourceDocument:
    lines = text.split("\n")
    if not lines or lines[0].strip() != "---":
        raise _FileProblem("SKILL.md must start with YAML front matter between --- lines")
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        raise _FileProblem("SKILL.md front matter is not closed by a --- line") from None
    docs = parse_yaml("\n".join(lines[1:end]), line_offset=1)
    if len(docs) != 1 or not isinstance(docs[0].data, dict):
        raise _FileProblem("SKILL.md front matter must be one mapping with name and description")
    front = docs[0]
    for reserved in ("kind", "instructions", "path"):
        if reserved in front.data:
            raise _FileProblem(f"SKILL.md front matter cannot set `{reserved}`",
                               front.positions[(reserved,)])
    body = "\n".join(lines[end + 1 :]).strip("\n")
    front.data = {"kind": "Skill", **front.data, "instructions": body}
    return SourceDocument(
        file=rel, parsed=front, base=path.parent, skill_folder=path.parent, body=body
    )


class FileStamps:
    """Tells whether a file changed since it was last seen, cheaply and safely.

    A stat key (mtime, size, inode) decides, except for a file that was read
    within two seconds of its mtime: mtimes are coarse (a kernel tick), so a
    same-size write later in that tick keeps the key. Such a "racily clean"
    file is compared by content until it is read once its mtime is old, as
    git does for its index entries.
    """

    RACY_NS = 2_000_000_000

    def __init__(self) -> None:
        self._seen: dict[Path, tuple[tuple[int, int, int], str, bool]] = {}
        self.only: set[Path] | None = None  # when set: nothing else changed (the watcher said so)

    def knows(self, path: Path) -> bool:
        return path in self._seen

    def content_digest(self, path: Path) -> str:
        """sha256 of the file's bytes, read again only when it may have changed.

        `NotRegularFile` (an OSError) for anything but a regular file, even one seen before.
        """
        if self.only is not None and path not in self.only:
            seen = self._seen.get(path)
            if seen is not None:
                return seen[1]
        st = regular_stat(path)
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        seen = self._seen.get(path)
        if seen is not None and seen[0] == key and seen[2]:
            return seen[1]
        digest = digest_bytes(read_regular(path))
        self._seen[path] = (key, digest, time.time_ns() - st.st_mtime_ns > self.RACY_NS)
        return digest

    def retain(self, paths: set[Path]) -> None:
        for path in list(self._seen):
            if path not in paths:
                del self._seen[path]


class SourceCache:
    """Parsed files keyed by content: an edit reparses only the file it touched."""

    def __init__(self, stamps: FileStamps) -> None:
        self.stamps = stamps
        self._files: dict[Path, tuple[str, tuple]] = {}

    def read(self, root: Path, path: Path) -> tuple[list[SourceDocument], list[DefinitionError]]:
        try:
            digest = self.stamps.content_digest(path)
        except OSError:
            return read_file(root, path)
        hit = self._files.get(path)
        if hit is not None and hit[0] == digest:
            return hit[1]  # type: ignore[return-value]
        result = read_file(root, path)
        self._files[path] = (digest, result)
        return result

    def retain(self, paths: list[Path]) -> None:
        keep = set(paths)
        for path in list(self._files):
            if path not in keep:
                del self._files[path]
