"""Hooks: run the `Hook` definitions of an agent at the events of its loop.

`Hooks.run(event, payload)` sends one JSON object (Claude Code's hook input:
the caller's `base` fields — session_id, cwd, corral {agent, digest, turn_id}
— then `transcript_path` and `permission_mode`, then `hook_event_name` in
PascalCase, then the event's own fields) to every hook that matches, all at
once, and combines their answers into one `Verdict` (see `hook_protocol`). A
matcher applies to tool events only: empty matches every tool, anything else
must match the whole tool name as a regex (which covers exact names and
`a|b`). The tool name is the one hooks know (an MCP tool's is
`mcp__SERVER__TOOL`); the guard passes it.

`transcript_path` names a `Transcript`: the conversation so far as a JSONL
file (one message a line, each as its `to_json()`), written under the state
directory and brought up to date before every run that has a hook to run.
It holds what the conversation's messages hold and nothing else.

A command hook runs its argv without a shell (an element naming a file of the
definition directory runs as its absolute path), in the definition directory,
with the JSON on stdin, the minimal environment of `confinement` and
`CLAUDE_PROJECT_DIR` set to that directory, plus, for a hook guarding a tool
call, that call's `CORRAL_EXECUTION_KEY` (the caller passes it: the guard);
a time-out kills its whole process group. An HTTP hook POSTs the same JSON,
with `${VAR}` in its headers resolved at call time (and no execution key).
Whatever a hook answers (a reason, context, a rewritten input) has every
secret value redacted before the turn uses it.
As in Claude Code, a hook that exits with a status other than 0 and 2, or
answers JSON the protocol cannot read, is a non-blocking error: a warning
naming the hook and what it did is logged, and the call goes on. A hook that
cannot start (its program is missing, its script changed and no copy was
kept, a secret of its headers is unset), times out, cannot be reached or
answers a non-2xx HTTP status gets its `on_error`: allow, or deny with a
reason that says what failed.

Before any hook runs, `confirm` (the turn's `TurnChannel.confirm`) checks
that the turn's replica still holds it, and raises `LeaseLost` if not: a
replica that lost the turn (paused past its lease) runs no hook of it (§9).

Not responsible for what a verdict does to the turn: the agent loop decides.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import httpx

from .. import tracing
from ..compiler.definitions import HookDefinition
from ..compiler.documents import HOOK_EVENTS
from ..compiler.templates import MissingSecret, resolve_secrets
from ..deployment.vault import NO_VAULT, FileChanged, FileVault
from ..errors import RunError
from ..messages import Message
from ..tools.confinement import NO_REDACTION, Redactor, child_environment
from ..tools.processes import StartFailed, run_process
from ..tracing import names
from .hook_protocol import Answer, HookFailed, Verdict, blocked, combine, read_output
from .turn_traces import note_hook

__all__ = ["EVENT_NAMES", "Hooks", "Transcript", "Verdict"]

log = logging.getLogger("corral.hooks")

EVENT_NAMES = {event: pascal for pascal, event in HOOK_EVENTS.items()}  # pre_tool_use -> PreToolUse
TOOL_EVENTS = frozenset({"pre_tool_use", "post_tool_use"})
OUTPUT_LIMIT = 256 * 1024  # stdout or response body; a longer answer is cut, so read as plain text
STDERR_TAIL = 4096  # an exit-2 reason is the end of stderr
STDERR_LOGGED = 500  # of a non-blocking error's stderr, the end is logged
PERMISSION_MODE = "default"  # Claude Code's field; Corral has no other mode
_SAFE_FILE_NAME = re.compile(r"[A-Za-z0-9_-]{1,128}")


class Transcript:
    """The conversation so far as a JSONL file, one message a line (`to_json()`): `transcript_path`.

    `messages` gives the history and what the turn added so far. The file is rewritten whole, in
    one rename (a reader never sees half of it), when the count of messages changed since the
    last write (within a turn they are only appended to), readable by its owner only.
    """

    def __init__(self, path: Path, messages: Callable[[], Sequence[Message]]):
        self.path = path
        self.messages = messages
        self._written = -1

    @classmethod
    def of(cls, directory: Path, conversation_id: str,
           messages: Callable[[], Sequence[Message]]) -> Transcript:
        """The transcript of a conversation: `directory/<conversation_id>.jsonl`."""
        name = conversation_id
        if not _SAFE_FILE_NAME.fullmatch(name):  # an id is never a path, whatever a client sent
            name = hashlib.sha256(conversation_id.encode()).hexdigest()
        return cls(directory / f"{name}.jsonl", messages)

    async def refresh(self) -> str | None:
        """Bring the file up to date; its path, or None (logged) if it could not be written."""
        messages = tuple(self.messages())
        if len(messages) == self._written and self.path.exists():
            return str(self.path)
        try:
            await anyio.to_thread.run_sync(self._write, messages)
        except OSError as exc:
            log.warning("could not write the transcript %s for hooks: %s", self.path, exc.strerror or exc)
            return None
        self._written = len(messages)
        return str(self.path)

    async def remove(self) -> None:
        """Delete the file (its conversation was deleted); logged if it cannot be."""
        try:
            await anyio.to_thread.run_sync(lambda: self.path.unlink(missing_ok=True))
        except OSError as exc:
            log.warning("could not remove the transcript %s: %s", self.path, exc.strerror or exc)

    def _write(self, messages: Sequence[Message]) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{secrets.token_hex(6)}.tmp")
        try:
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w",
                           encoding="utf-8") as out:
                for message in messages:
                    out.write(json.dumps(message.to_json(), ensure_ascii=False) + "\n")
            os.replace(tmp, self.path)
        finally:
            tmp.unlink(missing_ok=True)


class Hooks:
    """The hooks of one agent, ready to run for one conversation."""

    def __init__(
        self,
        hooks: Sequence[HookDefinition],
        *,
        root: Path,
        http: httpx.AsyncClient,
        environ: Mapping[str, str],
        base: Mapping[str, Any],
        files: FileVault = NO_VAULT,
        redactor: Redactor = NO_REDACTION,
        transcript: Transcript | None = None,
        confirm: Callable[[], Awaitable[None]] | None = None,
    ):
        self.files = files
        self.confirm = confirm  # the turn still holds its lease (raises if not): before any hook runs
        self.transcript = transcript
        self.redactor = redactor
        self.hooks = tuple(hooks)
        self.root = root
        self.http = http
        self.environ = environ  # for ${VAR} in HTTP headers; never handed to a command hook
        self.base = dict(base)
        self._matchers = [re.compile(h.matcher) if h.matcher else None for h in self.hooks]

    def matching(self, event: str, tool_name: str | None = None) -> list[HookDefinition]:
        """The hooks of `event` (either spelling) that apply to `tool_name`, in declared order."""
        event = _event(event)
        return [
            hook for hook, matcher in zip(self.hooks, self._matchers, strict=True)
            if hook.event == event and _applies(matcher, event, tool_name)
        ]

    async def submitted(self, text: str, notes: Sequence[str] = ()) -> str:
        """A prompt past the user_prompt_submit hooks (a turn's, or one steered into it): with the context
        they add (after `notes`); raises `prompt_blocked` when one denies it."""
        verdict = await self.run("user_prompt_submit", {"prompt": text})
        if verdict.decision == "deny":
            raise RunError(f"the prompt was blocked by a hook: {verdict.reason or 'no reason given'}",
                           code="prompt_blocked")
        return "\n\n".join([text, *notes, *verdict.context])

    async def run(self, event: str, payload: Mapping[str, Any], *, tool_name: str | None = None,
                  execution_key: str = "") -> Verdict:
        """Run every matching hook concurrently; `tool_name` defaults to the payload's. Command hooks
        get `execution_key`, the key of the tool call they guard, as `CORRAL_EXECUTION_KEY`."""
        event = _event(event)
        if tool_name is None and isinstance(payload.get("tool_name"), str):
            tool_name = payload["tool_name"]
        hooks = self.matching(event, tool_name)
        if not hooks:
            return Verdict()
        if self.confirm is not None:  # a hook is a side effect: none from a replica that lost the turn
            await self.confirm()
        message = dict(self.base)
        if self.transcript is not None and (path := await self.transcript.refresh()) is not None:
            message["transcript_path"] = path
        message |= {"permission_mode": PERMISSION_MODE, "hook_event_name": EVENT_NAMES[event], **payload}
        body = json.dumps(message, ensure_ascii=False, default=str).encode("utf-8")
        answers = [Answer(Verdict())] * len(hooks)

        async def one(index: int, hook: HookDefinition) -> None:
            with tracing.span(*names.hook(hook.name, event, "command" if hook.command else "http")) as span:
                started = time.time()
                answers[index] = await self._run_one(hook, event, body, execution_key)
                span.outcome(answers[index].verdict.decision)
                note_hook(hook.name, event, started, time.time(), answers[index].verdict.decision)

        async with anyio.create_task_group() as group:
            for index, hook in enumerate(hooks):
                group.start_soon(one, index, hook)
        return combine(answers)

    async def _run_one(self, hook: HookDefinition, event: str, body: bytes, execution_key: str) -> Answer:
        started = time.monotonic()
        try:
            if hook.command is not None:
                answer = await self._command(hook, event, body, execution_key)
            else:
                answer = await self._post(hook, event, body)
        except HookFailed as exc:
            failure = str(exc)
        except Exception:  # a bug here must not take the turn down with it: the hook failed
            log.warning("hook %s on %s raised", hook.name, event, exc_info=True)
            failure = f"hook {hook.name} failed"
        else:
            elapsed_ms = (time.monotonic() - started) * 1000
            if answer.warning:  # a non-blocking error, as in Claude Code: logged, and the call goes on
                log.warning("hook %s on %s: %s (a non-blocking error: the %s goes on; %.0f ms)", hook.name,
                            event, self.redactor.text(answer.warning), _goes_on(event), elapsed_ms)
            log.debug("hook %s on %s: %s (%.0f ms)", hook.name, event, answer.verdict.decision, elapsed_ms)
            return self._redacted(answer)
        elapsed_ms = (time.monotonic() - started) * 1000
        log.warning("hook %s on %s: %s, on_error %s (%.0f ms)", hook.name, event, failure, hook.on_error,
                    elapsed_ms)
        return Answer(Verdict("deny", failure) if hook.on_error == "deny" else Verdict())

    async def _command(self, hook: HookDefinition, event: str, body: bytes, execution_key: str) -> Answer:
        assert hook.command is not None
        try:
            argv = self.files.argv(self.root, hook.command, hook.files)
        except FileChanged as exc:
            raise HookFailed(f"hook {hook.name}: {exc}") from None
        env = child_environment({"CLAUDE_PROJECT_DIR": str(self.root)}, execution_key=execution_key)
        try:
            finished = await run_process(argv, cwd=self.root, env=env, timeout_s=hook.timeout_s,
                                         output_limit=OUTPUT_LIMIT, stderr_tail=STDERR_TAIL, stdin=body)
        except StartFailed as exc:
            raise HookFailed(f"hook {hook.name} could not start: {exc}") from None
        if finished.timed_out:
            raise HookFailed(f"hook {hook.name} timed out after {hook.timeout_s:g}s")
        if finished.returncode == 2:
            return blocked(hook.name, event, finished.stderr.tail_text())
        if finished.returncode != 0:
            stderr = " ".join(finished.stderr.tail_text().split())[-STDERR_LOGGED:]
            return Answer(Verdict(), warning=finished.status + (f", stderr: {stderr}" if stderr else ""))
        return read_output(hook.name, event, finished.stdout.text())

    def _redacted(self, answer: Answer) -> Answer:
        if not self.redactor:
            return answer
        v = answer.verdict
        updated = None if v.updated_input is None else self.redactor.value(v.updated_input)
        verdict = replace(v, reason=self.redactor.text(v.reason) if v.reason else v.reason,
                          context=tuple(self.redactor.text(c) for c in v.context), updated_input=updated,
                          stop_continue=self.redactor.text(v.stop_continue) if v.stop_continue else None)
        return replace(answer, verdict=verdict)

    async def _post(self, hook: HookDefinition, event: str, body: bytes) -> Answer:
        spec = hook.http or {}
        try:
            headers = {k: resolve_secrets(v, self.environ) for k, v in spec.get("headers", {}).items()}
        except MissingSecret as exc:
            raise HookFailed(f"hook {hook.name}: environment variable {exc.args[0]} is not set") from None
        if not any(k.lower() == "content-type" for k in headers):
            headers["Content-Type"] = "application/json"
        timed_out = HookFailed(f"hook {hook.name} timed out after {hook.timeout_s:g}s")
        with anyio.move_on_after(hook.timeout_s) as deadline:
            try:
                status, text = await self._send(spec["url"], headers, body, hook)
            except httpx.TimeoutException:
                raise timed_out from None
            except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError) as exc:
                # The type only: a message may hold the URL or a header value.
                raise HookFailed(f"hook {hook.name}: request failed ({type(exc).__name__})") from None
        if deadline.cancelled_caught:
            raise timed_out
        if not 200 <= status < 300:
            raise HookFailed(f"hook {hook.name} answered HTTP {status}")
        return read_output(hook.name, event, text)

    async def _send(self, url: str, headers: dict[str, str], body: bytes,
                    hook: HookDefinition) -> tuple[int, str]:
        async with self.http.stream("POST", url, content=body, headers=headers,
                                    timeout=hook.timeout_s) as response:
            data = bytearray()
            async for chunk in response.aiter_bytes():
                data += chunk
                if len(data) > OUTPUT_LIMIT:
                    raise HookFailed(f"hook {hook.name} answered more than {OUTPUT_LIMIT} bytes")
            return response.status_code, data.decode("utf-8", errors="replace")


def _applies(matcher: re.Pattern[str] | None, event: str, tool_name: str | None) -> bool:
    if matcher is None or event not in TOOL_EVENTS:
        return True
    return tool_name is not None and matcher.fullmatch(tool_name) is not None


def _goes_on(event: str) -> str:
    return "call" if event in TOOL_EVENTS else "turn"


def _event(event: str) -> str:
    event = HOOK_EVENTS.get(event, event)
    if event not in EVENT_NAMES:
        raise ValueError(f"unknown hook event: {event!r}")
    return event

