"""An eval case's expectations as pure checks (`server.evals.checks`): the order rules and input matching.

The end-to-end cases are in `test_evals`; here, what a server run cannot set
up cheaply: an `any_order` match that a greedy pairing would miss.
"""

from __future__ import annotations

from server.evals.checks import Call, Observed, failures


def seen(*calls: Call, answer: str = "") -> Observed:
    return Observed(calls=calls, answer=answer, steps=len(calls) + 1, tokens=10)


def test_any_order_finds_a_pairing_a_greedy_one_would_miss() -> None:
    # the first expectation (any alpha) would take the x=1 call, leaving none for the second
    expect = {"tools": [{"name": "alpha"}, {"name": "alpha", "input": {"x": 1}}]}
    assert failures(expect, seen(Call("alpha", {"x": 1}), Call("alpha", {"x": 2}))) == []
    assert failures(expect, seen(Call("alpha", {"x": 2}), Call("alpha", {"x": 3})))  # no x=1 at all


def test_each_order_rule_is_told_apart() -> None:
    calls = seen(Call("a", {}), Call("c", {}), Call("b", {}))
    expected = [{"name": "b"}, {"name": "a"}]
    assert failures({"tools": expected}, calls) == []
    assert failures({"tools": expected, "tools_order": "in_order"}, calls)
    in_order = [{"name": "a"}, {"name": "b"}]
    assert failures({"tools": in_order, "tools_order": "in_order"}, calls) == []
    assert failures({"tools": in_order, "tools_order": "exact"}, calls)
    exact = [{"name": "a"}, {"name": "c"}, {"name": "b"}]
    assert failures({"tools": exact, "tools_order": "exact"}, calls) == []


def test_input_matches_the_fields_given_only() -> None:
    call = Call("lookup", {"order": "12", "verbose": True})
    assert failures({"tools": [{"name": "lookup", "input": {"order": "12"}}]}, seen(call)) == []
    assert failures({"tools": [{"name": "lookup", "input": {"order": 12}}]}, seen(call))  # not "12"
    assert failures({"tools": [{"name": "lookup", "input": {"order": "12"}}]},
                    seen(Call("lookup", "not json")))  # arguments the model sent as raw text
