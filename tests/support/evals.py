"""A definition tree with Evals whose every outcome is designed, on the offline `scripted` model.

The agent `clerk` calls one tool per turn, chosen by the message's first word
(`alpha`, `beta`, `gamma`), and answers `WORD:{tool_result}`; any other
message is echoed. Each tool, if it ever ran, would create a marker file
(`MARKER` under the tree): every case gives their results instead, so the
marker must never appear. The judge passes an answer holding `good`, fails
one holding `bad`, and answers something that is not JSON for `garbled`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx

from tests.support.trees import write_tree

MARKER = "tool-ran.marker"


def tool(name: str, marker: Path) -> str:
    return f"""
        kind: Tool
        name: {name}
        input_schema: {{type: object, properties: {{x: {{type: integer}}}}}}
        command: {{argv: [sh, -c, "touch {marker}; echo real-{name}"]}}
        """


def agent_yaml(reply_prefix: str = "") -> str:
    words = enumerate(("alpha", "beta", "gamma"), 1)
    rules = "\n".join(f"""          - when: "^{word}"
            tool_call: {{name: {word}, arguments: {{x: {i}}}}}
            reply: "{reply_prefix}{word}:{{tool_result}}" """ for i, word in words)
    return f"""
        kind: Model
        name: clerk-model
        provider: scripted
        script:
{rules}
        default: "{reply_prefix}{{input}}"
        ---
        kind: Agent
        name: clerk
        model: clerk-model
        tools: [alpha, beta, gamma]
        """


JUDGE = """
    kind: Model
    name: judge
    provider: scripted
    script:
      - when: "Answer:\\\\n.*good"
        reply: '{"pass": true, "reason": "good enough"}'
      - when: "Answer:\\\\n.*bad"
        reply: '{"pass": false, "reason": "the answer is bad"}'
      - when: "Answer:\\\\n.*garbled"
        reply: "I think it passes"
    default: '{"pass": false, "reason": "no rule"}'
    """


def eval_tree(root: Path, evals: str, *, reply_prefix: str = "") -> Path:
    """`clerk`, its tools, the judge, and `evals` (YAML documents) under `root`."""
    marker = root.parent / MARKER
    tools = "\n---\n".join(tool(n, marker) for n in ("alpha", "beta", "gamma"))
    return write_tree(root, {"agent.yaml": agent_yaml(reply_prefix), "tools.yaml": tools,
                             "judge.yaml": JUDGE, "evals.yaml": evals})


STUBS = "tool_results: {alpha: one, beta: two, gamma: three}"


async def run_eval(client: httpx.AsyncClient, name: str, agent: str | None = None) -> dict[str, Any]:
    """Start a run of `name` over HTTP and read it until it ended."""
    r = await client.post(f"/v1/evals/{name}/runs", json={"agent": agent} if agent else {})
    assert r.status_code == 202, r.text
    run = r.json()
    assert run["status"] == "running"
    with anyio.fail_after(60):
        while run["status"] == "running":
            r = await client.get(f"/v1/evals/runs/{run['id']}", params={"wait": 30})
            assert r.status_code == 200, r.text
            run = r.json()
    return run


def by_case(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in run["cases"]}
