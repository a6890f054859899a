"""Which conversations have tool results given in place of their tools: eval cases' (§12).

The run that created a case's conversation registers its `tool_results` here
for as long as it runs (`given`). A turn of an eval conversation that this
process did not start (a replica took it over after a crash) finds them
through the store: the conversation's `corral_eval` mark names the run, the
run its eval digest, the stored eval its case. So a tool given a result in a
case never runs, wherever the turn goes on. Any other conversation is looked
up once and then remembered as having none (a bounded memory).

`StandInPermissions` wraps the permission broker the same way: a call that
will not run (its result is given) asks no person, whatever the tool's
`permission: ask`; its hooks and a `deny` still apply, as they would.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from ..store.base import Store

REMEMBERED = 10_000  # conversations known to have no results given


class EvalStandIns:
    def __init__(self, store: Store):
        self.store = store
        self._given: dict[str, Mapping[str, str]] = {}
        self._none: OrderedDict[str, None] = OrderedDict()

    @contextmanager
    def given(self, conversation_id: str, results: Mapping[str, str]) -> Iterator[None]:
        self._given[conversation_id] = dict(results)
        try:
            yield
        finally:
            self._given.pop(conversation_id, None)

    async def results(self, conversation_id: str) -> Mapping[str, str] | None:
        found = self._given.get(conversation_id)
        if found is not None or conversation_id in self._none:
            return found
        found = await self._stored(conversation_id)
        if found is None:
            self._none[conversation_id] = None
            while len(self._none) > REMEMBERED:
                self._none.popitem(last=False)
        return found

    async def _stored(self, conversation_id: str) -> Mapping[str, str] | None:
        conversation = await self.store.get_conversation(conversation_id)
        mark: Any = (conversation.metadata or {}).get("corral_eval") if conversation else None
        if not isinstance(mark, dict):
            return None
        run = await self.store.get_eval_run(str(mark.get("run_id")))
        stored = await self.store.get_definition(run["eval_digest"]) if run else None
        if stored is None:  # a mark without its run: refuse every tool rather than run one
            return _REFUSED
        for case in stored.spec.get("cases", ()):
            if case.get("name") == mark.get("case"):
                return dict(case.get("tool_results") or {})
        return _REFUSED


class StandInPermissions:
    """The permission broker, answering `ask` itself for a call whose result an eval case gives."""

    def __init__(self, broker: Any, stand_ins: EvalStandIns):
        self.broker = broker
        self.stand_ins = stand_ins

    def __getattr__(self, name: str) -> Any:
        return getattr(self.broker, name)

    async def request(self, ctx: Any, tool: str, arguments: dict[str, Any],
                      reason: str | None) -> tuple[bool, str]:
        given = await self.stand_ins.results(ctx.conversation_id)
        if given is not None and tool in given:
            return True, "its result is given by the eval case: it does not run"
        return await self.broker.request(ctx, tool, arguments, reason)


class _Refused(dict):
    """Every tool name has a result: a refusal to run it."""

    def __contains__(self, name: object) -> bool:
        return True

    def __missing__(self, name: str) -> str:
        return "(this eval conversation's run is unknown here: its tools do not run)"


_REFUSED = _Refused()
