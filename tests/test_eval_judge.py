"""A rubric graded by a judge on the OpenAI wire protocol (§12): the fake model server plays the judge.

The agent runs on the offline `scripted` model; the judge is an `openai` Model
pointed at `FakeOpenAI`, so what the judge is sent (the rubric and the answer
in one user message) and how its reply is read (a fenced JSON object passes;
prose fails the case, saying so; its tokens count in the case's usage) are
checked on the wire.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from tests.fakes import FakeOpenAI, Reply, serve
from tests.support.evals import run_eval
from tests.support.servers import corral_server
from tests.support.trees import write_tree

pytestmark = pytest.mark.anyio


@pytest.fixture
def fake_judge(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeOpenAI, str]]:
    monkeypatch.setenv("CORRAL_TEST_JUDGE_KEY", "sk-judge-test")
    fake = FakeOpenAI()
    with serve(fake.app) as url:
        yield fake, url


def tree(root: Path, judge_url: str) -> Path:
    return write_tree(root, {"defs.yaml": f"""
        kind: Model
        name: echo
        provider: scripted
        ---
        kind: Agent
        name: parrot
        model: echo
        ---
        kind: Model
        name: judge
        provider: openai
        model: judge-1
        base_url: {judge_url}/v1
        api_key: ${{CORRAL_TEST_JUDGE_KEY}}
        retries: 0
        ---
        kind: Eval
        name: polite
        agent: parrot
        judge: judge
        cases:
          - name: thanks
            input: thank you kindly
            expect: {{rubric: the answer is polite}}
        """})


async def test_a_judge_on_the_wire_grades_a_rubric(tmp_path: Path,
                                                   fake_judge: tuple[FakeOpenAI, str]) -> None:
    fake, judge_url = fake_judge
    defs = tree(tmp_path / "defs", judge_url)
    fake.script(Reply(text='```json\n{"pass": true, "reason": "it thanks"}\n```', usage=(40, 9)),
                Reply(text="Looks polite to me!", usage=(40, 5)))
    with anyio.fail_after(60), corral_server(defs, tmp_path / "state") as url:
        async with httpx.AsyncClient(base_url=url, timeout=30, trust_env=False) as client:
            passed = await run_eval(client, "polite")
            prose = await run_eval(client, "polite")

    assert passed["status"] == "passed", passed
    [case] = passed["cases"]
    assert case["usage"]["output_tokens"] >= 9 and case["usage"]["input_tokens"] >= 40  # the judge's count
    asked = fake.requests[0]
    assert asked.headers["authorization"] == "Bearer sk-judge-test"
    users = [m for m in asked.body["messages"] if m["role"] == "user"]
    assert len(users) == 1
    assert "Rubric:\nthe answer is polite" in users[0]["content"]
    assert "Answer:\nthank you kindly" in users[0]["content"]
    assert prose["status"] == "failed"
    assert prose["cases"][0]["failures"] == [
        "the judge did not answer {\"pass\": true|false, \"reason\"}: 'Looks polite to me!'"]
    assert fake.pending == 0
