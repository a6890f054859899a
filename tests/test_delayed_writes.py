"""A turn's write that fails for a reason the store does not know (not a `StorageError`) fails that
turn only: the server and every other turn go on.

Here a `user_prompt_submit` hook adds context holding a lone surrogate, which SQLite cannot store.
The prompt's write is delayed (`turn_runner.Journal`): it may fail in the turn's own path or in the
journal's timer task, which now keeps any failure for the turn's next write instead of letting it
out into the task group every turn runs in. (That a hook can put a lone surrogate into a prompt at
all is its own defect, left for later: the failed turn's answer then cannot be rendered either.)
"""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.fakes import FakeOpenAI, Stall, serve
from tests.support.servers import corral_server
from tests.support.trees import write_tree

TREE = {
    "models.yaml": """
kind: Model
name: slow
provider: openai
model: m
base_url: {url}/v1
api_key: ${DELAYED_WRITES_KEY:-sk-fake}
timeout_s: 1
retries: 0
---
kind: Model
name: offline
provider: scripted
script:
  - reply: "fine"
""",
    "hooks.yaml": """
kind: Hook
name: odd
event: user_prompt_submit
command: [python3, -c, "print('{\\"hookSpecificOutput\\": {\\"additionalContext\\": \\"\\\\\\\\ud800\\"}}')"]
""",
    "agents.yaml": """
kind: Agent
name: odd
model: slow
hooks: [odd]
---
kind: Agent
name: plain
model: offline
""",
}


def test_a_delayed_write_that_fails_fails_its_turn_only(tmp_path: Path) -> None:
    fake = FakeOpenAI()
    # the odd turn's model sends one delta, then nothing: the prompt and the delta are written by the
    # journal's timer, 20 ms later, while the turn still waits on the model
    fake.script(Stall(text="partial answer"))
    with serve(fake.app) as fake_url:
        tree = {name: text.replace("{url}", fake_url) for name, text in TREE.items()}
        defs = write_tree(tmp_path / "defs", tree)
        with corral_server(defs, tmp_path / "state") as url:
            _both_turns(url)


def _both_turns(url: str) -> None:
    with httpx.Client(base_url=url, timeout=30) as first:  # a 500 closes its connection
        odd = first.post("/v1/conversations", json={"agent": "odd"}).json()["id"]
        answer = first.post(f"/v1/conversations/{odd}/messages", json={"content": "hi"})
    client = httpx.Client(base_url=url, timeout=30)
    # the turn fails (its answer, which would quote the prompt, cannot even be rendered: a 500)
    assert answer.status_code in (200, 500) and answer.json().get("status", "failed") == "failed"
    assert client.get(f"/v1/conversations/{odd}").json()["status"] == "idle"
    plain = client.post("/v1/conversations", json={"agent": "plain"}).json()["id"]
    after = client.post(f"/v1/conversations/{plain}/messages", json={"content": "hi"})
    assert (after.status_code, after.json().get("output")) == (200, "fine"), after.text
    assert client.get("/readyz").status_code == 200
    client.close()
