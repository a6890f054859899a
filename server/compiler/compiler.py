"""Compile a definition directory into a `DefinitionSet`, or every error in it.

The pipeline: find files -> parse documents -> validate each against its
kind -> normalize (read referenced files) -> resolve references and refuse
cycles -> hash. It is all-or-nothing: one error anywhere and the result is
the full list of errors, each located at FILE:LINE:COL.

A `Compiler` keeps caches between runs (parsed files, validated documents,
normalized specs, closure digests), keyed by content, so recompiling after a
one-file edit does work in proportion to the edit.
"""

from __future__ import annotations

import difflib
import gc
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from ..canonical import digest_of
from ..errors import DefinitionError, DefinitionsInvalid
from .definitions import DEFINITION_TYPES, Definition, DefinitionSet, Source
from .documents import Document, FieldProblem
from .kinds import DOCUMENT_MODELS, KINDS
from .linking import Key, Linked, Linker, LinkState
from .normalize import Normalized, NormalizeError, Normalizer
from .sources import FileStamps, SourceCache, SourceDocument, definition_files


@dataclass
class _Entry:
    source: SourceDocument
    doc: Document
    normalized: Normalized
    own_digest: str


def _field_path(path: tuple[str | int, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class Compiler:
    """Compiles one directory, again and again, reusing what did not change."""

    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()
        self.stamps = FileStamps()
        self.sources = SourceCache(self.stamps)
        self._validated: dict[int, tuple[SourceDocument, Document | None, list[DefinitionError]]] = {}
        self._normalized: dict[int, tuple[SourceDocument, Normalized, str]] = {}
        self._link_state: LinkState | None = None  # the last successful link
        self._files: tuple[list[Path], list[DefinitionError]] | None = None  # the last walk
        self._closure_memo: dict[Any, str] = {}
        # key -> (normalized, digest, source, definition) of the last compile: reused when all match
        self._built: dict[Key, tuple[Normalized, str, Source, Definition]] = {}

    def compile(self, changed: Iterable[str | Path] | None = None) -> DefinitionSet:
        """The compiled set; raises `DefinitionsInvalid` carrying every error.

        `changed`, when the caller knows it (the file watcher does), lists every path modified
        since the last compile: if they are all files already known, the directory is not walked
        again and no other file is looked at. Anything else (a new file, a deleted one) falls
        back to a full check.
        """
        # A compile allocates hundreds of thousands of long-lived, acyclic objects; the cyclic
        # collector scanning them as they appear cost a quarter of a cold compile (bench/compile.py).
        paused = gc.isenabled()
        gc.disable()
        trusted = self._trusted(changed)
        self.stamps.only = trusted
        try:
            return self._compile(trusted is not None)
        finally:
            self.stamps.only = None
            if paused:
                gc.enable()

    def _trusted(self, changed: Iterable[str | Path] | None) -> set[Path] | None:
        if changed is None or self._files is None:
            return None
        paths = {Path(p).resolve() for p in changed}
        if all(p.is_file() and self.stamps.knows(p) for p in paths):
            return paths
        return None

    def _compile(self, trusted: bool = False) -> DefinitionSet:
        if not self.root.is_dir():
            raise DefinitionsInvalid([DefinitionError(file=str(self.root), message="not a directory")])
        errors: list[DefinitionError] = []
        if trusted and self._files is not None:
            files, walk_errors = self._files
        else:
            files, walk_errors = definition_files(self.root)
        self._files = (files, walk_errors)
        errors += walk_errors
        self.sources.retain(files)
        documents: list[SourceDocument] = []
        for path in files:
            docs, file_errors = self.sources.read(self.root, path)
            documents += docs
            errors += file_errors
        every_file_read = not errors  # else a file's names are unknown: its references cannot be told
        entries = self._entries(documents, errors)
        if errors:
            if every_file_read:
                self._check_references_only(entries, documents, errors)
            raise DefinitionsInvalid(errors)
        definitions = self._link(entries, errors)
        if errors:
            raise DefinitionsInvalid(errors)
        return DefinitionSet.build(self.root, definitions)

    # --- per document ------------------------------------------------------

    def _entries(self, documents: list[SourceDocument], errors: list[DefinitionError]) -> dict[Key, _Entry]:
        entries: dict[Key, _Entry] = {}
        live = {id(d) for d in documents}
        self._validated = {k: v for k, v in self._validated.items() if k in live}
        self._normalized = {k: v for k, v in self._normalized.items() if k in live}
        normalizer = Normalizer(self.root, self.stamps)
        for source in documents:
            doc = self._validate(source, errors)
            if doc is None:
                continue
            key = (doc.kind, doc.name)
            if key in entries:
                first = entries[key].source
                pos = first.parsed.start
                errors.append(self._error(source, doc.kind, doc.name, ("name",),
                                          f"duplicate {doc.kind} name; first defined at "
                                          f"{first.file}:{pos.line}"))
                continue
            normalized = self._normalize(normalizer, source, doc, errors)
            if normalized is not None:
                entries[key] = _Entry(source, doc, *normalized)
        return entries

    def _validate(self, source: SourceDocument, errors: list[DefinitionError]) -> Document | None:
        cached = self._validated.get(id(source))
        if cached is None or cached[0] is not source:
            doc, found = validate_document(source)
            cached = self._validated[id(source)] = (source, doc, found)
        errors += cached[2]
        return cached[1]

    def _normalize(self, normalizer: Normalizer, source: SourceDocument, doc: Document,
                   errors: list[DefinitionError]) -> tuple[Normalized, str] | None:
        cached = self._normalized.get(id(source))
        if cached is not None and cached[0] is source and self._deps_unchanged(cached[1]):
            return cached[1], cached[2]
        try:
            normalized = normalizer(source, doc)
        except NormalizeError as exc:
            errors.append(self._error(source, doc.kind, doc.name, exc.field, exc.message))
            return None
        except OSError as exc:
            errors.append(self._error(source, doc.kind, doc.name, (), f"cannot read: {exc}"))
            return None
        own = digest_of(normalized.spec)
        self._normalized[id(source)] = (source, normalized, own)
        return normalized, own

    def _deps_unchanged(self, normalized: Normalized) -> bool:
        return normalized.unchanged(self.stamps)

    def _error(self, source: SourceDocument, kind: str, name: str,
               path: tuple[str | int, ...], message: str) -> DefinitionError:
        pos = source.parsed.position_of(path)
        return DefinitionError(file=source.file, line=pos.line, column=pos.column, kind=kind,
                               name=name, field=_field_path(path), message=message)

    # --- across documents --------------------------------------------------

    def _check_references_only(self, entries: dict[Key, _Entry], documents: list[SourceDocument],
                               errors: list[DefinitionError]) -> None:
        """With some documents invalid, the references of the valid ones are still checked, so an author
        sees a misspelled name in the same pass; a name of an invalid document counts as defined."""
        named = [d.parsed.data for d in documents if isinstance(d.parsed.data, dict)]
        invalid = frozenset(
            (data["kind"], data["name"]) for data in named
            if isinstance(data.get("kind"), str) and isinstance(data.get("name"), str)
        ) - entries.keys()

        def report(key: Key, path: tuple[str | int, ...], message: str) -> None:
            errors.append(self._error(entries[key].source, key[0], key[1], path, message))

        specs = {k: e.normalized.spec for k, e in entries.items()}
        Linker(specs, {k: e.own_digest for k, e in entries.items()}, report, {}, None,
               invalid).check_references()

    def _link(self, entries: dict[Key, _Entry], errors: list[DefinitionError]) -> list[Definition]:
        def report(key: Key, path: tuple[str | int, ...], message: str) -> None:
            entry = entries[key]
            errors.append(self._error(entry.source, key[0], key[1], path, message))

        linker = Linker(
            {k: e.normalized.spec for k, e in entries.items()},
            {k: e.own_digest for k, e in entries.items()},
            report,
            self._closure_memo,
            self._link_state,
        )
        linker.check_references()
        if linker.ok:
            linker.check_cycles()
        if not linker.ok:
            return []
        if len(self._closure_memo) > 50_000:
            self._closure_memo.clear()
        definitions = []
        built: dict[Key, tuple[Normalized, str, Source, Definition]] = {}
        digests = linker.digests()
        self._link_state = linker.state
        for key, linked in digests.items():
            entry = entries[key]
            source = Source(file=entry.source.file, line=entry.source.parsed.start.line)
            before = self._built.get(key)
            if before and before[0] is entry.normalized and before[1:3] == (linked.digest, source):
                definition = before[3]  # same spec object, same closure: from_spec would build its twin
            else:
                definition = self._definition(key, linked, source, entry.normalized)
            built[key] = (entry.normalized, linked.digest, source, definition)
            definitions.append(definition)
        self._built = built
        return definitions

    @staticmethod
    def _definition(key: Key, linked: Linked, source: Source, normalized: Normalized) -> Definition:
        definition = DEFINITION_TYPES[key[0]].from_spec(linked.spec, linked.digest, source)
        if normalized.folder is not None:
            object.__setattr__(definition, "folder", normalized.folder)
        return definition


# --- validation of one document -------------------------------------------


def validate_document(source: SourceDocument) -> tuple[Document | None, list[DefinitionError]]:
    data = source.parsed.data
    start = source.parsed.start

    def fail(message: str, path: tuple = (), kind: str = "", name: str = "") -> tuple:
        pos = source.parsed.position_of(path) if path else start
        return None, [DefinitionError(file=source.file, line=pos.line, column=pos.column,
                                      kind=kind, name=name, field=_field_path(path),
                                      message=message)]

    if not isinstance(data, dict):
        return fail("a document must be a mapping with `kind` and `name`")
    kind = data.get("kind")
    name = data.get("name") if isinstance(data.get("name"), str) else ""
    if kind is None:
        return fail("missing `kind` (one of " + ", ".join(KINDS) + ")", name=name)
    if not isinstance(kind, str) or kind not in DOCUMENT_MODELS:  # `kind: [Agent]` is unhashable
        close = difflib.get_close_matches(str(kind), KINDS, n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]!r}?)" if close else f" (one of {', '.join(KINDS)})"
        return fail(f"unknown kind {kind!r}{hint}", ("kind",), name=name)
    model = DOCUMENT_MODELS[kind]
    try:
        return model.model_validate(data), []
    except ValidationError as exc:
        found = [_locate(source, model, kind, name, err) for err in exc.errors()]
        return None, found


