"""`corral.lock`: the reviewed digests of a definition set.

JSON with sorted keys and a final newline, byte-stable for the same set:
`{"version": 1, "digest", "definitions": {"kind/name": digest},
"mcp_catalogs": {server: digest}}`, with `corral lock --evals` (§12)
`"evals": {"agent/NAME": {"eval/EVAL": {"digest": EVAL_DIGEST, "run": RUN_ID,
"score"}}}`: the passing run of each Eval of each agent, for the agent digest
the lock records (no `evals` key when none was recorded), and `"a2a_cards":
{tool: digest}` (the canonical JSON of each `a2a` tool's agent card as served)
only when there is one, so a lock without either stays byte-identical.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .definitions import DefinitionSet, EvalDefinition
from .sources import read_regular

LOCK_FILE = "corral.lock"
VERSION = 1


@dataclass(frozen=True)
class Lock:
    digest: str
    definitions: dict[str, str]
    mcp_catalogs: dict[str, str] = field(default_factory=dict)
    evals: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    a2a_cards: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, definitions: DefinitionSet, mcp_catalogs: dict[str, str] | None = None,
           evals: dict[str, dict[str, dict[str, Any]]] | None = None,
           a2a_cards: dict[str, str] | None = None) -> Lock:
        return cls(definitions.digest, definitions.digests(), dict(mcp_catalogs or {}), dict(evals or {}),
                   dict(a2a_cards or {}))

    def render(self) -> str:
        body: dict[str, Any] = {
            "version": VERSION,
            "digest": self.digest,
            "definitions": self.definitions,
            "mcp_catalogs": self.mcp_catalogs,
        }
        if self.evals:
            body["evals"] = self.evals
        if self.a2a_cards:
            body["a2a_cards"] = self.a2a_cards
        return json.dumps(body, indent=2, sort_keys=True) + "\n"

    def evals_still_valid(self, definitions: DefinitionSet) -> dict[str, dict[str, dict[str, Any]]]:
        """The recorded runs that still hold for `definitions`: same agent digest, same eval digest."""
        kept: dict[str, dict[str, dict[str, Any]]] = {}
        for agent_ref, runs in self.evals.items():
            agent = definitions.digests().get(agent_ref)
            if agent is None or self.definitions.get(agent_ref) != agent:
                continue
            for eval_ref, run in runs.items():
                if definitions.digests().get(eval_ref) == run.get("digest"):
                    kept.setdefault(agent_ref, {})[eval_ref] = run
        return kept


class LockError(ValueError):
    pass


def read_lock(root: Path) -> Lock | None:
    """The lock in `root`, or None when there is none; LockError when unreadable."""
    path = root / LOCK_FILE
    try:
        data: Any = json.loads(read_regular(path).decode("utf-8"))  # a FIFO lock must not block the loop
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise LockError(f"{LOCK_FILE} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise LockError(f"{LOCK_FILE} has no supported version (expected {VERSION})")
    try:
        return Lock(str(data["digest"]), dict(data["definitions"]), dict(data.get("mcp_catalogs", {})),
                    {str(a): dict(runs) for a, runs in dict(data.get("evals", {})).items()},
                    dict(data.get("a2a_cards", {})))
    except (KeyError, TypeError, ValueError):
        raise LockError(f"{LOCK_FILE} is missing `digest` or `definitions`") from None


def write_lock(root: Path, lock: Lock) -> Path:
    path = root / LOCK_FILE
    tmp = path.with_suffix(".lock.tmp")
    tmp.write_text(lock.render(), "utf-8")
    tmp.replace(path)
    return path


@dataclass(frozen=True)
class Drift:
    ref: str
    change: str  # added | changed | removed
    locked: str | None
    current: str | None

    def __str__(self) -> str:
        if self.change == "added":
            return f"+ {self.ref} {self.current} (not in the lock)"
        if self.change == "removed":
            return f"- {self.ref} {self.locked} (locked, no longer defined)"
        return f"~ {self.ref} {self.locked} -> {self.current}"


def drift(lock: Lock, current: Lock) -> list[Drift]:
    """What differs between the lock and the current set, sorted by ref."""
    return _diff(lock.definitions, current.definitions)


def missing_evals(lock: Lock, definitions: DefinitionSet) -> list[dict[str, Any]]:
    """Each Eval of an agent that the lock records no passing run of, for the agent's locked digest
    and the Eval's current digest (what `--require-evals` refuses)."""
    held = lock.evals_still_valid(definitions)
    out = []
    for definition in sorted(definitions.evals(), key=lambda e: (e.agent, e.name)):
        assert isinstance(definition, EvalDefinition)
        agent_ref = f"agent/{definition.agent}"
        if definition.ref not in held.get(agent_ref, {}):
            out.append({"agent": definition.agent, "eval": definition.name, "eval_digest": definition.digest,
                        "message": f"{LOCK_FILE} records no passing run of eval/{definition.name} "
                                   f"({definition.digest}) for {agent_ref}"})
    return out


def catalog_drift(lock: Lock, current: Lock) -> list[Drift]:
    """What differs between the locked and the observed MCP catalogs, as `mcp/SERVER` refs."""
    return _diff({f"mcp/{k}": v for k, v in lock.mcp_catalogs.items()},
                 {f"mcp/{k}": v for k, v in current.mcp_catalogs.items()})


def card_drift(lock: Lock, current: Lock) -> list[Drift]:
    """What differs between the locked and the observed A2A cards, as `a2a/TOOL` refs."""
    return _diff({f"a2a/{k}": v for k, v in lock.a2a_cards.items()},
                 {f"a2a/{k}": v for k, v in current.a2a_cards.items()})


def _diff(locked: dict[str, str], current: dict[str, str]) -> list[Drift]:
    out = []
    for ref in sorted(set(locked) | set(current)):
        old, new = locked.get(ref), current.get(ref)
        if old == new:
            continue
        change = "added" if old is None else "removed" if new is None else "changed"
        out.append(Drift(ref, change, old, new))
    return out
