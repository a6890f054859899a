"""YAML text to plain JSON-like values, remembering where every node came from.

Responsible for: turning one file's text into documents of dicts, lists and
scalars, with a map from each value's path to its line and column, so that a
validation error found later can point at the offending node. It is built on
libyaml's event stream (no node graph), which lets it bound what hostile input
can cost: nesting depth, and the number of nodes after alias expansion (the
"billion laughs" attack) are capped.

Not responsible for: what the documents mean (see `documents`), or files.

Mapping keys are always strings: their source text. JSON has no other keys,
and YAML 1.1 would otherwise read `on:` or `yes:` as booleans.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml import events

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_resolver = yaml.resolver.Resolver()
_constructor = yaml.constructor.SafeConstructor()

MAX_DEPTH = 64
MAX_NODES = 100_000

_SCALAR_TAGS = {
    "tag:yaml.org,2002:null",
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:str",
}
_MERGE = "tag:yaml.org,2002:merge"
_TIMESTAMP = "tag:yaml.org,2002:timestamp"
# First characters for which an untagged plain scalar may resolve to something other than
# a string; with a wildcard resolver (key None) any may, and the fast path is off.
_RESOLVABLE_FIRST = (
    None if None in _resolver.yaml_implicit_resolvers else frozenset(_resolver.yaml_implicit_resolvers)
)

Path = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Position:
    line: int
    column: int


class YAMLProblem(Exception):
    """The text is not YAML we accept; `position` says where."""

    def __init__(self, message: str, position: Position):
        super().__init__(message)
        self.message = message
        self.position = position


@dataclass
class ParsedDocument:
    data: Any
    start: Position
    positions: dict[Path, Position] = field(default_factory=dict)

    def position_of(self, path: Path) -> Position:
        """The position of `path`, or of its nearest ancestor that has one."""
        for end in range(len(path), 0, -1):
            found = self.positions.get(tuple(path[:end]))
            if found is not None:
                return found
        return self.start


def _position(mark: Any, line_offset: int = 0) -> Position:
    return Position(mark.line + 1 + line_offset, mark.column + 1)


@dataclass
class _Frame:
    container: dict | list
    path: Path
    nodes: int = 1
    key: str | None = None
    merges: list[tuple[Any, Position]] = field(default_factory=list)
    explicit: set[str] = field(default_factory=set)
    anchor: str | None = None
    start: Any = None


class _Builder:
    """Folds libyaml events into values; one instance per file."""

    def __init__(self, line_offset: int):
        self.line_offset = line_offset
        self.documents: list[ParsedDocument] = []
        self.stack: list[_Frame] = []
        self.anchors: dict[str, tuple[Any, int]] = {}
        self.doc: ParsedDocument | None = None
        self.nodes = 0

    def pos(self, mark: Any) -> Position:
        return _position(mark, self.line_offset)

    def feed(self, event: Any) -> None:
        if type(event) is events.ScalarEvent:  # the most frequent event by far
            self.scalar(event)
        elif isinstance(event, events.DocumentStartEvent):
            self.doc = ParsedDocument(data=None, start=self.pos(event.start_mark))
            self.anchors = {}
            self.nodes = 0
        elif isinstance(event, events.DocumentEndEvent):
            assert self.doc is not None
            if self.doc.data is not None:
                self.documents.append(self.doc)
            self.doc = None
        elif isinstance(event, events.ScalarEvent):
            self.scalar(event)
        elif isinstance(event, events.AliasEvent):
            self.alias(event)
        elif isinstance(event, events.MappingStartEvent | events.SequenceStartEvent):
            self.open(event)
        elif isinstance(event, events.MappingEndEvent | events.SequenceEndEvent):
            self.close()

    def count(self, n: int, mark: Any) -> None:
        self.nodes += n
        if self.nodes > MAX_NODES:
            raise YAMLProblem(
                f"document expands to more than {MAX_NODES} nodes (alias bomb?)", self.pos(mark)
            )

    def scalar(self, event: events.ScalarEvent) -> None:
        self.count(1, event.start_mark)
        top = self.stack[-1] if self.stack else None
        if top is not None and isinstance(top.container, dict) and top.key is None:
            self.key(top, event)
            return
        value = self.scalar_value(event)
        if event.anchor:
            self.anchors[event.anchor] = (value, 1)
        self.place(value, event.start_mark)

    def key(self, frame: _Frame, event: events.ScalarEvent) -> None:
        if event.anchor:
            self.anchors[event.anchor] = (event.value, 1)
        # An untagged plain key resolves to the merge tag exactly when it is `<<`, which
        # is then its value anyway: only an explicit tag needs looking at.
        key = "<<" if event.tag == _MERGE else event.value
        if key != "<<" and key in frame.explicit:
            raise YAMLProblem(f"duplicate key {key!r}", self.pos(event.start_mark))
        frame.key = key
        if key != "<<":
            frame.explicit.add(key)
            assert self.doc is not None
            self.doc.positions[(*frame.path, key)] = self.pos(event.start_mark)

    def scalar_value(self, event: events.ScalarEvent) -> Any:
        tag = event.tag
        if tag is None and _RESOLVABLE_FIRST is not None:
            value = event.value
            if not event.implicit[0] or (value and value[0] not in _RESOLVABLE_FIRST):
                return value  # what the resolver and the str constructor would make of it
        if tag is None or tag == "!":
            tag = _resolver.resolve(yaml.ScalarNode, event.value, event.implicit)
        if tag == _TIMESTAMP:
            return event.value
        if tag not in _SCALAR_TAGS:
            raise YAMLProblem(f"unsupported tag {tag}", self.pos(event.start_mark))
        node = yaml.ScalarNode(tag, event.value, event.start_mark, event.end_mark, event.style)
        try:
            value = _constructor.yaml_constructors[tag](_constructor, node)
        except ValueError:  # what YAML 1.1 resolves as an int may not parse as one: `0x_`, `0b_`
            kind = tag.rsplit(":", 1)[-1]
            raise YAMLProblem(f"not a valid {kind}: {event.value!r}", self.pos(event.start_mark)) from None
        if isinstance(value, float) and not math.isfinite(value):
            raise YAMLProblem("numbers must be finite (no .inf or .nan)", self.pos(event.start_mark))
        return value

    def alias(self, event: events.AliasEvent) -> None:
        top = self.stack[-1] if self.stack else None
        if top is not None and isinstance(top.container, dict) and top.key is None:
            raise YAMLProblem("an alias cannot be a mapping key", self.pos(event.start_mark))
        if event.anchor not in self.anchors:
            raise YAMLProblem(f"undefined alias *{event.anchor}", self.pos(event.start_mark))
        value, nodes = self.anchors[event.anchor]
        self.count(nodes, event.start_mark)
        self.place(value, event.start_mark, nodes=nodes)

    def open(self, event: Any) -> None:
        tag = event.tag
        if tag not in (None, "!", "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"):
            raise YAMLProblem(f"unsupported tag {tag}", self.pos(event.start_mark))
        if len(self.stack) >= MAX_DEPTH:
            raise YAMLProblem(f"nesting deeper than {MAX_DEPTH} levels", self.pos(event.start_mark))
        self.count(1, event.start_mark)
        top = self.stack[-1] if self.stack else None
        if top is not None and isinstance(top.container, dict) and top.key is None:
            raise YAMLProblem("mapping keys must be plain scalars", self.pos(event.start_mark))
        path = self.child_path(top)
        container: dict | list = {} if isinstance(event, events.MappingStartEvent) else []
        self.stack.append(_Frame(container, path, anchor=event.anchor, start=event.start_mark))

    def close(self) -> None:
        frame = self.stack.pop()
        if isinstance(frame.container, dict):
            for merged, _ in reversed(frame.merges):
                for k, v in merged.items():
                    frame.container.setdefault(k, v)
        if frame.anchor:
            self.anchors[frame.anchor] = (frame.container, frame.nodes)
        self.place(frame.container, frame.start, nodes=frame.nodes)

    def child_path(self, top: _Frame | None) -> Path:
        if top is None:
            return ()
        if isinstance(top.container, dict):
            return (*top.path, top.key or "")
        return (*top.path, len(top.container))

    def place(self, value: Any, mark: Any, nodes: int = 1) -> None:
        if not self.stack:
            assert self.doc is not None
            self.doc.data = value
            return
        top = self.stack[-1]
        top.nodes += nodes
        if isinstance(top.container, list):
            assert self.doc is not None
            self.doc.positions[(*top.path, len(top.container))] = self.pos(mark)
            top.container.append(value)
            return
        if top.key == "<<":
            self.merge(top, value, mark)
        else:
            top.container[top.key] = value
        top.key = None

    def merge(self, frame: _Frame, value: Any, mark: Any) -> None:
        sources = value if isinstance(value, list) else [value]
        for source in sources:
            if not isinstance(source, dict):
                raise YAMLProblem("a merge key (<<) takes a mapping", self.pos(mark))
            frame.merges.append((source, self.pos(mark)))


def parse_yaml(text: str, *, line_offset: int = 0) -> list[ParsedDocument]:
    """Every non-empty document in `text`; raises `YAMLProblem`."""
    builder = _Builder(line_offset)
    try:
        loader = _Loader(text)
        try:
            while loader.check_event():  # what yaml.parse does, without a generator per event
                builder.feed(loader.get_event())
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        position = _position(mark, line_offset) if mark else Position(1, 1)
        raise YAMLProblem(_syntax_message(exc, text, line_offset), position) from None
    except yaml.YAMLError as exc:
        raise YAMLProblem(str(exc), Position(1, 1)) from None
    return builder.documents


def _syntax_message(exc: yaml.MarkedYAMLError, text: str, line_offset: int) -> str:
    """libyaml's problem, said plainly: where the unclosed construct began, and tabs named.

    The error is reported where libyaml gave up, often the end of the file; the
    construct it was inside (an unclosed `[`, a quote) started elsewhere, so say where.
    """
    problem = exc.problem or "invalid YAML"
    mark = exc.problem_mark
    if mark is not None and "tab" not in problem and _char_at(text, mark.line, mark.column) == "\t":
        problem = "found a tab character; indent YAML with spaces"
    start = exc.context_mark
    if exc.context and start is not None and (mark is None or start.line != mark.line):
        where = _position(start, line_offset)
        problem += f" ({exc.context} at line {where.line}, column {where.column})"
    return problem


def _char_at(text: str, line: int, column: int) -> str:
    lines = text.split("\n")
    return lines[line][column : column + 1] if line < len(lines) else ""
