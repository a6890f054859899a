"""Compiled definitions: immutable values with a content digest.

A `Definition` is what the compiler produces from one document: its
normalized spec (deep-frozen, exactly what was hashed), its digest, and where
it came from. Typed subclasses expose the fields the runtime reads; every one
of them is taken from the spec, so a definition can be rebuilt from a stored
spec alone (that is how pinned digests outlive later edits).

A `DefinitionSet` is one compiled directory: every definition by kind and
name, and the set digest.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

from ..canonical import digest_of, freeze

KIND_PATHS = {
    "Agent": "agent",
    "Model": "model",
    "Tool": "tool",
    "MCPServer": "mcpserver",
    "Hook": "hook",
    "Skill": "skill",
    "Eval": "eval",
}
PATH_KINDS = {v: k for k, v in KIND_PATHS.items()}


@dataclass(frozen=True, kw_only=True, slots=True)
class Source:
    file: str
    line: int


@dataclass(frozen=True, kw_only=True)
class Definition:
    kind: ClassVar[str] = ""
    name: str
    description: str
    digest: str
    spec: Mapping[str, Any] = field(repr=False)
    source: Source | None = None

    @property
    def ref(self) -> str:
        """`kind/name` as paths and lock keys spell it."""
        return f"{KIND_PATHS[self.kind]}/{self.name}"

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any], digest: str, source: Source | None = None):
        spec = freeze(spec)
        typed = {
            f.name: spec[f.name]
            for f in fields(cls)
            if f.name in spec and f.name not in ("name", "description")
        }
        return cls(
            name=spec["name"],
            description=spec.get("description", ""),
            digest=digest,
            spec=spec,
            source=source,
            **typed,
        )


@dataclass(frozen=True, kw_only=True)
class ModelDefinition(Definition):
    kind: ClassVar[str] = "Model"
    provider: str
    model: str = ""
    base_url: str | None = None
    api_key: str | None = None
    context_window: int | None = None
    max_output_tokens: int = 4096
    temperature: float | None = None
    timeout_s: float = 60.0
    retries: int = 2
    fallbacks: tuple[str, ...] = ()
    script: tuple[Mapping[str, Any], ...] = ()
    default: str | None = None


@dataclass(frozen=True, kw_only=True)
class ToolDefinition(Definition):
    kind: ClassVar[str] = "Tool"
    input_schema: Mapping[str, Any]
    http: Mapping[str, Any] | None = None
    command: Mapping[str, Any] | None = None
    a2a: Mapping[str, Any] | None = None  # {url, headers, timeout_s}: a remote A2A agent
    permission: str = "allow"
    replay: str = "unsafe"  # absent from the spec when it is the default (see `normalize`)
    files: Mapping[str, str] = field(default_factory=dict)

    @property
    def replay_safe(self) -> bool:
        """Whether a call whose outcome is unknown (cut off by a crash) may simply run again."""
        return self.replay == "safe"


@dataclass(frozen=True, kw_only=True)
class MCPServerDefinition(Definition):
    kind: ClassVar[str] = "MCPServer"
    transport: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    tools: Mapping[str, Any] = field(default_factory=dict)
    timeout_s: float = 30.0
    files: Mapping[str, str] = field(default_factory=dict)

    def exposes(self, tool: str) -> bool:
        include = self.tools.get("include")
        return (include is None or tool in include) and tool not in self.tools.get("exclude", ())


@dataclass(frozen=True, kw_only=True)
class HookDefinition(Definition):
    kind: ClassVar[str] = "Hook"
    event: str
    matcher: str = ""
    command: tuple[str, ...] | None = None
    http: Mapping[str, Any] | None = None
    timeout_s: float = 60.0
    on_error: str = "allow"
    files: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class SkillDefinition(Definition):
    kind: ClassVar[str] = "Skill"
    instructions: str = ""
    files: Mapping[str, str] = field(default_factory=dict)
    # Where the folder is on disk; not part of the spec, so moving it changes no digest.
    folder: Path | None = field(default=None, compare=False)


@dataclass(frozen=True, kw_only=True)
class AgentDefinition(Definition):
    kind: ClassVar[str] = "Agent"
    model: str
    instructions: str = ""
    tools: tuple[str, ...] = ()
    agents: tuple[str, ...] = ()
    skills: tuple[str, ...] = ()
    hooks: tuple[str, ...] = ()
    max_steps: int = 10
    on_busy: str = "reject"
    # absent from the spec when not given (see `normalize`)
    budget: Mapping[str, int] | None = None  # max_tokens_per_turn, max_tokens_per_conversation
    output_schema: Mapping[str, Any] | None = None
    context: Mapping[str, Any] | None = None  # absent: the default policy (see `context_policy`)
    closure: Mapping[str, str] = field(default_factory=dict)

    @property
    def context_policy(self) -> ContextPolicy:
        """The agent's context policy (§10), defaults filled in; `model` None is the agent's own."""
        c = self.context or {}
        return ContextPolicy(strategy=c.get("strategy", "summarize"), threshold=c.get("threshold", 0.8),
                             keep_recent_turns=c.get("keep_recent_turns", 2), model=c.get("model"))


@dataclass(frozen=True, kw_only=True)
class EvalDefinition(Definition):
    """An Eval (§12); its digest covers `closure` (its judge Model and fallbacks), never its agent."""

    kind: ClassVar[str] = "Eval"
    agent: str
    cases: tuple[Mapping[str, Any], ...] = ()
    threshold: float = 1.0
    repeat: int = 1
    judge: str | None = None
    max_concurrency: int = 4
    closure: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ContextPolicy:
    strategy: str = "summarize"  # summarize | truncate | none
    threshold: float = 0.8  # of the model's context_window
    keep_recent_turns: int = 2  # kept whole before the running turn (which always is)
    model: str | None = None  # the Model that writes summaries; None: the agent's


DEFINITION_TYPES: dict[str, type[Definition]] = {
    cls.kind: cls
    for cls in (
        AgentDefinition,
        ModelDefinition,
        ToolDefinition,
        MCPServerDefinition,
        HookDefinition,
        SkillDefinition,
        EvalDefinition,
    )
}


@dataclass(frozen=True)
class DefinitionSet:
    """One compiled definition directory; immutable."""

    root: Path
    by_key: Mapping[tuple[str, str], Definition]
    digest: str
    # each agent's closure, made on first use: the set never changes, and every turn asks
    _closures: dict[str, Closure] = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def build(cls, root: Path, definitions: list[Definition]) -> DefinitionSet:
        ordered = sorted(definitions, key=lambda d: (d.kind, d.name))
        listing = [[d.kind, d.name, d.digest] for d in ordered]
        by_key = {(d.kind, d.name): d for d in ordered}
        return cls(root=root, by_key=freeze(by_key), digest=digest_of(listing))

    def __iter__(self) -> Iterator[Definition]:
        return iter(self.by_key.values())

    def __len__(self) -> int:
        return len(self.by_key)

    def get(self, kind: str, name: str) -> Definition | None:
        return self.by_key.get((kind, name))

    def of_kind(self, kind: str) -> list[Definition]:
        return [d for (k, _), d in self.by_key.items() if k == kind]

    def agents(self) -> list[AgentDefinition]:
        return self.of_kind("Agent")  # type: ignore[return-value]

    def evals(self, agent: str | None = None) -> list[EvalDefinition]:
        """The Evals, by name; with `agent`, those of that agent only."""
        found = self.of_kind("Eval")
        return [e for e in found if agent is None or e.agent == agent]  # type: ignore[attr-defined,misc]

    def closure(self, agent_name: str) -> Closure | None:
        found = self._closures.get(agent_name)
        if found is None:
            agent = self.by_key.get(("Agent", agent_name))
            if not isinstance(agent, AgentDefinition):
                return None
            found = self._closures[agent_name] = Closure.of(self, agent)
        return found

    def digests(self) -> dict[str, str]:
        """`kind/name` -> digest, as the lock file records them."""
        return {d.ref: d.digest for d in self}

    def listing(self) -> dict[str, Any]:
        """The shape of `GET /v1/definitions` and `corral digest --json`."""
        return {
            "digest": self.digest,
            "definitions": [
                {
                    "kind": d.kind,
                    "name": d.name,
                    "digest": d.digest,
                    "source": {"file": d.source.file, "line": d.source.line} if d.source else None,
                }
                for d in self
            ],
        }


@dataclass(frozen=True)
class Closure:
    """An agent and every definition it can reach: all a turn runs on.

    A turn holds its closure from start to end, so a swap of the current set
    never changes what a running turn sees.
    """

    agent: AgentDefinition
    members: Mapping[tuple[str, str], Definition]
    root: Path

    @classmethod
    def of(cls, definitions: DefinitionSet, agent: AgentDefinition) -> Closure:
        members: dict[tuple[str, str], Definition] = {("Agent", agent.name): agent}
        for ref in agent.closure:
            kind_path, name = ref.split("/", 1)
            key = (PATH_KINDS[kind_path], name)
            members[key] = definitions.by_key[key]
        return cls(agent=agent, members=freeze(members), root=definitions.root)

    def get(self, kind: str, name: str) -> Definition:
        return self.members[(kind, name)]

    def sub_closure(self, name: str) -> Closure:
        """The closure of a sub-agent, drawn from this one."""
        agent = self.members[("Agent", name)]
        assert isinstance(agent, AgentDefinition)
        keys = [("Agent", name)] + [
            (PATH_KINDS[r.split("/", 1)[0]], r.split("/", 1)[1]) for r in agent.closure
        ]
        return Closure(agent=agent, members=freeze({k: self.members[k] for k in keys}), root=self.root)

    def model_chain(self) -> list[ModelDefinition]:
        """The agent's model, then its fallbacks depth-first, each once."""
        chain: list[ModelDefinition] = []

        def add(name: str) -> None:
            model = self.members[("Model", name)]
            assert isinstance(model, ModelDefinition)
            if model not in chain:
                chain.append(model)
                for fallback in model.fallbacks:
                    add(fallback)

        add(self.agent.model)
        return chain
