"""`Eval` documents compiled like every kind, and `corral eval` in-process and with `--url` (§1, §12)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
import httpx
import pytest

from server.compiler.compiler import Compiler
from tests.support.evals import MARKER, STUBS, agent_yaml, eval_tree
from tests.support.servers import REPO, ServerProcess, clean_environ, corral_server
from tests.support.trees import copy_definitions, write_atomic

EVALS = f"""
    kind: Eval
    name: good
    agent: clerk
    judge: judge
    cases:
      - name: tool
        input: alpha
        {STUBS}
        expect: {{tools: [{{name: alpha}}], output: {{equals: "alpha:one"}}}}
      - name: rubric
        input: a good answer
        expect: {{rubric: the answer is good}}
    ---
    kind: Eval
    name: bad
    agent: clerk
    cases:
      - name: echo
        input: hello
        expect: {{output: {{equals: goodbye}}}}
    """


def corral(*args: str, state: Path, timeout: float = 120,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "server.cli", *args], cwd=REPO, capture_output=True,
                          text=True, env=clean_environ({"CORRAL_STATE_DIR": str(state), **(env or {})}),
                          timeout=timeout)


def test_corral_eval_in_process_exit_statuses_and_json(tmp_path: Path) -> None:
    defs = eval_tree(tmp_path / "defs", EVALS)
    state = tmp_path / "state"
    good = corral("eval", str(defs), "--eval", "good", state=state)
    bad = corral("eval", str(defs), "--json", state=state)
    unknown = corral("eval", str(defs), "--eval", "nope", state=state)
    by_agent = corral("eval", str(defs), "--agent", "clerk", "--eval", "good", "--json", state=state)

    assert good.returncode == 0, good.stderr
    assert "  PASS good/tool" in good.stdout and "  PASS good/rubric" in good.stdout
    assert "PASSED eval good on clerk@sha256:" in good.stdout
    assert bad.returncode == 1, bad.stderr
    runs = {r["eval"]: r for r in json.loads(bad.stdout)}
    assert {n: r["status"] for n, r in runs.items()} == {"bad": "failed", "good": "passed"}
    assert runs["bad"]["cases"][0]["failures"] == ["the answer is not 'goodbye': 'hello'"]
    assert unknown.returncode == 2 and "no Eval named 'nope'" in unknown.stderr
    assert [r["eval"] for r in json.loads(by_agent.stdout)] == ["good"]
    assert not (tmp_path / MARKER).exists()


def test_a_run_that_cannot_be_judged_exits_3(tmp_path: Path) -> None:
    defs = eval_tree(tmp_path / "defs", EVALS.replace("judge: judge", "judge: gone") + """
    ---
    kind: Model
    name: gone
    provider: openai
    model: gpt-x
    base_url: http://127.0.0.1:9/v1
    api_key: ${NO_SUCH_KEY}
    retries: 0
    timeout_s: 5
    """)
    done = corral("eval", str(defs), "--eval", "good", state=tmp_path / "state")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "ERROR eval good" in done.stdout and "the judge could not grade: model_error" in done.stdout


@pytest.mark.anyio
async def test_corral_eval_on_a_server_with_url(tmp_path: Path) -> None:
    defs = eval_tree(tmp_path / "defs", EVALS)
    with anyio.fail_after(120), corral_server(defs, tmp_path / "state") as url:
        done = await anyio.to_thread.run_sync(lambda: corral("eval", "--url", url, "--json",
                                                             state=tmp_path / "cli-state"))
        pinned = await anyio.to_thread.run_sync(lambda: corral(
            "eval", "--url", url, "--agent", f"clerk@{json.loads(done.stdout)[0]['agent_digest']}",
            "--eval", "good", state=tmp_path / "cli-state"))
    gone = corral("eval", "--url", url, state=tmp_path / "cli-state")

    assert done.returncode == 1, done.stderr
    assert {r["eval"]: r["status"] for r in json.loads(done.stdout)} == {"bad": "failed", "good": "passed"}
    assert pinned.returncode == 0 and "PASSED eval good" in pinned.stdout
    assert gone.returncode == 3 and "cannot reach the server" in gone.stderr


# --- compiled like every kind ----------------------------------------------------------------------


def test_eval_errors_are_located_at_file_line_col(tmp_path: Path) -> None:
    defs = eval_tree(tmp_path / "defs", """
        kind: Eval
        name: broken
        agent: clerk
        cases:
          - name: one
            input: hi
            expect: {output: {contain: hi}, tools_order: random}
        ---
        kind: Eval
        name: dangling
        agent: clark
        judge: jduge
        cases:
          - name: one
            input: hi
            expect: {rubric: polite}
        ---
        kind: Eval
        name: twice
        agent: clerk
        cases:
          - name: one
            input: hi
          - name: one
            input: [hi, again]
        ---
        kind: Eval
        name: unjudged
        agent: clerk
        cases:
          - name: one
            input: hi
            expect: {rubric: polite}
        """)
    done = corral("validate", str(defs), state=tmp_path / "state")
    lines = done.stderr.splitlines()
    assert done.returncode == 1
    assert "evals.yaml:7:23: Eval/broken: cases[0].expect.output.contain: unknown field 'contain' " \
           "(did you mean 'contains'?)" in lines
    order = "evals.yaml:7:37: Eval/broken: cases[0].expect.tools_order: "
    assert any(line.startswith(order) for line in lines)
    assert "evals.yaml:11:1: Eval/dangling: agent: no Agent named 'clark' (did you mean 'clerk'?)" in lines
    assert "evals.yaml:12:1: Eval/dangling: judge: no Model named 'jduge' (did you mean 'judge'?)" in lines
    assert "evals.yaml:24:5: Eval/twice: cases[1].name: case 'one' is named twice" in lines
    assert "evals.yaml:33:14: Eval/unjudged: cases[0].expect.rubric: a rubric needs the eval's " \
           "`judge` Model" in lines


def test_an_evals_digest_covers_its_judge_not_its_agent(tmp_path: Path) -> None:
    defs = eval_tree(tmp_path / "defs", EVALS)
    first = Compiler(defs).compile()
    write_atomic(defs / "agent.yaml", agent_yaml(reply_prefix="v2 "))
    agent_edited = Compiler(defs).compile()
    write_atomic(defs / "judge.yaml", (defs / "judge.yaml").read_text().replace("good enough", "fine"))
    judge_edited = Compiler(defs).compile()
    write_atomic(defs / "evals.yaml", EVALS.replace("input: hello", "input: [hello]").replace(
        "  cases:", "  threshold: 1.0\n    repeat: 1\n    cases:", 1))
    same_meaning = Compiler(defs).compile()

    def digest(definitions, kind: str, name: str) -> str:
        return definitions.get(kind, name).digest

    assert digest(agent_edited, "Agent", "clerk") != digest(first, "Agent", "clerk")
    assert digest(agent_edited, "Eval", "good") == digest(first, "Eval", "good")
    assert digest(judge_edited, "Eval", "good") != digest(agent_edited, "Eval", "good")
    assert digest(judge_edited, "Eval", "bad") == digest(agent_edited, "Eval", "bad")  # it has no judge
    assert digest(same_meaning, "Eval", "bad") == digest(judge_edited, "Eval", "bad")
    assert dict(first.get("Eval", "good").closure) == {"model/judge": digest(first, "Model", "judge")}
    assert "eval/good" in first.digests()


def test_the_evals_example_passes_and_its_lock_records_the_run(tmp_path: Path) -> None:
    defs = copy_definitions(REPO / "examples" / "evals", tmp_path / "evals")
    state = tmp_path / "state"
    locked = corral("lock", str(defs), "--evals", state=state)
    checked = corral("lock", str(defs), "--check", "--require-evals", state=state)
    assert locked.returncode == 0, locked.stdout + locked.stderr
    assert locked.stdout.count("  PASS support-basics/") == 3
    lock = json.loads((defs / "corral.lock").read_text())
    assert set(lock["evals"]["agent/support"]) == {"eval/support-basics"}
    assert checked.returncode == 0, checked.stdout


def test_corral_eval_on_a_state_a_server_owns_runs_on_that_server(tmp_path: Path) -> None:
    defs = eval_tree(tmp_path / "defs", EVALS)
    state = tmp_path / "state"
    with ServerProcess(defs, state) as server:
        server.start()
        done = corral("eval", str(defs), "--eval", "good", "--json", state=state)
        runs = httpx.get(server.url + "/v1/evals/good/runs", timeout=10, trust_env=False).json()["items"]
    assert done.returncode == 0, done.stderr
    assert f"a server at {server.url} owns the state directory" in done.stderr
    assert [r["id"] for r in json.loads(done.stdout)] == [r["id"] for r in runs]


def test_the_schema_of_a_definition_document_knows_evals(tmp_path: Path) -> None:
    done = corral("schema", state=tmp_path / "state")
    schema = json.loads(done.stdout)
    assert "Eval" in schema["properties"]["kind"]["enum"]
    case = schema["$defs"]["EvalCase"]["properties"]
    assert {"name", "input", "tool_results", "expect"} <= set(case)
    assert "schema" in schema["$defs"]["OutputExpectation"]["properties"]  # as the author writes it
