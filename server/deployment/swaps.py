"""Hot swap: compile the directory again and swap the result in, atomically.

Every trigger (the file watcher, `POST /v1/definitions/reload`, SIGHUP) calls
`Swapper.reload`, one at a time. The new set is compiled in a worker thread
(a cold compile of a large set must not stall running turns), checked
against `corral.lock` in locked mode, and swapped in with one assignment.
A cancelled reload (shutdown) stops waiting for its compile at once: the
compile runs in a daemon thread, so even one stuck forever holds up neither
SIGTERM nor the interpreter's exit, and the next compile waits for it to end
rather than share the compiler's caches with it.
Each reload yields a `SwapReport` (`reports`): status `applied` /
`rejected` / `unchanged`, the set digests, the changes, the conversations
busy on a changed or removed agent (asked of `running`, which the run stage
provides), and the errors. The report is returned, logged as one line, kept
in the store's history and published on the server-wide event stream.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from typing import Any, TypeVar

import anyio

from ..clock import iso
from ..compiler.compiler import Compiler
from ..compiler.definitions import DefinitionSet
from ..compiler.lockfile import Lock, LockError, drift, missing_evals, read_lock
from ..errors import CorralError, DefinitionsInvalid
from ..ids import new_id
from ..metrics import Metrics
from ..store.base import DefinitionStore, TurnRecord
from ..tracing import names, spans
from .registry import Registry
from .reports import BusyTurn, Change, SwapReport

log = logging.getLogger("corral.swaps")
RunningTurns = Callable[[], Awaitable[Iterable[TurnRecord]]]
Publish = Callable[[str, dict[str, Any]], None]  # a server-wide event: name, data
T = TypeVar("T")


async def run_abandonable(func: Callable[..., T], *args: Any) -> T:
    """`func(*args)` in a daemon thread; a cancelled caller stops waiting for it at once.

    Not `to_thread.run_sync(func, abandon_on_cancel=True)` alone: anyio's worker threads are
    not daemons, so one stuck in `func` would keep the process alive after the event loop ends.
    Here the anyio worker only waits on `done`, which a cancellation sets too.
    """
    done = threading.Event()
    outcome: list[tuple[bool, Any]] = []

    def work() -> None:
        try:
            outcome.append((True, func(*args)))
        except BaseException as exc:
            outcome.append((False, exc))
        finally:
            done.set()

    context = contextvars.copy_context()
    threading.Thread(target=context.run, args=(work,), name="corral-compile", daemon=True).start()
    try:
        await anyio.to_thread.run_sync(done.wait, abandon_on_cancel=True)
    finally:
        done.set()  # cancelled: the waiting worker goes back to its pool; `work` runs on, unwatched
    ok, value = outcome[0]
    if ok:
        return value
    raise value


def lock_errors(definitions: DefinitionSet, require_evals: bool = False) -> list[dict[str, Any]]:
    """Why `definitions` may not run in locked mode; empty when it matches corral.lock (and, with
    `require_evals`, when the lock records a passing run of every agent's Evals, §12)."""
    try:
        locked = read_lock(definitions.root)
    except LockError as exc:
        return [{"code": "lock_mismatch", "message": str(exc)}]
    if locked is None:
        return [{"code": "lock_mismatch", "message": "locked mode needs a corral.lock; run `corral lock`"}]
    drifted = [
        {"code": "lock_mismatch", "message": f"{d.ref} drifted from corral.lock ({d.change})",
         "ref": d.ref, "locked": d.locked, "current": d.current}
        for d in drift(locked, Lock.of(definitions))
    ]
    if drifted or not require_evals:
        return drifted
    return [{"code": "evals_required", **gap} for gap in missing_evals(locked, definitions)]


def _trace(report: SwapReport, started_ns: int) -> None:
    """The swap as a span of its own (`corral.swap`): a rejection is its failure."""
    name, attributes = names.swap(report.trigger, report.status, report.previous, report.current,
                                  len(report.changes), len(report.busy))
    error = str(report.errors[0].get("code", "definitions_invalid")) if report.errors else None
    spans.record(name, attributes, started_ns, error=error)


def check_locked(definitions: DefinitionSet, require_evals: bool = False) -> None:
    """Refuse to start in locked mode when the set differs from corral.lock (or, with `require_evals`,
    when the lock records no passing run of an agent's Eval)."""
    errors = lock_errors(definitions, require_evals)
    if errors:
        raise CorralError("the definitions differ from corral.lock: "
                          + "; ".join(e["message"] for e in errors), code="lock_mismatch", details=errors)


def _digest_of(definitions: DefinitionSet, agent: str) -> str | None:
    found = definitions.get("Agent", agent)
    return found.digest if found else None


def changes_between(previous: DefinitionSet, current: DefinitionSet) -> tuple[Change, ...]:
    old, new = previous.by_key, current.by_key
    out = []
    for key in sorted(set(old) | set(new)):
        before, after = old.get(key), new.get(key)
        if before is not None and after is not None and before.digest == after.digest:
            continue
        change = "added" if before is None else "removed" if after is None else "changed"
        out.append(Change(kind=key[0], name=key[1], change=change, before=before.digest if before else None,
                          after=after.digest if after else None))
    return tuple(out)


class Swapper:
    def __init__(self, compiler: Compiler, registry: Registry, running: RunningTurns,
                 store: DefinitionStore, publish: Publish, metrics: Metrics, *, locked: bool,
                 replica: str | None = None, require_evals: bool = False):
        self.compiler = compiler
        self.registry = registry
        self.running = running  # the turns in progress (the run stage knows them, not this one)
        self.store = store
        self.publish = publish
        self.metrics = metrics
        self.locked = locked
        self.require_evals = require_evals  # locked: the lock must record each agent's passing evals
        self.replica = replica
        self.listeners: list[Callable[[SwapReport], Awaitable[None]]] = []  # told of applied swaps
        self._one_at_a_time = anyio.Lock()
        self._rejected = False  # the last report was a rejection
        self._compiling = threading.Lock()  # held by the compile thread, abandoned or not

    async def history(self, *, limit: int, after: str | None) -> list[dict[str, Any]]:
        """Past swaps (every replica's), newest first, as recorded (`GET /v1/definitions/history`)."""
        return await self.store.list_swaps(limit=limit, after=after)

    async def reload(self, trigger: str, changed: Iterable[str] | None = None) -> SwapReport:
        """Compile and swap; `changed` (from the watcher) lets the compiler look at those paths only."""
        async with self._one_at_a_time:
            started_ns = time.time_ns()
            previous = self.registry.current
            report = SwapReport(id=new_id("swap"), at=iso(time.time()), trigger=trigger, status="unchanged",
                                previous=previous.digest, current=previous.digest, replica=self.replica)
            try:
                candidate = await run_abandonable(self._compile, changed)
            except DefinitionsInvalid as exc:
                report = replace(report, status="rejected", errors=tuple(
                    {"code": "definitions_invalid", **e.as_dict()} for e in exc.errors))
            else:
                report = await self._consider(previous, candidate, report)
            await self._announce(report)
            _trace(report, started_ns)
            return report

    def _compile(self, changed: Iterable[str] | None) -> DefinitionSet:
        with self._compiling:
            return self.compiler.compile(changed)

    async def _consider(self, previous: DefinitionSet, candidate: DefinitionSet,
                        report: SwapReport) -> SwapReport:
        if self.locked:
            errors = lock_errors(candidate, self.require_evals)
            if errors:
                return replace(report, status="rejected", errors=tuple(errors), attempted=candidate.digest)
        if candidate.digest == previous.digest:
            return report
        report = replace(report, status="applied", current=candidate.digest,
                         changes=changes_between(previous, candidate))
        touched = report.touched_agents()
        await self.registry.swap(candidate)
        # Listed after the swap: a turn that started while it was being applied ran on the old set too.
        busy = tuple(
            BusyTurn(conversation_id=t.conversation_id, agent=t.agent, digest=t.digest, turn_id=t.id,
                     since=iso(t.started_at))
            for t in await self.running()
            if t.agent in touched and t.digest != _digest_of(candidate, t.agent)
        )
        return replace(report, busy=busy)

    async def _announce(self, report: SwapReport) -> None:
        self.metrics.swaps.inc(report.status)
        # An unchanged report after a rejection is news too: the files compile again to the set being
        # served. It is kept in the history as well, so that a console loaded later does not take the
        # rejection before it for the state of things.
        if report.status != "unchanged" or self._rejected:
            body = report.to_json()
            await self.store.record_swap(report.id, time.time(), report.status, body)
            name = "definitions.rejected" if report.status == "rejected" else "definitions.swapped"
            self.publish(name, body)
        self._rejected = report.status == "rejected"
        if report.status == "applied":
            for listener in self.listeners:
                try:
                    await listener(report)
                except Exception:
                    log.exception("a swap listener failed")
        log.log(logging.WARNING if report.status == "rejected" else logging.INFO, "%s", report.summary())
