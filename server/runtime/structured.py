"""Structured output: the JSON a turn's final answer must be, and the repairs asked for.

An Agent's `output_schema` (or, for one turn, the OpenAI route's
`response_format`) makes the final answer a JSON value valid against a
schema. The model is told so in its instructions (`note`), and providers that
take it natively (OpenAI-compatible ones) get it as `response_format`. An
answer that is not such a value gets one user message saying what was wrong
(`repair`), at most `MAX_REPAIRS` times a turn; then the turn fails with
`output_invalid`. One code fence around the JSON is tolerated and dropped.

The turn's `output` is the JSON text; `structured` is its parsed value.
`MISSING` stands for "no schema applied" (a schema may allow `null`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator

from ..canonical import thaw
from ..compiler import schemas
from ..compiler.definitions import AgentDefinition
from ..errors import RunError

MAX_REPAIRS = 2
_FENCE = re.compile(r"^\s*```[A-Za-z0-9_-]*[ \t]*\n(.*?)\n?```\s*$", re.DOTALL)


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()  # no schema applied to the turn: no `structured` in its result


class OutputProblem(ValueError):
    """Why an answer is not the JSON the schema asks for (told to the model, and in the error)."""


@dataclass(frozen=True)
class OutputSchema:
    schema: Mapping[str, Any]
    # What the OpenAI wire takes as `response_format` (None: the providers are not told natively).
    response_format: Mapping[str, Any] | None = None
    any_object: bool = False  # `{"type": "json_object"}`: any JSON object will do
    _validator: Draft202012Validator = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_validator", schemas.validator(thaw(self.schema)))

    @classmethod
    def of_agent(cls, agent: AgentDefinition) -> OutputSchema | None:
        if agent.output_schema is None:
            return None
        schema = thaw(agent.output_schema)
        # OpenAI's structured outputs take an object at the root only; anything else is left to the repairs.
        native = ({"type": "json_schema", "json_schema": {"name": agent.name, "schema": schema}}
                  if schema.get("type") == "object" else None)
        return cls(schema, native)

    @classmethod
    def json_object(cls) -> OutputSchema:
        return cls({"type": "object"}, {"type": "json_object"}, any_object=True)

    def note(self) -> str:
        """What the instructions gain: the answer's form."""
        if self.any_object:
            return "\n\nAnswer with a single JSON object and nothing else (no prose, no code fence)."
        schema = json.dumps(thaw(self.schema), ensure_ascii=False, sort_keys=True)
        return ("\n\nAnswer with a single JSON value and nothing else (no prose, no code fence), valid"
                f" against this JSON Schema:\n{schema}")

    def parse(self, answer: str) -> tuple[str, Any]:
        """The answer's JSON text and value; raises `OutputProblem` when it is not valid."""
        fenced = _FENCE.match(answer)
        text = (fenced.group(1) if fenced else answer).strip()
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise OutputProblem(f"it is not JSON ({exc})") from None
        problems = schemas.problems(self._validator, value)
        if problems:
            raise OutputProblem("it does not satisfy the schema: " + "; ".join(
                f"{'/'.join(map(str, e.path)) or '(root)'}: {e.message}" for e in problems[:5]))
        return text, value

    def repair(self, problem: OutputProblem) -> str:
        """The user message that asks for a valid answer."""
        want = "a single JSON object" if self.any_object else "a single JSON value valid against the schema"
        return (f"Your answer is not valid: {problem}. Answer again with only {want}, and nothing else.")

    def failed(self, problem: OutputProblem) -> RunError:
        return RunError(f"the answer is still not valid after {MAX_REPAIRS} repairs: {problem}",
                        code="output_invalid", details={"repairs": MAX_REPAIRS, "problem": str(problem)})


def stored(agent: AgentDefinition, output: str | None) -> Any:
    """`structured` of a completed turn read back from the store: its output parsed, when its agent has
    an output_schema (a schema that came with the request, the OpenAI route's, is not recorded)."""
    if agent.output_schema is None or output is None:
        return MISSING
    try:
        return json.loads(output)
    except ValueError:
        return MISSING
