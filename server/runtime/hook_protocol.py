"""Claude Code's hook protocol: what a hook answers, read into a `Verdict`.

A hook that ran answers with an exit code and what it printed (or an HTTP
status and body). Exit 0 allows; its stdout may be JSON with `decision`
(`block`, or the legacy `approve`) and `reason`, `continue: false` with
`stopReason`, and `hookSpecificOutput` {`permissionDecision` allow / deny /
ask, `permissionDecisionReason`, `updatedInput`, `additionalContext`}. Plain
text on stdout, or text that is not valid JSON, is context for
`user_prompt_submit` and `session_start` and ignored otherwise. Exit 2 blocks
with stderr as the reason. As in Claude Code, only exit 2 or a JSON
deny / block blocks: JSON the protocol cannot read (an unknown decision, a
field of the wrong type) is a non-blocking error, like an exit status other
than 0 and 2; the `Answer` then allows and carries a `warning` for the log.
`HookFailed` is for the runner: a hook that could not start, timed out or
answered a non-2xx HTTP status, which gets the hook's `on_error`.

The verdicts of several hooks combine: deny beats ask beats allow, updated
inputs and context are applied in declared order. This module runs nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

Decision = Literal["allow", "deny", "ask"]
_RANK: dict[str, int] = {"allow": 0, "ask": 1, "deny": 2}
PLAIN_TEXT_CONTEXT = frozenset({"user_prompt_submit", "session_start"})


@dataclass(frozen=True)
class Verdict:
    """What the hooks of one event decided."""

    decision: Decision = "allow"
    reason: str | None = None  # why (deny/ask), shown to the model or user
    updated_input: dict | None = None  # PreToolUse updatedInput, merged in declared order
    context: tuple[str, ...] = ()  # additionalContext strings, in declared order
    stop_continue: str | None = None  # Stop: the agent must go on, with this reason


@dataclass(frozen=True)
class Answer:
    """One hook's verdict; `halt` when it answered `continue: false` (never go on after Stop).

    `warning`: a non-blocking error to log, without the hook's name (its answer could not be read,
    so it allows)."""

    verdict: Verdict
    halt: bool = False
    warning: str | None = None


class HookFailed(Exception):
    """A hook could not be run to an answer; the message names the hook and holds no secret."""


class _Unreadable(Exception):
    """JSON output the protocol cannot read: a non-blocking error."""


def read_output(name: str, event: str, text: str) -> Answer:
    """Read the stdout of a hook that exited 0 (or the body of a 2xx answer)."""
    text = text.strip()
    if not text:
        return Answer(Verdict())
    plain = Answer(Verdict(context=(text,) if event in PLAIN_TEXT_CONTEXT else ()))
    if not text.startswith("{"):
        return plain
    try:
        data = json.loads(text)
    except ValueError:
        return replace(plain, warning="printed invalid JSON, read as plain text")
    try:
        if not isinstance(data, dict):
            raise _Unreadable("printed JSON that is not an object")
        return _read_json(name, event, data)
    except _Unreadable as exc:
        return Answer(Verdict(), warning=f"{exc}: its answer is ignored")


def blocked(name: str, event: str, stderr: str) -> Answer:
    """Exit 2: deny, with stderr as the reason (for Stop: the agent goes on with it)."""
    reason = stderr.strip() or f"blocked by hook {name}"
    return Answer(Verdict("deny", reason, stop_continue=reason if event == "stop" else None))


def _read_json(name: str, event: str, data: Mapping[str, Any]) -> Answer:
    specific = data.get("hookSpecificOutput") or {}
    if not isinstance(specific, Mapping):
        raise _Unreadable("hookSpecificOutput is not an object")
    decision, reason = _decision(name, data, specific)
    updated = specific.get("updatedInput")
    if updated is not None and not isinstance(updated, Mapping):
        raise _Unreadable("updatedInput is not an object")
    extra = specific.get("additionalContext")
    context = (str(extra),) if extra else ()
    updated_input = dict(updated) if updated is not None else None
    if data.get("continue") is False:
        stop = _text(data.get("stopReason")) or f"stopped by hook {name}"
        return Answer(Verdict("deny", stop, updated_input, context), halt=True)
    if decision in ("deny", "ask") and not reason:
        reason = f"{'blocked' if decision == 'deny' else 'confirmation asked'} by hook {name}"
    stop_continue = reason if event == "stop" and decision == "deny" else None
    return Answer(Verdict(decision, reason, updated_input, context, stop_continue))


def _decision(name: str, data: Mapping[str, Any], specific: Mapping[str, Any]) -> tuple[Decision, str | None]:
    # hookSpecificOutput wins over the top-level (older) `decision`, as in Claude Code.
    if specific.get("permissionDecision") is not None:
        value = specific["permissionDecision"]
        if value not in _RANK:
            raise _Unreadable(f"unknown permissionDecision {str(value)[:40]!r}")
        return value, _text(specific.get("permissionDecisionReason"))
    value = data.get("decision")
    if value is None:
        return "allow", None
    if value == "block":
        return "deny", _text(data.get("reason"))
    if value == "approve":
        return "allow", _text(data.get("reason"))
    raise _Unreadable(f"unknown decision {str(value)[:40]!r}")


def _text(value: Any) -> str | None:
    return None if value is None else str(value).strip() or None


def combine(answers: Sequence[Answer]) -> Verdict:
    """The verdict of several hooks, given in declared order."""
    verdicts = [answer.verdict for answer in answers]
    if not verdicts:
        return Verdict()
    decision = max((v.decision for v in verdicts), key=_RANK.__getitem__)
    reasons = [v.reason for v in verdicts if v.decision == decision and v.reason]
    updated: dict | None = None
    for verdict in verdicts:
        if verdict.updated_input is not None:
            updated = {**(updated or {}), **verdict.updated_input}
    continues = [v.stop_continue for v in verdicts if v.stop_continue]
    halted = any(answer.halt for answer in answers)
    return Verdict(
        decision=decision,
        reason="\n".join(reasons) or None,
        updated_input=updated,
        context=tuple(text for v in verdicts for text in v.context),
        stop_continue=None if halted or not continues else "\n".join(continues),
    )
