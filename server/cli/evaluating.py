"""`corral eval`: run Evals (§12) in this process, or on a running server with `--url`.

Selects the evals of the directory (all; those named by `--eval`; or those
whose agent is `--agent`'s), runs each on its agent's current digest or on
`--agent REF`, prints a line per case and a verdict per eval (`--json`: the
runs), and exits 0 when all passed, 1 when one failed, 3 when a run could
not be judged (a model unreachable, a definition gone). In-process on a
state directory a server owns, it runs them on that server instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import httpx

from ..errors import EXIT_FAILED, EXIT_UNAVAILABLE, CorralError, StateOwned

POLL_WAIT_S = 60  # ?wait=S of each read of a run on a server


def add_eval_verb(verbs: argparse._SubParsersAction,
                  add_dir: Callable[[argparse.ArgumentParser], None]) -> None:
    p = verbs.add_parser("eval", help="run Evals: exit 0 all passed, 1 one failed, 3 one could not be judged",
                         description="Run the Evals of a definition directory, or of a running server.")
    add_dir(p)
    p.add_argument("--eval", action="append", default=[], metavar="NAME", help="run this eval (repeatable)")
    p.add_argument("--agent", metavar="REF", help="the evals of this agent, on this reference (NAME, "
                                                  "NAME@sha256:..., NAME@ALIAS)")
    p.add_argument("--url", help="run on the Corral server at URL instead of in this process")
    p.add_argument("--api-key", default=None, help="bearer key for --url (default $CORRAL_API_KEY)")
    p.add_argument("--json", action="store_true", help="print the runs as JSON")
    p.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    try:
        runs = anyio.run(_remote if args.url else _local, args)
    except StateOwned as exc:  # a server owns this state: the evals run there, on what it serves
        if args.url or not exc.url:
            raise
        print(f"(a server at {exc.url} owns the state directory: the evals run there)", file=sys.stderr)
        args.url = exc.url
        runs = anyio.run(_remote, args)
    if args.json:
        print(json.dumps(runs, indent=2))
    else:
        for run in runs:
            print_run(run)
    return exit_status(runs)


def exit_status(runs: Sequence[dict[str, Any]]) -> int:
    statuses = {r["status"] for r in runs}
    return EXIT_UNAVAILABLE if "error" in statuses else EXIT_FAILED if "failed" in statuses else 0


def print_run(run: dict[str, Any]) -> None:
    for case in run["cases"]:
        mark = "PASS" if case["passed"] else "FAIL"
        detail = f": {'; '.join(case['failures'])}" if case["failures"] else ""
        print(f"  {mark} {run['eval']}/{case['name']}{detail}")
    print(f"{run['status'].upper()} eval {run['eval']} on {run['agent']}@{run['agent_digest']}: "
          f"score {run['score'] or 0:.2f}, threshold {run['threshold']} (run {run['id']})")


def select(evals: Sequence[tuple[str, str]], names: Sequence[str], agent: str | None) -> list[str]:
    """The eval names to run from (name, agent name) pairs; an unknown `--eval` is a usage mistake."""
    known = {name for name, _ in evals}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise CorralError(f"no Eval named {', '.join(map(repr, unknown))}", code="invalid_request")
    agent_name = agent.partition("@")[0] if agent else None
    return [name for name, of in sorted(evals)
            if (not names or name in names) and (agent_name is None or of == agent_name)]


# --- in this process -----------------------------------------------------------------------------


async def _local(args: argparse.Namespace) -> list[dict[str, Any]]:
    import logging

    from ..compiler.compiler import Compiler
    from ..service import open_service
    from .running import settings_from

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    settings = settings_from(args).model_copy(update={"watch": False})
    # chosen before the service opens: a mistake raised inside its task group would come out wrapped
    compiled = Compiler(settings.definitions).compile()
    chosen = select([(e.name, e.agent) for e in compiled.evals()], args.eval, args.agent)
    async with open_service(settings) as service:
        assert service.evals is not None
        evals = service.evals
        started = [await evals.start(name, args.agent) for name in chosen]
        return [await evals.wait(run["id"]) for run in started]


# --- corral lock --evals ---------------------------------------------------------------------------


def lock_evals(args: argparse.Namespace, definitions: Any) -> dict[str, dict[str, dict[str, Any]]] | None:
    """The passing run of each Eval of each agent, for the agent's digest in `definitions`: found in
    the state's store, else run now (in this process). None when one did not pass (it is printed)."""
    return anyio.run(_lock_evals, args, definitions)


async def _lock_evals(args: argparse.Namespace,
                      definitions: Any) -> dict[str, dict[str, dict[str, Any]]] | None:
    from ..service import open_service
    from .running import settings_from

    settings = settings_from(args).model_copy(update={"watch": False, "locked": False})
    recorded: dict[str, dict[str, dict[str, Any]]] = {}
    failed = False
    async with open_service(settings) as service:
        assert service.evals is not None
        evals = service.evals
        pending = []
        for definition in sorted(definitions.evals(), key=lambda e: (e.agent, e.name)):
            agent = definitions.get("Agent", definition.agent).digest
            found = await evals.passing(definition.name, definition.digest, agent)
            pending.append(found or await evals.start(definition.name, f"{definition.agent}@{agent}"))
        for run in pending:
            if run["status"] == "running":
                run = await evals.wait(run["id"])
                print_run(run)
            else:
                print(f"PASSED eval {run['eval']} on {run['agent']}@{run['agent_digest']}: run {run['id']} "
                      "(recorded before)")
            failed = failed or run["status"] != "passed"
            recorded.setdefault(f"agent/{run['agent']}", {})[f"eval/{run['eval']}"] = {
                "digest": run["eval_digest"], "run": run["id"], "score": run["score"]}
    return None if failed else recorded


# --- on a server ---------------------------------------------------------------------------------


async def _remote(args: argparse.Namespace) -> list[dict[str, Any]]:
    key = args.api_key or os.environ.get("CORRAL_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(base_url=args.url, headers=headers, timeout=POLL_WAIT_S + 30) as client:
        listed = await _call(client, "GET", "/v1/evals")
        chosen = select([(e["name"], e["agent"]) for e in listed["items"]], args.eval, args.agent)
        body = {"agent": args.agent} if args.agent else {}
        started = [await _call(client, "POST", f"/v1/evals/{name}/runs", body, expect=202) for name in chosen]
        ended = []
        for run in started:
            while run["status"] == "running":
                run = await _call(client, "GET", f"/v1/evals/runs/{run['id']}?wait={POLL_WAIT_S}")
            ended.append(run)
        return ended


async def _call(client: httpx.AsyncClient, method: str, path: str, body: Any = None,
                expect: int = 200) -> Any:
    from .chat_backends import refused

    try:
        response = await client.request(method, path, json=body)
    except httpx.HTTPError as exc:
        raise CorralError(f"{client.base_url}: cannot reach the server: {exc or type(exc).__name__}",
                          code="unreachable") from None
    if response.status_code != expect:
        raise refused(response, str(client.base_url))
    return response.json()
