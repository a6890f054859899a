"""The registry: the definition set being served, and every agent closure served.

It resolves what a client names — `name` (the current definition),
`name@sha256:…` (an exact digest, whenever it was served) — to a `Closure`.
Swapping the set is one reference assignment: turns hold the closure they
started with, so they never see a half-applied set.
"""

from __future__ import annotations

from .canonical import is_digest
from .definitions import Closure, DefinitionSet
from .errors import RequestError


class AgentNotFound(RequestError):
    code = "agent_not_found"


class DigestNotFound(RequestError):
    code = "digest_not_found"


def split_ref(ref: str) -> tuple[str, str | None]:
    """`name@pin` -> (name, pin); `name` -> (name, None)."""
    name, _, pin = ref.partition("@")
    return name, (pin or None)


class Registry:
    def __init__(self, definitions: DefinitionSet):
        self.current = definitions
        self._served: dict[str, Closure] = {}
        self._remember(definitions)

    def _remember(self, definitions: DefinitionSet) -> None:
        for agent in definitions.agents():
            if agent.digest not in self._served:
                closure = definitions.closure(agent.name)
                assert closure is not None
                self._served[agent.digest] = closure

    def swap(self, definitions: DefinitionSet) -> DefinitionSet:
        """Serve `definitions` from now on; returns the set it replaced."""
        previous, self.current = self.current, definitions
        self._remember(definitions)
        return previous

    def resolve(self, ref: str) -> Closure:
        name, pin = split_ref(ref)
        if pin is None:
            closure = self.current.closure(name)
            if closure is None:
                raise AgentNotFound(f"no agent named {name!r}", details={"agent": name})
            return closure
        if not is_digest(pin):
            raise RequestError(f"{ref!r}: pin an agent as name@sha256:<64 hex digits>")
        closure = self._served.get(pin)
        if closure is None or closure.agent.name != name:
            raise DigestNotFound(f"agent {name!r} was never served with digest {pin}",
                                 details={"agent": name, "digest": pin})
        return closure
