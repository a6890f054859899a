"""Eval runs: one agent digest checked against one eval digest, stored, never changed once ended (§12).

`EvalRuns.start` resolves the eval (current set) and the agent (any
reference, to one exact digest), stores the run `running`, announces
`eval.started` on `/v1/events`, and runs it in its own task group; its end
is stored once (`Store.end_eval_run` changes only a running run) and
announced as `eval.finished`. Both are told to the other replicas too (an
`eval` notice naming the run), which read the run from the store and
announce it on their own `/v1/events`. `wait` follows a run to its end: here
through an event; a run another replica runs, woken by its notice (and
reading the store every `RECHECK_S` in case a notice was lost).

Cost bounds: each case runs `repeat` times; at most the eval's
`max_concurrency` of them at once, and at most `CORRAL_EVAL_MAX_CONCURRENCY`
case runs at once across every run of this process, so eval turns never take
more than that share of the turns this replica serves
(`CORRAL_MAX_CONCURRENT_TURNS` is the serving bound; eval turns count in it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import anyio
from anyio.abc import TaskGroup

from ..clock import iso
from ..compiler.definitions import EvalDefinition, ModelDefinition
from ..deployment.registry import Registry, split_ref
from ..errors import CorralError, RequestError
from ..ids import new_id
from ..messages import Usage
from ..runtime.conversations import Conversations
from ..runtime.plans import Runtime
from ..store.base import Store
from ..store.evals import EvalRunQuery
from .cases import CaseContext, CaseRun, run_case
from .judge import Judge, judge_chain
from .stand_ins import EvalStandIns, StandInPermissions

log = logging.getLogger("corral.evals")
RECHECK_S = 1.0  # a run another replica runs is read again this often while waited for

Publish = Callable[[str, dict[str, Any]], None]


def _not_found(message: str, **details: str) -> RequestError:
    return RequestError(message, code="not_found", details=details)


class EvalRuns:
    def __init__(self, store: Store, registry: Registry, conversations: Conversations, runtime: Runtime,
                 publish: Publish, *, max_concurrency: int = 4):
        self.store = store
        self.registry = registry
        self.conversations = conversations
        self.runtime = runtime
        self.publish = publish
        self.limiter = anyio.CapacityLimiter(max_concurrency)
        self.stand_ins = EvalStandIns(store)
        runtime.stand_ins = self.stand_ins
        if runtime.permissions is not None:  # a call whose result is given asks no person
            runtime.permissions = StandInPermissions(runtime.permissions, self.stand_ins)  # type: ignore[assignment]
        self._tg: TaskGroup | None = None
        self._ended: dict[str, anyio.Event] = {}
        self._elsewhere: dict[str, anyio.Event] = {}  # runs of other replicas waited for here
        # notices arrive in the store's callbacks, outside any task: handed to `_relay_notices`
        self._notices, self._arrived = anyio.create_memory_object_stream[dict[str, Any]](256)
        store.subscribe(self._on_notice)

    async def run(self, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """Own the task group runs go on in, until cancelled."""
        if self.store.embedded:  # one process per store: a run still `running` was cut off by its stop
            await self._end_abandoned()
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(self._relay_notices)
            task_status.started()
            await anyio.sleep_forever()

    async def _end_abandoned(self) -> None:
        for run in await self.store.list_eval_runs(EvalRunQuery(status="running", limit=1000)):
            cases = [{**c, "passed": False} for c in run["cases"]]
            log.warning("eval run %s was cut off by the server's stop: it ends as an error", run["id"])
            await self._end({**run, "status": "error", "cases": cases, "ended_at": iso(time.time())})

    # --- starting ------------------------------------------------------------

    def definition(self, name: str) -> EvalDefinition:
        found = self.registry.current.get("Eval", name)
        if not isinstance(found, EvalDefinition):
            raise _not_found(f"no Eval named {name!r}", eval=name)
        return found

    async def start(self, name: str, agent: str | None = None) -> dict[str, Any]:
        """Store a new run of eval `name` on `agent` (default: its agent's current digest) and start it."""
        definition = self.definition(name)
        ref = agent or definition.agent
        if split_ref(ref)[0] != definition.agent:
            raise RequestError(f"eval {name!r} checks agent {definition.agent!r}, not {ref!r}",
                               details={"eval": name, "agent": ref})
        closure = await self.registry.resolve(ref)
        judge = self._judge(definition)
        now = time.time()
        run = {
            "id": new_id("evalrun"), "eval": name, "eval_digest": definition.digest,
            "agent": definition.agent, "agent_digest": closure.agent.digest, "status": "running",
            "score": None, "threshold": definition.threshold, "cases": [],
            "usage": Usage().to_json(), "started_at": iso(now), "ended_at": None,
        }
        await self.store.save_eval_run(run, now)
        self._ended[run["id"]] = anyio.Event()
        await self._announce("eval.started", run)
        assert self._tg is not None, "EvalRuns.run is not running"
        self._tg.start_soon(self._execute, definition, run, judge)
        return run

    def start_soon(self, names: list[str]) -> None:
        """Start a run of each eval named, in the background (on its agent's current digest)."""
        assert self._tg is not None, "EvalRuns.run is not running"
        self._tg.start_soon(self._start_each, names)

    async def _start_each(self, names: list[str]) -> None:
        for name in names:
            try:
                await self.start(name)
            except CorralError as exc:  # gone by now (another swap), or the store failed: said, not raised
                log.warning("eval %s could not start after a swap: %s", name, exc.message)

    def _judge(self, definition: EvalDefinition) -> Judge | None:
        if definition.judge is None:
            return None
        models = {m.name: m for m in self.registry.current.of_kind("Model") if isinstance(m, ModelDefinition)}
        return Judge(judge_chain(models, definition.judge), self.runtime.provider)

    # --- running ---------------------------------------------------------------

    async def _execute(self, definition: EvalDefinition, run: dict[str, Any], judge: Judge | None) -> None:
        ctx = CaseContext(self.conversations, f"{run['agent']}@{run['agent_digest']}", run["eval"], run["id"],
                          self.stand_ins, judge)
        outcomes: dict[str, list[CaseRun]] = {c["name"]: [] for c in definition.cases}
        bound = anyio.CapacityLimiter(definition.max_concurrency)
        ended: dict[str, Any] | None = None
        try:
            async with anyio.create_task_group() as tg:
                for _ in range(definition.repeat):
                    for case in definition.cases:
                        tg.start_soon(self._once, ctx, case, bound, outcomes[case["name"]])
            ended = verdict(run, definition, outcomes)
        finally:
            if ended is None:  # cut off (the server stopping): it can no longer be judged
                ended = {**verdict(run, definition, outcomes), "status": "error"}
            with anyio.CancelScope(shield=True):
                await self._end(ended)

    async def _once(self, ctx: CaseContext, case: Any, bound: anyio.CapacityLimiter,
                    into: list[CaseRun]) -> None:
        async with bound, self.limiter:
            try:
                into.append(await run_case(ctx, case))
            except Exception as exc:  # a bug must not leave the run running forever: it is an error
                log.exception("eval %s case %s", ctx.eval, case["name"])
                into.append(CaseRun(error=f"internal: {exc}"))

    async def _end(self, run: dict[str, Any]) -> None:
        try:
            await self.store.end_eval_run(run)
        except CorralError as exc:
            log.error("eval run %s ended %s but could not be stored: %s", run["id"], run["status"], exc)
        log.info("eval %s on %s: %s (score %s)", run["eval"], run["agent_digest"], run["status"],
                 run["score"])
        await self._announce("eval.finished", run)
        event = self._ended.pop(run["id"], None)
        if event is not None:
            event.set()

    # --- across replicas ------------------------------------------------------------

    async def _announce(self, name: str, run: dict[str, Any]) -> None:
        self.publish(name, {"run": run})
        try:
            await self.store.notify({"t": "eval", "e": name, "id": run["id"]})
        except CorralError as exc:  # the others miss the event; their readers still find the run stored
            log.warning("the other replicas were not told of eval run %s: %s", run["id"], exc.message)

    def _on_notice(self, notice: dict[str, Any]) -> None:
        if notice.get("t") in ("eval", "resync"):
            try:
                self._notices.send_nowait(notice)
            except anyio.WouldBlock:  # far behind: the waiters' own rereads cover what is dropped
                log.warning("an eval notice was dropped: too many arrived at once")

    async def _relay_notices(self) -> None:
        async for notice in self._arrived:
            if notice.get("t") == "resync":  # notices may have been lost: every waiter reads the store
                for event in self._elsewhere.values():
                    event.set()
            else:
                await self._relay(str(notice.get("e")), str(notice.get("id")))

    async def _relay(self, name: str, run_id: str) -> None:
        """Another replica's run started or ended: announce it here, wake who waits for it."""
        try:
            run = await self.store.get_eval_run(run_id)
        except CorralError as exc:
            log.warning("eval run %s of another replica could not be read: %s", run_id, exc.message)
            return
        if run is not None and name in ("eval.started", "eval.finished"):
            self.publish(name, {"run": run})
        event = self._elsewhere.get(run_id)
        if event is not None and name == "eval.finished":
            event.set()

    # --- reading -----------------------------------------------------------------

    async def get(self, run_id: str, wait: float = 0.0) -> dict[str, Any]:
        """The run; with `wait`, once it ended or `wait` seconds passed, whichever is first."""
        run = await self.store.get_eval_run(run_id)
        if run is None:
            raise _not_found(f"no eval run {run_id!r}", run_id=run_id)
        with anyio.move_on_after(wait):
            while run["status"] == "running":
                event = self._ended.get(run_id)
                if event is not None:
                    await event.wait()
                else:  # running on another replica: its notice says when it ended
                    await self._wait_elsewhere(run_id)
                run = await self.store.get_eval_run(run_id) or run
        return run

    async def _wait_elsewhere(self, run_id: str) -> None:
        event = self._elsewhere.setdefault(run_id, anyio.Event())
        try:
            with anyio.move_on_after(RECHECK_S):
                await event.wait()
        finally:
            if self._elsewhere.get(run_id) is event:
                del self._elsewhere[run_id]

    async def wait(self, run_id: str) -> dict[str, Any]:
        return await self.get(run_id, wait=float("inf"))

    async def runs(self, name: str, agent: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        digest = None
        if agent is not None:
            digest = (await self.registry.resolve(agent)).agent.digest
        return await self.store.list_eval_runs(EvalRunQuery(eval=name, agent_digest=digest, limit=limit))

    async def latest(self, definition: EvalDefinition, agent_digest: str) -> dict[str, Any] | None:
        """The newest run of this eval digest on `agent_digest`, if any."""
        found = await self.store.list_eval_runs(EvalRunQuery(
            eval=definition.name, eval_digest=definition.digest, agent_digest=agent_digest, limit=1))
        return found[0] if found else None

    async def passing(self, name: str, eval_digest: str, agent_digest: str) -> dict[str, Any] | None:
        """The newest passed run of that eval digest on that agent digest, if any."""
        found = await self.store.list_eval_runs(EvalRunQuery(
            eval=name, eval_digest=eval_digest, agent_digest=agent_digest, status="passed", limit=1))
        return found[0] if found else None


def verdict(run: dict[str, Any], definition: EvalDefinition,
            outcomes: dict[str, list[CaseRun]]) -> dict[str, Any]:
    """The ended run: each case passes when every one of its runs did; `error` when any was not judged."""
    cases, total, errored = [], Usage(), False
    for case in definition.cases:
        runs = outcomes[case["name"]]
        many = len(runs) > 1
        failures: list[str] = []
        usage = Usage()
        for i, one in enumerate(runs, 1):
            prefix = f"run {i}: " if many else ""
            if one.error is not None:
                errored = True
                failures.append(f"{prefix}could not be judged: {one.error}")
            failures += [prefix + f for f in one.failures]
            usage = usage + one.usage
        total = total + usage
        cases.append({"name": case["name"], "passed": bool(runs) and all(r.passed for r in runs),
                      "failures": failures,
                      "conversation_ids": [r.conversation_id for r in runs if r.conversation_id],
                      "usage": usage.to_json()})
    score = sum(c["passed"] for c in cases) / len(cases)
    status = "error" if errored else "passed" if score >= definition.threshold else "failed"
    return {**run, "status": status, "score": score, "cases": cases, "usage": total.to_json(),
            "ended_at": iso(time.time())}
