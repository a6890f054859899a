"""References between definitions: resolve them, refuse cycles, hash closures.

An agent's digest covers its closure: the spec plus `closure`, the map from
`kind/name` to digest of every definition it can reach (model and fallbacks,
the model that writes its context summaries, tools, MCP servers, hooks,
skills, sub-agents and theirs). A model with fallbacks is hashed the same
way, and so is an Eval with its judge (not its agent, §12). Everything else
hashes its spec alone.

Linking is incremental: given the `LinkState` of the previous successful
link over the same names, only the definitions whose spec changed are
checked, cycles are searched from them, and digests are recomputed only for
them and for what reaches them. A one-file edit in a set of thousands costs
in proportion to what it touches.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..canonical import digest_of
from .definitions import KIND_PATHS

Key = tuple[str, str]
Report = Callable[[Key, tuple[str | int, ...], str], None]


@dataclass
class Linked:
    spec: dict[str, Any]
    digest: str


@dataclass
class LinkState:
    """What a successful link leaves for the next one."""

    specs: dict[Key, dict[str, Any]]  # compared by identity: the compiler reuses unchanged specs
    edges: dict[Key, list[tuple[tuple, Key]]]
    linked: dict[Key, Linked]
    closures: dict[Key, dict[str, str]]


def _ref(kind: str, name: str) -> str:
    return f"{KIND_PATHS[kind]}/{name}"


def _missing(kind: str, name: str, names: list[str]) -> str:
    return f"no {kind} named {name!r}" + _hint(name, names)


class Linker:
    def __init__(self, specs: dict[Key, dict[str, Any]], own_digests: dict[Key, str],
                 report: Report, memo: dict, previous: LinkState | None = None,
                 invalid: frozenset[Key] = frozenset()):
        self.specs = specs
        # Documents that exist but failed validation: a reference to one is not dangling.
        self.invalid = invalid
        self.own = own_digests
        self.report = report
        self.memo = memo  # (own digest, closure items) -> digest, kept across compiles
        self.names: dict[str, list[str]] = {}
        self._edges: dict[Key, list[tuple[tuple, Key]]] = {}  # edges() once per key and run
        for kind, name in specs:
            self.names.setdefault(kind, []).append(name)
        self.ok = True
        # The same names as last time: what changed is all that can break or need rehashing.
        self.previous = previous if previous is not None and previous.specs.keys() == specs.keys() else None
        self.changed: set[Key] = set(specs)
        if self.previous is not None:
            self.changed = {k for k, spec in specs.items() if spec is not self.previous.specs[k]}
            self._edges = {k: e for k, e in self.previous.edges.items() if k not in self.changed}

    def has(self, kind: str, name: str) -> bool:
        return (kind, name) in self.specs or (kind, name) in self.invalid

    def error(self, key: Key, path: tuple[str | int, ...], message: str) -> None:
        self.ok = False
        self.report(key, path, message)

    def check_references(self) -> None:
        if self.previous is None:  # the same names as a link that succeeded cannot clash
            self._check_tool_names()
        for (kind, name) in self.changed:
            spec = self.specs[(kind, name)]
            if kind == "Agent":
                self._check_agent((kind, name), spec)
            elif kind == "Eval":
                self._expect((kind, name), ("agent",), "Agent", spec["agent"])
                if spec.get("judge") is not None:
                    self._expect((kind, name), ("judge",), "Model", spec["judge"])
            elif kind == "Model":
                for i, fallback in enumerate(spec["fallbacks"]):
                    if not self.has("Model", fallback):
                        self.error((kind, name), ("fallbacks", i),
                                   _missing("Model", fallback, self.names.get("Model", [])))

    def _check_tool_names(self) -> None:
        """Tool names are unique regardless of case (`Bash` and `bash` cannot both be defined)."""
        folded: dict[str, list[str]] = {}
        for name in self.names.get("Tool", []):
            folded.setdefault(name.lower(), []).append(name)
        for names in folded.values():
            for name in names if len(names) > 1 else ():
                others = " and ".join(repr(n) for n in sorted(names) if n != name)
                self.error(("Tool", name), ("name",),
                           f"Tool names are unique regardless of case: {name!r} and {others} differ "
                           "only in case; rename one")

    def _expect(self, key: Key, path: tuple, kind: str, name: str) -> None:
        if not self.has(kind, name):
            self.error(key, path, _missing(kind, name, self.names.get(kind, [])))

    def _check_agent(self, key: Key, spec: dict[str, Any]) -> None:
        self._expect(key, ("model",), "Model", spec["model"])
        summarizer = (spec.get("context") or {}).get("model")
        if summarizer is not None:
            self._expect(key, ("context", "model"), "Model", summarizer)
        for field, kind in (("agents", "Agent"), ("skills", "Skill"), ("hooks", "Hook")):
            for i, name in enumerate(spec[field]):
                self._expect(key, (field, i), kind, name)
        seen: dict[str, tuple] = {}
        for i, ref in enumerate(spec["tools"]):
            self._check_tool_ref(key, ("tools", i), ref)
            if ref in seen:
                self.error(key, ("tools", i), f"{ref!r} is listed twice")
            seen[ref] = ("tools", i)
        for i, sub in enumerate(spec["agents"]):
            if self.has("Tool", sub) and sub in spec["tools"]:
                self.error(key, ("agents", i), f"a tool and a sub-agent are both named {sub!r}")

    def _check_tool_ref(self, key: Key, path: tuple, ref: str) -> None:
        if "/" in ref:
            server, tool = ref.split("/", 1)
            if not self.has("MCPServer", server):
                self.error(key, path, _missing("MCPServer", server, self.names.get("MCPServer", [])))
                return
            if ("MCPServer", server) not in self.specs:
                return  # it failed validation: its filter is not known
            include = self.specs[("MCPServer", server)]["tools"]
            if (include["include"] is not None and tool not in include["include"]) or (
                tool in include["exclude"]
            ):
                self.error(key, path, f"MCPServer {server!r} filters out tool {tool!r}")
            return
        is_tool, is_server = self.has("Tool", ref), self.has("MCPServer", ref)
        if is_tool and is_server:
            self.error(key, path, f"{ref!r} is both a Tool and an MCPServer; rename one")
        elif not (is_tool or is_server):
            names = self.names.get("Tool", []) + self.names.get("MCPServer", [])
            self.error(key, path, f"no Tool or MCPServer named {ref!r}" + _hint(ref, names))

    def edges(self, key: Key) -> list[tuple[tuple, Key]]:
        """Outgoing references as (field path, target key)."""
        found = self._edges.get(key)
        if found is None:
            found = self._edges[key] = self._find_edges(key)
        return found

    def _find_edges(self, key: Key) -> list[tuple[tuple, Key]]:
        kind, _ = key
        spec = self.specs[key]
        if kind == "Model":
            return [(("fallbacks", i), ("Model", n)) for i, n in enumerate(spec["fallbacks"])]
        if kind == "Eval":  # its judge, not its agent: a result binds the agent's digest to the eval's
            judge = spec.get("judge")
            return [(("judge",), ("Model", judge))] if ("Model", judge) in self.specs else []
        if kind != "Agent":
            return []
        out: list[tuple[tuple, Key]] = [(("model",), ("Model", spec["model"]))]
        summarizer = (spec.get("context") or {}).get("model")
        if summarizer is not None:  # the model that writes its summaries is in its closure
            out.append((("context", "model"), ("Model", summarizer)))
        for i, ref in enumerate(spec["tools"]):
            name = ref.split("/", 1)[0]
            target = ("MCPServer", name) if "/" in ref or not self.has("Tool", ref) else ("Tool", ref)
            out.append((("tools", i), target))
        for field, kind_ in (("agents", "Agent"), ("skills", "Skill"), ("hooks", "Hook")):
            out += [((field, i), (kind_, n)) for i, n in enumerate(spec[field])]
        return [(p, t) for p, t in out if t in self.specs]

    def check_cycles(self) -> None:
        state: dict[Key, int] = {}  # 1 = on the path, 2 = done

        def visit(key: Key, trail: list[Key]) -> None:
            state[key] = 1
            for path, target in self.edges(key):
                if target[0] not in ("Agent", "Model"):
                    continue
                if state.get(target) == 1:
                    start = trail.index(target) if target in trail else len(trail)
                    loop = [*trail[start:], key, target]
                    names = " -> ".join(n for _, n in loop)
                    label = "sub-agent" if key[0] == "Agent" else "fallback"
                    self.error(key, path, f"{label} cycle: {names}")
                elif target not in state:
                    visit(target, [*trail, key])
            state[key] = 2

        # a new cycle goes through a changed definition: unchanged ones had no cycle last time
        for key in sorted(self.changed):
            if key not in state and key[0] in ("Agent", "Model"):  # nothing else is on a cycle
                visit(key, [])

    def _dirty(self) -> set[Key]:
        """Changed definitions and everything that reaches one of them."""
        reverse: dict[Key, list[Key]] = {}
        for key in self.specs:
            for _, target in self.edges(key):
                reverse.setdefault(target, []).append(key)
        dirty, pending = set(self.changed), list(self.changed)
        while pending:
            for source in reverse.get(pending.pop(), ()):
                if source not in dirty:
                    dirty.add(source)
                    pending.append(source)
        return dirty

    def digests(self) -> dict[Key, Linked]:
        closures: dict[Key, dict[str, str]] = {}
        linked: dict[Key, Linked] = {}
        if self.previous is not None:
            dirty = self._dirty()
            linked = {k: v for k, v in self.previous.linked.items() if k not in dirty}
            closures = {k: v for k, v in self.previous.closures.items() if k not in dirty}

        def resolve(key: Key) -> Linked:
            if key in linked:
                return linked[key]
            spec = self.specs[key]
            if key[0] not in ("Agent", "Model", "Eval"):
                linked[key] = Linked(spec, self.own[key])
                return linked[key]
            closure: dict[str, str] = {}
            for _, target in self.edges(key):
                closure[_ref(*target)] = resolve(target).digest
                closure.update(closures.get(target, {}))
            closures[key] = closure
            memo_key = (self.own[key], tuple(sorted(closure.items())))
            digest = self.memo.get(memo_key)
            full = {**spec, "closure": closure}
            if digest is None:
                digest = self.memo[memo_key] = digest_of(full)
            linked[key] = Linked(full, digest)
            return linked[key]

        for key in self.specs:
            resolve(key)
        self.state = LinkState(self.specs, {k: self.edges(k) for k in self.specs}, linked, closures)
        return linked


def _hint(name: str, names: list[str]) -> str:
    close = difflib.get_close_matches(name, names, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
