"""An eval case's expectations, checked against what its conversation did (§12).

Pure: given the case's `expect` and the `Observed` facts (every tool call in
order, the final answer, steps and tokens), the failures, each one sentence
a person reads in a run. The rubric is not here: it needs a model (`judge`).

Order rules, told apart by the cases only they distinguish:
- `any_order`: each expected call matches a distinct call made, in any order;
- `in_order`: the expected calls appear in this order, other calls allowed
  between them;
- `exact`: the calls made are exactly these, in this order, nothing else.
An expected call's `input` matches when each field it gives equals the
call's argument of that name (other arguments are not looked at).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..canonical import thaw
from ..compiler.schemas import problems, search, validator


@dataclass(frozen=True)
class Call:
    name: str
    arguments: Any

    def __str__(self) -> str:
        return f"{self.name} {json.dumps(self.arguments, ensure_ascii=False, sort_keys=True)}"


@dataclass(frozen=True)
class Observed:
    calls: tuple[Call, ...]
    answer: str
    steps: int  # model steps, over every turn of the case
    tokens: int  # input + output, over every turn of the case


def failures(expect: Mapping[str, Any], seen: Observed) -> list[str]:
    """Every expectation of `expect` that `seen` does not meet (rubric aside)."""
    out = _tool_failures(expect, seen.calls)
    output = expect.get("output")
    if output:
        out += _output_failures(output, seen.answer)
    if expect.get("max_steps") is not None and seen.steps > expect["max_steps"]:
        out.append(f"took {seen.steps} steps, more than max_steps {expect['max_steps']}")
    if expect.get("max_tokens") is not None and seen.tokens > expect["max_tokens"]:
        out.append(f"used {seen.tokens} tokens, more than max_tokens {expect['max_tokens']}")
    return out


# --- tools -------------------------------------------------------------------


def matches(expected: Mapping[str, Any], call: Call) -> bool:
    if expected["name"] != call.name:
        return False
    wanted = expected.get("input")
    if not wanted:
        return True
    if not isinstance(call.arguments, dict):
        return False
    return all(k in call.arguments and call.arguments[k] == thaw(v) for k, v in wanted.items())


def _tool_failures(expect: Mapping[str, Any], calls: Sequence[Call]) -> list[str]:
    out = []
    expected = list(expect.get("tools") or ())
    if expected:
        order = expect.get("tools_order", "any_order")
        check = {"any_order": _any_order, "in_order": _in_order, "exact": _exact}[order]
        if not check(expected, list(calls)):
            made = "; ".join(str(c) for c in calls) or "none"
            wanted = "; ".join(_describe(e) for e in expected)
            out.append(f"tool calls ({order.replace('_', ' ')}) expected: {wanted}; made: {made}")
    for name in expect.get("no_tools") or ():
        if any(c.name == name for c in calls):
            out.append(f"called {name}, which must never be called")
    return out


def _describe(expected: Mapping[str, Any]) -> str:
    wanted = expected.get("input")
    shown = json.dumps(thaw(wanted), sort_keys=True) if wanted else ""
    return f"{expected['name']} {shown}".rstrip()


def _any_order(expected: list[Mapping[str, Any]], calls: list[Call]) -> bool:
    """A distinct call for each expected one: a matching, found by augmenting paths (small lists)."""
    owner: dict[int, int] = {}  # call index -> expected index

    def place(i: int, tried: set[int]) -> bool:
        for j, call in enumerate(calls):
            if j in tried or not matches(expected[i], call):
                continue
            tried.add(j)
            if j not in owner or place(owner[j], tried):
                owner[j] = i
                return True
        return False

    return all(place(i, set()) for i in range(len(expected)))


def _in_order(expected: list[Mapping[str, Any]], calls: list[Call]) -> bool:
    position = 0
    for call in calls:
        if position < len(expected) and matches(expected[position], call):
            position += 1
    return position == len(expected)


def _exact(expected: list[Mapping[str, Any]], calls: list[Call]) -> bool:
    return len(expected) == len(calls) and all(matches(e, c) for e, c in zip(expected, calls, strict=True))


# --- the answer ----------------------------------------------------------------


def _output_failures(output: Mapping[str, Any], answer: str) -> list[str]:
    out = [f"the answer does not contain {text!r}"
           for text in output.get("contains") or () if text not in answer]
    out += [f"the answer contains {text!r}" for text in output.get("not_contains") or () if text in answer]
    if output.get("matches") is not None and not search(output["matches"], answer):
        out.append(f"the answer does not match /{output['matches']}/")
    if output.get("equals") is not None and answer != output["equals"]:
        out.append(f"the answer is not {output['equals']!r}: {_short(answer)!r}")
    if output.get("schema") is not None:
        out += _schema_failures(thaw(output["schema"]), answer)
    return out


def _schema_failures(schema: Any, answer: str) -> list[str]:
    try:
        data = json.loads(answer)
    except ValueError:
        return [f"the answer is not JSON: {_short(answer)!r}"]
    found = problems(validator(schema), data)
    if not found:
        return []
    first = found[0]
    where = "/".join(str(p) for p in first.path) or "(root)"
    return [f"the answer does not satisfy the schema at {where}: {first.message}"]


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "…"
