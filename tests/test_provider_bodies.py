"""A model request's body is the same JSON whether its history was encoded now or kept from the last turn.

The OpenAI provider keeps each message's JSON and each conversation's joined history between
requests (`wire.EncodedCache`, `wire.PrefixCache`); a history that only grew reuses them, one that
changed anywhere (compacted, repaired, forked) must not.
"""

from __future__ import annotations

import json
from dataclasses import replace

from server.canonical import freeze
from server.compiler.definitions import ModelDefinition
from server.messages import AssistantMessage, ToolCall, ToolResultMessage, UserMessage
from server.providers.base import ModelRequest
from server.providers.openai import OpenAIProvider
from server.providers.transport import ModelHTTP
from server.providers.wire import encode_body

DEFINITION = ModelDefinition(name="m", description="", digest="sha256:test", spec=freeze({}),
                             provider="openai", model="m", base_url="http://127.0.0.1:1/v1")


def _sent(history: tuple) -> list:
    provider = OpenAIProvider(DEFINITION, ModelHTTP(trust_env=False), {})
    body = json.loads(encode_body(provider.body(ModelRequest(instructions="be brief", messages=history))))
    return body["messages"]


def _plain(history: tuple) -> list:
    """What the body says, built without any cache: every message as the wire wants it."""
    out: list = [{"role": "system", "content": "be brief"}]
    for m in history:
        if isinstance(m, UserMessage):
            out.append({"role": "user", "content": m.content})
        elif isinstance(m, ToolResultMessage):
            out.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content})
        else:
            calls = [{"id": c.id, "type": "function",
                      "function": {"name": c.name, "arguments": json.dumps(dict(c.arguments))}}
                     for c in m.tool_calls]
            out.append({"role": "assistant", "content": m.content or (None if calls else ""),
                        **({"tool_calls": calls} if calls else {})})
    return out


def test_a_history_that_grows_changes_or_shrinks_is_sent_as_it_is() -> None:
    turns = []
    for n in range(50):
        turns += [UserMessage(content=f"question {n}"),
                  AssistantMessage(content="", tool_calls=(ToolCall(id=f"c{n}", name="look",
                                                                    arguments=freeze({"n": n})),)),
                  ToolResultMessage(tool_call_id=f"c{n}", name="look", content=f"result {n}"),
                  AssistantMessage(content=f"answer {n}")]
    grown = tuple(turns)
    for history in (grown[:100], grown, grown[:120]):  # first, grown (prefix kept), shrunk (a fork)
        assert _sent(history) == _plain(history)
    changed = (*grown[:37], UserMessage(content="compacted"), *grown[38:])  # same ends, new middle
    assert _sent(changed) == _plain(changed)
    assert _sent(grown) == _plain(grown)  # and back
    # the last request's end comes back as other, equal objects (read back from the store), and grows
    reread = (*grown[:-3], *(replace(m) for m in grown[-3:]), UserMessage(content="one more"))
    assert _sent(reread) == _plain(reread)
    edited = (*reread[:-2], replace(reread[-2], content="edited"), reread[-1])  # a new object, new text
    assert _sent(edited) == _plain(edited)
    assert _sent(()) == _plain(())
