"""A rubric graded by the eval's judge Model (§12).

The judge is sent the rubric and the answer in one user message and asked for
a JSON object `{"pass": true|false, "reason": "…"}`. A reply that is not such
an object fails the case, saying so: a judge that cannot follow the format
is not a pass. A judge that cannot be reached (`ProviderError`, raised) makes
the run `error`, not `failed`: nothing was judged.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..compiler.definitions import ModelDefinition
from ..messages import Usage, UserMessage
from ..providers.base import ModelPort, ModelRequest, TextDelta, UsageChunk
from ..providers.resilience import FallbackModel

INSTRUCTIONS = ("You grade an answer against a rubric. Reply with only a JSON object: "
                '{"pass": true or false, "reason": "one sentence"}.')


@dataclass(frozen=True)
class Verdict:
    passed: bool
    reason: str
    usage: Usage
    understood: bool = True  # the reply was the object asked for


def prompt(rubric: str, answer: str) -> str:
    return (f"Rubric:\n{rubric}\n\nAnswer:\n{answer}\n\n"
            'Does the answer satisfy the rubric? Reply with only {"pass": true|false, "reason": "..."}.')


class Judge:
    """One judge Model and its fallbacks, as the agent loop would call them."""

    def __init__(self, chain: Sequence[ModelDefinition], provider: Callable[[ModelDefinition], ModelPort]):
        ports = [provider(m) for m in chain]
        self.model: ModelPort = ports[0] if len(ports) == 1 else FallbackModel(ports)

    async def grade(self, rubric: str, answer: str) -> Verdict:
        asked = UserMessage(content=prompt(rubric, answer))
        request = ModelRequest(instructions=INSTRUCTIONS, messages=(asked,))
        text, usage = "", Usage()
        async for chunk in self.model.stream(request):
            if isinstance(chunk, TextDelta):
                text += chunk.text
            elif isinstance(chunk, UsageChunk):
                usage = usage + chunk.usage
        return read_verdict(text, usage)


def read_verdict(text: str, usage: Usage) -> Verdict:
    try:
        data = json.loads(_unfenced(text))
    except ValueError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("pass"), bool):
        shown = text if len(text) <= 200 else text[:200] + "…"
        return Verdict(False, f'the judge did not answer {{"pass": true|false, "reason"}}: {shown!r}', usage,
                       understood=False)
    return Verdict(data["pass"], str(data.get("reason", "")), usage)


def _unfenced(text: str) -> str:
    """The JSON inside a ```json fence, as models often wrap it; else the text as it is."""
    stripped = text.strip()
    if stripped.startswith("```") and stripped.endswith("```"):
        stripped = stripped.strip("`").removeprefix("json").strip()
    return stripped


def judge_chain(models: dict[str, ModelDefinition], name: str) -> list[ModelDefinition]:
    """The judge and its fallbacks depth-first, each once (as an agent's model chain)."""
    chain: list[ModelDefinition] = []

    def add(model: str) -> None:
        found = models[model]
        if found not in chain:
            chain.append(found)
            for fallback in found.fallbacks:
                add(fallback)

    add(name)
    return chain
