"""The registry: the definition set being served, and every agent closure ever served.

It resolves what a client names — `name` (the current definition),
`name@sha256:…` (an exact digest, whenever it was served, restarts
included), `name@alias` (a movable alias) — to a `Closure`; anything else
(`name@`, `@alias`, `a@b@c`) is a 400, wherever the reference came from.
Swapping the set is one reference assignment: turns hold the closure they
started with, so they never see a half-applied set.

Every definition served is saved in the store, content-addressed, so a
pinned digest can be rebuilt from its specs after the files have changed or
the process restarted; so is every file a definition points to, so a
replica that never compiled a digest still runs exactly its content.
"""

from __future__ import annotations

import re
import time
from typing import Any

from ..canonical import is_digest
from ..compiler.definitions import (
    DEFINITION_TYPES,
    PATH_KINDS,
    AgentDefinition,
    Closure,
    Definition,
    DefinitionSet,
)
from ..errors import AgentNotFound, DigestNotFound, RequestError
from ..store.base import DefinitionStore, StoredDefinition, StoredFile
from .vault import NO_VAULT, FileVault

ALIAS = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
REF_FORMS = "NAME, NAME@sha256:<64 hex digits> or NAME@ALIAS"


def is_alias(text: str) -> bool:
    """An alias name: what `PUT /v1/agents/{name}/aliases/{alias}` accepts (never digest-like)."""
    return ALIAS.match(text) is not None and not text.startswith("sha256")


def split_ref(ref: str) -> tuple[str, str | None]:
    """`name@pin` -> (name, pin); `name` -> (name, None); anything else is a `RequestError`.

    The one parser of references, so every surface (conversations, the OpenAI `model`, MCP's
    `agent`) refuses `name@`, `@pin` or `a@b@c` alike rather than reading them as something else.
    """
    name, at, pin = ref.partition("@")
    if not name or (at and not (is_digest(pin) or is_alias(pin))):
        raise RequestError(f"{ref!r} is not an agent reference; use {REF_FORMS}",
                           details={"agent": ref})
    return name, (pin or None)


class Registry:
    def __init__(self, definitions: DefinitionSet, store: DefinitionStore, files: FileVault = NO_VAULT):
        self.current = definitions
        self.store = store
        self.files = files
        self._served: dict[str, Closure] = {}
        self._shared: set[str] = set()  # file digests this process has saved in the store
        self._remember(definitions)

    def _remember(self, definitions: DefinitionSet) -> None:
        for agent in definitions.agents():
            if agent.digest not in self._served:
                closure = definitions.closure(agent.name)
                assert closure is not None
                self._served[agent.digest] = closure

    async def persist(self, definitions: DefinitionSet) -> None:
        """Save every definition of `definitions` (known digests are skipped by the store)."""
        now = time.time()
        shared: list[StoredFile] = []
        for d in definitions:
            files = getattr(d, "files", None)
            if files:
                self.files.keep(getattr(d, "folder", None) or definitions.root, files)
                shared += self._unshared(files)
        # files first: a replica that finds a definition in the store finds its files there too
        await self.store.save_files(shared)
        self._shared.update(f.digest for f in shared)
        await self.store.save_definitions([
            StoredDefinition(kind=d.kind, name=d.name, digest=d.digest, spec=dict(d.spec), first_seen=now)
            for d in definitions
        ])

    def _unshared(self, files: dict[str, str]) -> list[StoredFile]:
        """The kept copies of `files` not yet saved in the store by this process."""
        out = []
        for rel, digest in files.items():
            kept = self.files.kept(rel, digest)
            if digest in self._shared or kept is None:
                continue
            out.append(StoredFile(digest=digest, data=kept.read_bytes(), mode=kept.stat().st_mode & 0o777))
        return out

    async def swap(self, definitions: DefinitionSet) -> DefinitionSet:
        """Serve `definitions` from now on; returns the set it replaced."""
        await self.persist(definitions)
        previous, self.current = self.current, definitions
        self._remember(definitions)
        return previous

    async def resolve(self, ref: str) -> Closure:
        name, pin = split_ref(ref)
        if pin is None:
            closure = self.current.closure(name)
            if closure is None:
                raise AgentNotFound(f"no agent named {name!r}", details={"agent": name})
            return closure
        digest = pin if is_digest(pin) else await self._alias(name, pin)
        closure = self._served.get(digest) or await self._load(digest)
        if closure is None or closure.agent.name != name:
            raise DigestNotFound(f"agent {name!r} was never served with digest {digest}",
                                 details={"agent": name, "digest": digest})
        return closure

    # --- aliases (`PUT/GET/DELETE /v1/agents/{name}/aliases`): names for a digest, moved by hand ---

    async def set_alias(self, name: str, alias: str, digest: str) -> None:
        await self.store.set_alias(name, alias, digest, time.time())

    async def aliases(self, name: str) -> list[dict[str, Any]]:
        """The agent's aliases: `{"alias", "digest", "updated_at"}` each."""
        return await self.store.list_aliases(name)

    async def delete_alias(self, name: str, alias: str) -> bool:
        """Whether the agent had that alias."""
        return await self.store.delete_alias(name, alias)

    async def _alias(self, name: str, alias: str) -> str:
        digest = await self.store.get_alias(name, alias)
        if digest is None:
            raise AgentNotFound(f"agent {name!r} has no alias {alias!r}",
                                details={"agent": name, "alias": alias})
        return digest

    async def _load(self, digest: str) -> Closure | None:
        """Rebuild a closure served before this process started, from stored specs."""
        stored = await self.store.get_definition(digest)
        if stored is None or stored.kind != "Agent":
            return None
        agent = _definition(stored)
        assert isinstance(agent, AgentDefinition)
        members: dict[tuple[str, str], Definition] = {("Agent", agent.name): agent}
        for ref, member_digest in agent.closure.items():
            member = await self.store.get_definition(member_digest)
            if member is None:
                return None
            members[(PATH_KINDS[ref.split("/", 1)[0]], member.name)] = _definition(member)
        for member in members.values():
            await self._fetch_files(member)
        closure = Closure(agent=agent, members=members, root=self.current.root)
        self._served[digest] = closure
        return closure

    async def _fetch_files(self, definition: Definition) -> None:
        """Keep here the files of a definition compiled elsewhere (or before a restart), from the store."""
        for rel, digest in (getattr(definition, "files", None) or {}).items():
            if self.files.directory is None or self.files.kept(rel, digest) is not None:
                continue
            stored = await self.store.get_file(digest)
            if stored is not None:
                self.files.put(rel, digest, stored.data, stored.mode)


def _definition(stored: StoredDefinition) -> Definition:
    return DEFINITION_TYPES[stored.kind].from_spec(stored.spec, stored.digest)
