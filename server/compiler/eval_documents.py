"""The `Eval` document (contract §12): cases an agent must pass, as the YAML author writes them.

An eval names its agent and, for rubrics, a judge Model; both are resolved by
`linking`, which hashes the judge into the eval's digest and leaves the agent
out (a run's result binds the two digests). Normalization makes the same
meaning dump to the same spec: a single `input` becomes a list of one, a
single `contains` string a list of one.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_serializer, model_validator

from .documents import Document, FieldProblem, Name, Strict, ToolName
from .schemas import refusal, schema_field

Text = Annotated[str, Field(min_length=1)]


def _listed(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


class ToolExpectation(Strict):
    """A call the agent must make; `input` matches when each given field equals the call's argument."""

    name: Text
    input: dict[str, Any] | None = None


class OutputExpectation(Strict):
    """What the final answer must be: every given check holds."""

    contains: tuple[str, ...] = ()
    not_contains: tuple[str, ...] = ()
    matches: Text | None = None
    equals: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    _lists = field_validator("contains", "not_contains", mode="before")(lambda cls, v: _listed(v))

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> Any:
        # `schema` is BaseModel's own name: the field is `schema_`, the spec says `schema`, as the author
        out = handler(self)
        if isinstance(out, dict) and "schema_" in out:
            out["schema"] = out.pop("schema_")
        return out

    @field_validator("matches")
    @classmethod
    def _pattern(cls, v: str | None) -> str | None:
        why = None if v is None else refusal(v)  # the engine the check runs on: linear in the answer
        if why is not None:
            raise ValueError(f"not a regular expression this engine runs: {why.removeprefix('error: ')}")
        return v

    @field_validator("schema_")
    @classmethod
    def _schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        return v if v is None else schema_field(v)


class Expectations(Strict):
    tools: tuple[ToolExpectation, ...] = ()
    tools_order: Literal["any_order", "in_order", "exact"] = "any_order"
    no_tools: tuple[ToolName, ...] = ()
    output: OutputExpectation | None = None
    rubric: Text | None = None
    max_steps: int | None = Field(default=None, gt=0, strict=True)
    max_tokens: int | None = Field(default=None, gt=0, strict=True)


class EvalCase(Strict):
    name: Name
    input: tuple[Text, ...] = Field(min_length=1)
    tool_results: dict[ToolName, str] = Field(default_factory=dict)
    expect: Expectations = Field(default_factory=Expectations)

    _input = field_validator("input", mode="before")(lambda cls, v: _listed(v))


class EvalDocument(Document):
    kind: Literal["Eval"]
    agent: Name
    cases: tuple[EvalCase, ...]
    threshold: float = Field(default=1.0, ge=0, le=1)
    repeat: int = Field(default=1, ge=1, le=100, strict=True)
    judge: Name | None = None
    max_concurrency: int = Field(default=4, ge=1, le=64, strict=True)

    @field_validator("cases")
    @classmethod
    def _some(cls, v: tuple[EvalCase, ...]) -> tuple[EvalCase, ...]:
        # not `min_length`: pydantic would say "at least 1 item" of a list whose items were all invalid
        if not v:
            raise ValueError("an eval needs at least one case")
        return v

    @model_validator(mode="after")
    def _cases(self) -> EvalDocument:
        seen: set[str] = set()
        for i, case in enumerate(self.cases):
            if case.name in seen:
                raise FieldProblem(("cases", i, "name"), f"case {case.name!r} is named twice")
            seen.add(case.name)
            if case.expect.rubric is not None and self.judge is None:
                raise FieldProblem(("cases", i, "expect", "rubric"),
                                   "a rubric needs the eval's `judge` Model")
        return self
