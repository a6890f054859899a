"""`corral lock` and A2A: the digest of each `a2a` tool's agent card, fetched now (CONTRACT §14).

`--check` fetches only when the lock has cards (a lock without them is
checked offline, as before A2A); a card that cannot be fetched is printed and
the command exits `unreachable`.
"""

from __future__ import annotations

import os
import sys

from ..compiler.definitions import DefinitionSet, ToolDefinition
from ..compiler.lockfile import Lock


def a2a_cards(definitions: DefinitionSet, locked: Lock | None, check: bool) -> dict[str, str] | None:
    """The card digests to lock (or check), keyed by tool name; None when a card could not be fetched."""
    old = dict(locked.a2a_cards) if locked else {}
    tools = [t for t in definitions.of_kind("Tool") if isinstance(t, ToolDefinition) and t.a2a is not None]
    if not tools or (check and not old):
        return old if check else {}
    import anyio

    from ..tools.a2a import CardsUnavailable, observe_cards

    try:
        return anyio.run(observe_cards, definitions, dict(os.environ))
    except CardsUnavailable as exc:
        for name, error in sorted(exc.failures.items()):
            print(f"error: a2a/{name}: {error}", file=sys.stderr)
        return None