# pydantic speaks Python; the author wrote YAML, where a tuple is a list and a dict a mapping.
_YAML_WORDS = {
    "tuple_type": "Input should be a list",
    "dict_type": "Input should be a mapping",
}


def _locate(source: SourceDocument, model: type[BaseModel], kind: str, name: str,
            err: Any) -> DefinitionError:
    path = _data_path(source.parsed.data, _error_loc(err))
    message = _YAML_WORDS.get(err["type"], err["msg"].removeprefix("Value error, "))
    if err["type"] == "extra_forbidden":
        message = f"unknown field {path[-1]!r}" + _did_you_mean(model, path)
    elif err["type"] == "missing":
        message = f"required field {err['loc'][-1]!r} is missing"
        path = path[:-1] if path and path[-1] == err["loc"][-1] else path
    pos = source.parsed.position_of(path)
    return DefinitionError(file=source.file, line=pos.line, column=pos.column, kind=kind,
                           name=name, field=_field_path(path) if path else _field_path(err["loc"]),
                           message=message)


def _error_loc(err: Any) -> tuple:
    """pydantic's `loc`, taken down to the field a `FieldProblem` names."""
    problem = (err.get("ctx") or {}).get("error")
    if isinstance(problem, FieldProblem):
        return (*err["loc"], *problem.path)
    return tuple(err["loc"])


def _data_path(data: Any, loc: tuple) -> tuple[str | int, ...]:
    """The part of pydantic's `loc` that names real keys and indexes of `data`."""
    path: list[str | int] = []
    node = data
    for part in loc:
        in_list = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if in_list or (isinstance(node, dict) and part in node):
            path.append(part)
            node = node[part]
        elif isinstance(node, dict) and isinstance(part, str) and part not in node:
            path.append(part)  # a missing or unknown key: still worth naming
            break
    return tuple(path)


def _did_you_mean(model: type[BaseModel], path: tuple[str | int, ...]) -> str:
    fields = _fields_at(model, path[:-1])
    close = difflib.get_close_matches(str(path[-1]), fields, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _fields_at(model: type[BaseModel], path: tuple[str | int, ...]) -> list[str]:
    current: Any = model
    for part in path:
        if isinstance(part, int):
            continue
        info = getattr(current, "model_fields", {}).get(part)
        if info is None:
            return []
        current = _model_in(info.annotation)
        if current is None:
            return []
    return list(getattr(current, "model_fields", {}))


def _model_in(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
