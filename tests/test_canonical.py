"""Property tests: canonical JSON and digests depend on meaning, never on spelling."""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from server.canonical import canonical_json, digest_of, freeze, is_digest, thaw
from server.compiler.compiler import Compiler
from server.compiler.yamltext import parse_yaml

SETTINGS = settings(max_examples=60, deadline=None)

# RFC 8785 numbers are IEEE doubles: integers beyond 2**53 have no exact spelling.
SAFE_INT = 2**53 - 1
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
keys = text.filter(lambda k: k != "<<")  # `<<` is YAML's merge key, not a plain key
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-SAFE_INT, SAFE_INT)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=12,
)
json_objects = st.dictionaries(keys, json_values, max_size=5)


def shuffled(value: Any, rnd: random.Random) -> Any:
    """The same value with every mapping's keys in another order."""
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: shuffled(v, rnd) for k, v in items}
    if isinstance(value, list):
        return [shuffled(v, rnd) for v in value]
    return value


@SETTINGS
@given(json_values, st.randoms(use_true_random=False))
def test_key_order_does_not_matter(value: Any, rnd: random.Random) -> None:
    assert canonical_json(shuffled(value, rnd)) == canonical_json(value)
    assert digest_of(shuffled(value, rnd)) == digest_of(value)


@SETTINGS
@given(json_values, st.integers(0, 4), st.booleans())
def test_json_round_trip(value: Any, indent: int, ascii_only: bool) -> None:
    spelled = json.dumps(value, indent=indent or None, ensure_ascii=ascii_only)
    assert canonical_json(json.loads(spelled)) == canonical_json(value)


@SETTINGS
@given(json_objects, st.booleans(), st.booleans(), st.sampled_from([2, 4, 7]))
def test_yaml_round_trip(value: dict, flow: bool, unicode: bool, indent: int) -> None:
    # PyYAML's emitter writes U+0085 raw when allowed to, and YAML reads it back as a line break.
    unicode = unicode and "\x85" not in json.dumps(value, ensure_ascii=False)
    spelled = yaml.safe_dump(value, default_flow_style=flow, indent=indent, allow_unicode=unicode)
    [parsed] = parse_yaml(spelled)
    assert canonical_json(parsed.data) == canonical_json(value)


@SETTINGS
@given(json_values, json_values)
def test_digest_follows_canonical_bytes(a: Any, b: Any) -> None:
    assert is_digest(digest_of(a))
    assert digest_of(a) == digest_of(json.loads(json.dumps(a)))
    assert (digest_of(a) == digest_of(b)) == (canonical_json(a) == canonical_json(b))


@SETTINGS
@given(json_objects, keys, json_values)
def test_any_real_change_changes_the_digest(value: dict, key: str, extra: Any) -> None:
    changed = {**value, key: [extra, value.get(key)]}
    assert digest_of(changed) != digest_of(value)
    assert digest_of([value]) != digest_of(value)


def test_canonical_spelling() -> None:
    assert canonical_json({"b": 1, "a": [1.0, 2.5e-7, "é"]}) == '{"a":[1,2.5e-7,"é"],"b":1}'.encode()
    assert digest_of(1) == digest_of(1.0) != digest_of(True) != digest_of("1")


@SETTINGS
@given(json_values)
def test_freeze_thaw_round_trip(value: Any) -> None:
    frozen = freeze(value)
    assert thaw(frozen) == value
    assert canonical_json(frozen) == canonical_json(value)
    assert digest_of(frozen) == digest_of(value)
    stack = [frozen]
    while stack:
        node = stack.pop()
        assert not isinstance(node, dict | list)
        if isinstance(node, MappingProxyType):
            with pytest.raises(TypeError):
                node["x"] = 1  # type: ignore[index]
            stack += node.values()
        elif isinstance(node, tuple):
            stack += node


def test_freeze_copies() -> None:
    source = {"a": [1, {"b": 2}]}
    frozen = freeze(source)
    source["a"][1]["b"] = 3
    assert frozen["a"][1]["b"] == 2


# --- documents: random valid Tool and Agent documents, spelled at random ------

