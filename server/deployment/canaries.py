"""Canaries (§12): an alias may send a share of its new conversations to another digest.

An alias with a canary `{digest, weight}` sends each conversation created on
`NAME@ALIAS` to the canary digest with probability `weight`, else to the
alias's digest, drawn once at creation: the conversation is pinned to what it
drew (`NAME@DIGEST`, shown in its `digest`), so later moves of the alias or
of the canary never move it. Each draw is recorded, so the alias's listing
can count, per side, the conversations created and their turns completed and
failed. Promoting moves the alias to its canary; ending drops the canary.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from ..canonical import is_digest
from ..store.base import Store
from .registry import split_ref


@dataclass(frozen=True)
class Drawn:
    """The side a new conversation on an alias drew: its reference from now on is `ref`."""

    agent: str
    alias: str
    digest: str

    @property
    def ref(self) -> str:
        return f"{self.agent}@{self.digest}"

    async def record(self, store: Store, conversation_id: str) -> None:
        await store.record_canary_draw(self.agent, self.alias, conversation_id, self.digest, time.time())


async def draw(store: Store, ref: str, chance=random.random) -> Drawn | None:
    """For `NAME@ALIAS` whose alias has a canary, the side drawn; None for any other reference."""
    name, pin = split_ref(ref)
    if pin is None or is_digest(pin):
        return None
    rules = await store.get_alias_rules(name, pin)
    if rules.canary_digest is None:
        return None
    stable = await store.get_alias(name, pin)
    if stable is None:  # the alias is gone: resolving the reference says so
        return None
    canary = chance() < (rules.canary_weight or 0.0)
    return Drawn(name, pin, rules.canary_digest if canary else stable)
