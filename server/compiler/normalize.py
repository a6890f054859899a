"""From a validated document to its normalized spec: what gets hashed.

The spec is the document's dump with defaults filled in, plus the content of
every file it points to inside the definition directory: an
`instructions_file` is read into `instructions`; a skill folder becomes
`files` (path within the folder -> content digest); an argv element naming a
file becomes a directory-relative path whose content digest is in `files`.
Where a file sits, and which YAML file a document came from, are not part of
the spec, so moving things around changes no digest. Some defaults are left
out rather than filled in: a Tool's `replay: unsafe`, an Agent's absent
`budget` (or one without limits), `output_schema` and default `context`, fields added after
digests were pinned and locked, so that adding them changed no existing digest.

Every file is read through `sources.read_regular` (via `FileStamps`): a
FIFO, socket or device where a file is expected is an error naming it. An
argv element is looked up as a path only when it could be one; a long
`python -c` script is an argument, not a file name that is too long.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .documents import (
    AgentDocument,
    ContextPolicy,
    Document,
    HookDocument,
    MCPServerDocument,
    SkillDocument,
    ToolDocument,
)
from .sources import (
    SKILL_FILE,
    FileStamps,
    NotRegularFile,
    PathEscape,
    SourceDocument,
    confine,
    read_regular,
    relative,
)

MAX_SKILL_FILES = 1000
DEFAULT_CONTEXT = ContextPolicy().model_dump(mode="json")
NAME_MAX = 255  # bytes in one path component (Linux, macOS)
PATH_MAX = 4096  # bytes in a whole path (Linux; macOS allows 1024, which only makes more lookups fail)


class NormalizeError(ValueError):
    """An author error found while reading referenced files; `field` is its path."""

    def __init__(self, field: tuple[str | int, ...], message: str):
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass
class Normalized:
    spec: dict[str, Any]
    deps: dict[Path, str] = field(default_factory=dict)  # files read -> content digest
    folder: Path | None = None
    absent: set[Path] = field(default_factory=set)  # argv paths that named no file (yet)
    listings: dict[Path, tuple[str, ...]] = field(default_factory=dict)  # skill folder -> its files

    def unchanged(self, stamps: FileStamps) -> bool:
        """Whether normalizing again would read the same files: none edited, added or removed."""
        try:
            return (
                all(stamps.content_digest(p) == d for p, d in self.deps.items())
                and not any(_names_file(p) for p in self.absent)
                and all(_listing(f) == names for f, names in self.listings.items())
            )
        except OSError:
            return False


class Normalizer:
    def __init__(self, root: Path, stamps: FileStamps):
        self.root = root
        self.stamps = stamps

    def __call__(self, source: SourceDocument, doc: Document) -> Normalized:
        out = Normalized(spec=doc.model_dump(mode="json", by_alias=False))
        handler: Callable[[SourceDocument, Any, Normalized], None] | None = {
            "Agent": self._agent,
            "Tool": self._tool,
            "Hook": self._hook,
            "MCPServer": self._mcpserver,
            "Skill": self._skill,
        }.get(doc.kind)
        if handler is not None:
            handler(source, doc, out)
        return out

    # --- files ---------------------------------------------------------------

    def _confined(self, source: SourceDocument, written: str, where: tuple) -> Path:
        try:
            return confine(self.root, source.base, written)
        except PathEscape as exc:
            raise NormalizeError(where, str(exc)) from None

    def _digest(self, path: Path, where: tuple) -> str:
        try:
            return self.stamps.content_digest(path)
        except NotRegularFile as exc:
            raise NormalizeError(where, f"{relative(self.root, path)} {exc.strerror}") from None

    def _read_text(self, path: Path, out: Normalized, where: tuple) -> str:
        try:
            data = read_regular(path)
            out.deps[path] = self.stamps.content_digest(path)
            return data.decode("utf-8")
        except FileNotFoundError:
            raise NormalizeError(where, f"file not found: {relative(self.root, path)}") from None
        except NotRegularFile as exc:
            if exc.is_dir:
                raise NormalizeError(where, "names a directory, not a file") from None
            raise NormalizeError(where, f"{relative(self.root, path)} {exc.strerror}") from None
        except UnicodeDecodeError:
            raise NormalizeError(where, "file is not UTF-8 text") from None

    def _argv(self, source: SourceDocument, argv: list[str], out: Normalized, where: tuple) -> list[str]:
        """Argv elements naming files inside the directory count by content."""
        files: dict[str, str] = out.spec.setdefault("files", {})
        result = []
        for i, item in enumerate(argv):
            result.append(self._argv_item(source, item, files, out, (*where, i)))
        return result

    def _argv_item(self, source, item: str, files: dict, out: Normalized, where: tuple) -> str:
        if "{" in item or item.startswith("-") or os.path.isabs(item) or not item:
            return item
        candidate = source.base / item
        if not _names_file(candidate):
            if _may_be_path(candidate):
                out.absent.add(candidate)  # it may become a file: `unchanged` looks again
            return item
        # A FIFO, socket or device counts as a file here, so that the digest refuses it.
        path = self._confined(source, item, where)
        rel = relative(self.root, path)
        digest = self._digest(path, where)
        files[rel] = digest
        out.deps[path] = digest
        return rel

    def _cwd(self, source: SourceDocument, cwd: str | None, where: tuple) -> str | None:
        if cwd is None:
            return None
        path = self._confined(source, cwd, where)
        if not path.is_dir():
            raise NormalizeError(where, f"cwd is not a directory: {cwd}")
        return relative(self.root, path)

    # --- kinds ---------------------------------------------------------------

    def _agent(self, source: SourceDocument, doc: AgentDocument, out: Normalized) -> None:
        spec = out.spec
        # `budget` and `output_schema` came after digests were pinned: absent, they are left out
        # (a budget without limits is no budget), so an agent without them keeps its digest.
        budget = {k: v for k, v in (spec.pop("budget", None) or {}).items() if v is not None}
        if budget:
            spec["budget"] = budget
        if spec.get("output_schema", ...) is None:
            del spec["output_schema"]
        # `context` came later too: the default policy (written out or not) is left out, and a
        # summary model that is the agent's own is the default
        context = spec.pop("context", None) or {}
        if context.get("model") == spec["model"]:
            context["model"] = None
        if context and context != DEFAULT_CONTEXT:
            spec["context"] = context
        written = spec.pop("instructions_file")
        if written is not None:
            path = self._confined(source, written, ("instructions_file",))
            spec["instructions"] = self._read_text(path, out, ("instructions_file",))

    def _tool(self, source: SourceDocument, doc: ToolDocument, out: Normalized) -> None:
        # `replay` came after digests were in use (pinned turns, lock files): its default is left
        # out of the spec, so a Tool written before it, or with `replay: unsafe`, keeps its digest.
        if out.spec.get("replay") == "unsafe":
            del out.spec["replay"]
        if out.spec.get("a2a", "") is None:  # came later too (§14): a Tool without it keeps its digest
            del out.spec["a2a"]
        command = out.spec.get("command")
        if command is not None:
            out.spec["files"] = {}
            command["argv"] = self._argv(source, command["argv"], out, ("command", "argv"))
            command["cwd"] = self._cwd(source, command["cwd"], ("command", "cwd"))

    def _hook(self, source: SourceDocument, doc: HookDocument, out: Normalized) -> None:
        out.spec["files"] = {}
        if out.spec.get("command") is not None:
            out.spec["command"] = self._argv(source, out.spec["command"], out, ("command",))

    def _mcpserver(self, source: SourceDocument, doc: MCPServerDocument, out: Normalized) -> None:
        spec = out.spec
        spec["files"] = {}
        if spec["transport"] == "stdio":
            files = spec["files"]
            spec["command"] = self._argv_item(source, spec["command"], files, out, ("command",))
            spec["args"] = self._argv(source, spec["args"], out, ("args",))
            spec["cwd"] = self._cwd(source, spec["cwd"], ("cwd",))

    def _skill(self, source: SourceDocument, doc: SkillDocument, out: Normalized) -> None:
        spec = out.spec
        written = spec.pop("path")
        if source.skill_folder is not None:
            folder = source.skill_folder
            if folder.name != doc.name:
                raise NormalizeError(("name",), f"must match its folder name {folder.name!r}")
            spec["instructions"] = source.body
        elif written is not None:
            folder = self._confined(source, written, ("path",))
            if not folder.is_dir():
                raise NormalizeError(("path",), f"not a directory: {written}")
            if spec["instructions"] is None:
                skill_md = folder / SKILL_FILE
                if not skill_md.exists():
                    raise NormalizeError(("path",), "needs instructions, or a SKILL.md in the folder")
                spec["instructions"] = _markdown_body(self._read_text(skill_md, out, ("path",)))
        else:
            spec["files"] = {}
            return
        # A SKILL.md document has no `path` field: its folder's faults belong to the document.
        where = ("path",) if source.skill_folder is None else ()
        spec["files"] = self._folder_files(folder, out, where)
        out.folder = folder

    def _folder_files(self, folder: Path, out: Normalized, where: tuple) -> dict[str, str]:
        files: dict[str, str] = {}
        for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
            dirnames.sort()
            for name in sorted(filenames):
                path = Path(dirpath) / name
                if path.is_symlink():
                    target = path.resolve()
                    if folder not in target.parents:
                        rel = relative(self.root, path)
                        raise NormalizeError(where, f"{rel} is a symlink out of the skill folder")
                if len(files) >= MAX_SKILL_FILES:
                    raise NormalizeError(where, f"more than {MAX_SKILL_FILES} files in the skill")
                digest = self._digest(path, where)
                files[path.relative_to(folder).as_posix()] = digest
                out.deps[path] = digest
        out.listings[folder] = tuple(files)
        return files


def _may_be_path(path: Path) -> bool:
    """Whether the OS could look `path` up at all: no NUL, no component or whole too long."""
    raw = os.fsencode(path)
    return b"\0" not in raw and len(raw) <= PATH_MAX and all(len(c) <= NAME_MAX for c in raw.split(b"/"))


def _names_file(path: Path) -> bool:
    """Whether `path` names something other than a directory (a regular file, a FIFO, a device...).

    Only what could be a path is looked up, and a lookup that fails for any reason means no.
    """
    if not _may_be_path(path):
        return False
    try:
        return not stat.S_ISDIR(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def _listing(folder: Path) -> tuple[str, ...]:
    """The files under `folder`, in the order `_folder_files` finds them."""
    names: list[str] = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        dirnames.sort()
        names += [(Path(dirpath) / name).relative_to(folder).as_posix() for name in sorted(filenames)]
    return tuple(names)


def _markdown_body(text: str) -> str:
    """A SKILL.md's body: the text after its front matter, if it has one."""
    lines = text.split("\n")
    if lines and lines[0].strip() == "---":
        for i in range(1, len(lines)):
            if lines[i].strip() == "---":
                return "\n".join(lines[i + 1 :]).strip("\n")
    return text.strip("\n")