TOOL_NAMES = ["search", "get-weather", "w2", "x_y", "0day"]
AGENT_NAMES = ["alpha", "b", "c-3po", "dev_ops"]
words = st.text("abcdefgh XYZ.,:!?#'\"-", min_size=1, max_size=20).map(str.strip).filter(bool)
params = st.lists(st.sampled_from(["query", "limit", "city", "id"]), min_size=0, max_size=3, unique=True)


@st.composite
def tool_documents(draw: st.DrawFn, name: str) -> dict:
    props = draw(params)
    schema: dict[str, Any] = {"type": "object", "properties": {p: {"type": "string"} for p in props}}
    if props and draw(st.booleans()):
        schema["required"] = props[:1]
    doc: dict[str, Any] = {"kind": "Tool", "name": name, "input_schema": schema}
    if draw(st.booleans()):
        doc["description"] = draw(words)
    placeholders = ["{" + p + "}" for p in props]
    if draw(st.booleans()):
        argv = ["echo", *draw(st.lists(words, max_size=3)), *placeholders]
        doc["command"] = {"argv": argv, "timeout_s": draw(st.sampled_from([1, 2.5, 30]))}
    else:
        query = "&".join(f"{p}={{{p}}}" for p in props)
        doc["http"] = {"method": draw(st.sampled_from(["GET", "POST"])),
                       "url": "https://example.com/api?" + query,
                       "headers": {"Authorization": "Bearer ${API_TOKEN}"}}
    doc["permission"] = draw(st.sampled_from(["allow", "ask", "deny"]))
    return doc


@st.composite
def document_sets(draw: st.DrawFn) -> list[dict]:
    tool_names = draw(st.lists(st.sampled_from(TOOL_NAMES), min_size=1, max_size=3, unique=True))
    docs = [draw(tool_documents(n)) for n in tool_names]
    docs.append({"kind": "Model", "name": "m", "provider": "scripted"})
    agents = draw(st.lists(st.sampled_from(AGENT_NAMES), min_size=1, max_size=3, unique=True))
    for i, agent in enumerate(agents):
        doc: dict[str, Any] = {"kind": "Agent", "name": agent, "model": "m"}
        doc["tools"] = draw(st.lists(st.sampled_from(tool_names), unique=True, max_size=3))
        doc["agents"] = agents[i + 1 :][:1]  # a chain: no cycles
        if draw(st.booleans()):
            doc["instructions"] = draw(words)
        doc["max_steps"] = draw(st.integers(1, 50))
        doc["on_busy"] = draw(st.sampled_from(["reject", "enqueue", "interrupt"]))
        docs.append(doc)
    return docs


def spell(docs: list[dict], rnd: random.Random) -> dict[str, str]:
    """The documents in random files, key orders, styles and quoting."""

    class Dumper(yaml.SafeDumper):
        pass

    quote = rnd.choice([None, "'", '"'])
    if quote:
        Dumper.add_representer(str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style=quote))
    files: dict[str, list[str]] = {}
    for doc in rnd.sample(docs, len(docs)):
        body = yaml.dump(shuffled(doc, rnd), Dumper=Dumper, sort_keys=False, width=rnd.choice([40, 200]),
                         default_flow_style=rnd.choice([False, True, None]), indent=rnd.choice([2, 3, 5]))
        if rnd.random() < 0.5:
            body = "# " + rnd.choice(["a comment", "kind: Agent", "---"]) + "\n" + body
        files.setdefault(f"{rnd.choice(['a', 'b/c', 'd'])}/{rnd.randrange(3)}.yaml", []).append(body)
    return {path: "---\n".join(bodies) for path, bodies in files.items()}


def compiled_digests(files: dict[str, str]) -> dict[str, str]:
    with tempfile.TemporaryDirectory() as tmp:
        for rel, body in files.items():
            path = Path(tmp, rel)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(body, "utf-8")
        compiled = Compiler(tmp).compile()
        return {"set": compiled.digest, **compiled.digests()}


@settings(max_examples=50, deadline=None)
@given(document_sets(), st.randoms(use_true_random=False), st.randoms(use_true_random=False))
def test_documents_spelled_differently_compile_alike(docs: list[dict], r1: random.Random,
                                                     r2: random.Random) -> None:
    first = compiled_digests(spell(docs, r1))
    assert first == compiled_digests(spell(docs, r2))
    assert len(first) == len(docs) + 1
