"""Eval benchmark (§12): what a case of an eval costs against a plain turn, on the `scripted` model.

One `corral serve` process on a tree with one agent (a scripted model) and
one Eval of `CASES` single-turn cases, each checking its answer and that no
tool was called (a tool call costs a turn and a case alike; left out, the
figure is the eval's own overhead). In alternation, `ROUNDS` times: `CASES`
plain turns (each in a fresh conversation, as a case runs: create, then one
message), then one run of the eval. The server's CPU (`/proc/PID/stat`) is read around each part, so
the figures are the server's alone: CPU per plain turn, CPU per case (its
conversation, turn, stand-in, checks and the run's storage), and wall time
per case at the eval's `max_concurrency`. Target: a case costs at most 1.5x
a turn's CPU. `--check` exits 1 when it is missed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
CASES = 50
ROUNDS = 3
TARGET = 1.5  # x a plain turn's server CPU, per single-turn case

AGENT = """
kind: Model
name: m
provider: scripted
script:
  - when: "^look (?P<what>\\\\w+)"
    tool_call: {name: lookup, arguments: {what: "{what}"}}
    reply: "found {tool_result}"
default: "{input}"
---
kind: Tool
name: lookup
input_schema: {type: object, properties: {what: {type: string}}}
command: {argv: [echo, "{what}"]}
---
kind: Agent
name: clerk
model: m
tools: [lookup]
"""


def case_yaml(i: int) -> str:
    return textwrap.indent(textwrap.dedent(f"""\
        - name: case-{i}
          input: hello item{i}
          tool_results: {{lookup: "item{i} in stock"}}
          expect:
            no_tools: [lookup]
            output: {{equals: "hello item{i}", not_contains: stock}}"""), "  ")


def evals_yaml(cases: int) -> str:
    body = "\n".join(case_yaml(i) for i in range(cases))
    return f"kind: Eval\nname: stock\nagent: clerk\nmax_concurrency: 4\ncases:\n{body}\n"


def cpu_of(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def plain_turns(client: httpx.Client, n: int) -> None:
    for i in range(n):
        conversation = client.post("/v1/conversations", json={"agent": "clerk"}).json()
        r = client.post(f"/v1/conversations/{conversation['id']}/messages",
                        json={"content": f"hello item{i}"})
        assert r.status_code == 200 and r.json()["status"] == "completed", r.text


def eval_run(client: httpx.Client) -> dict:
    run = client.post("/v1/evals/stock/runs", json={}).json()
    while run["status"] == "running":
        run = client.get(f"/v1/evals/runs/{run['id']}", params={"wait": 30}).json()
    assert run["status"] == "passed", run
    return run


def measure(rounds: int, cases: int) -> dict[str, float]:
    from tests.support.servers import ServerProcess

    with tempfile.TemporaryDirectory(prefix="corral-bench-evals-") as tmp:
        defs = Path(tmp) / "defs"
        defs.mkdir()
        (defs / "agent.yaml").write_text(AGENT)
        (defs / "evals.yaml").write_text(evals_yaml(cases))
        with ServerProcess(defs, Path(tmp) / "state") as server:
            server.start()
            assert server.proc is not None
            pid = server.proc.pid
            with httpx.Client(base_url=server.url, timeout=120, trust_env=False) as client:
                plain_turns(client, 5)  # warm-up: imports, first connections, caches
                eval_run(client)
                turn_cpu, case_cpu, case_wall = [], [], []
                for _ in range(rounds):
                    before = cpu_of(pid)
                    plain_turns(client, cases)
                    turn_cpu.append((cpu_of(pid) - before) / cases)
                    before, started = cpu_of(pid), time.perf_counter()
                    eval_run(client)
                    case_wall.append((time.perf_counter() - started) / cases)
                    case_cpu.append((cpu_of(pid) - before) / cases)
    return {"turn_cpu_ms": statistics.median(turn_cpu) * 1000,
            "case_cpu_ms": statistics.median(case_cpu) * 1000,
            "case_wall_ms": statistics.median(case_wall) * 1000}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench evals", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the target is missed")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--cases", type=int, default=CASES)
    args, _ = parser.parse_known_args(argv)
    sys.path.insert(0, str(ROOT))
    found = measure(args.rounds, args.cases)
    ratio = found["case_cpu_ms"] / found["turn_cpu_ms"]
    print(f"evals: {args.cases} single-turn cases, median of {args.rounds} rounds")
    print(f"  plain turn (fresh conversation): server CPU {found['turn_cpu_ms']:.2f} ms")
    print(f"  eval case: server CPU {found['case_cpu_ms']:.2f} ms ({ratio:.2f}x a turn; "
          f"target <= {TARGET}x), wall {found['case_wall_ms']:.1f} ms per case")
    return 1 if args.check and ratio > TARGET else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
