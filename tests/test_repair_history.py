"""`repair_history`'s quick check never changes its answer: the same as repairing message by message."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from server.canonical import freeze
from server.messages import (
    AssistantMessage,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    _repaired,
    repair_history,
)

IDS = st.sampled_from(["a", "b", "c", "d"])
CALL = st.builds(lambda i: ToolCall(id=i, name="t", arguments=freeze({})), IDS)
MESSAGE = st.one_of(
    st.builds(lambda: UserMessage(content="u")),
    st.builds(lambda calls: AssistantMessage(content="", tool_calls=tuple(calls)),
              st.lists(CALL, max_size=3, unique_by=lambda c: c.id)),
    st.builds(lambda i: ToolResultMessage(tool_call_id=i, name="t", content="r"), IDS),
)


@given(st.lists(MESSAGE, max_size=30))
def test_the_quick_check_answers_as_the_full_repair_does(messages: list) -> None:
    assert repair_history(messages) == _repaired(messages)


def test_a_call_without_its_result_is_answered() -> None:
    call = ToolCall(id="x", name="t", arguments=freeze({}))
    repaired = repair_history([AssistantMessage(content="", tool_calls=(call,)), UserMessage(content="u")])
    assert [type(m).__name__ for m in repaired] == ["AssistantMessage", "ToolResultMessage", "UserMessage"]
    assert repaired[1].is_error and repaired[1].tool_call_id == "x"
