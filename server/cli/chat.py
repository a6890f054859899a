"""`corral chat`: a conversation with an agent, for a person at a terminal.

The agent runs in this process (`Local`: the service's conversations and
permission broker), or on a server (`Remote`, with `--url`: the HTTP API).
Either way a turn is a stream of events that `Chat` shows and answers:

- the answer text goes to stdout; everything else to stderr, one line each:
  the banner, a tool call and its result, the permission question, the
  closing line of a turn (with its token usage when the model reports it),
  and on a TTY a spinner with the elapsed time while nothing else shows;
- a tool call waiting on `ask` asks `allow? [y/N]`: the next line typed is
  the answer, and anything but `y`/`yes` (an empty line, EOF) is a no;
- Ctrl-C during a turn cancels it (in-process, or `POST .../interrupt`) and
  the prompt comes back; Ctrl-C at the prompt, or a second one while the
  cancel is on its way, exits 130 (`EXIT_CANCELLED`, as for any Ctrl-C of
  `corral`); EOF (Ctrl-D) exits 0;
- a server that cannot be reached is one `error: ...` line and exit 3
  (`unreachable`); an answer that is not Corral's is one line too.

Input is read from the stdin descriptor when the event loop says it is
readable, not by a thread, so a Ctrl-C can abandon a read; the terminal's
own line editing applies. In process, the log goes to
`$CORRAL_STATE_DIR/chat.log`, and with it what MCP servers write to stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

import anyio
import httpx

from .. import logs
from ..errors import EXIT_CANCELLED, CorralError, RequestError
from ..settings import Settings

OnEvent = Callable[[str, dict[str, Any]], Awaitable[None]]
SPIN_AFTER_S = 0.3  # a turn that answers at once shows no spinner
SPIN_EVERY_S = 0.1
FRAMES = "|/-\\"
REQUEST_TIMEOUT = httpx.Timeout(30.0, connect=10.0)
STREAM_TIMEOUT = httpx.Timeout(None, connect=10.0)  # a turn takes as long as it takes
WHO = "corral chat"


def add_verb(verbs: argparse._SubParsersAction) -> None:
    chat = verbs.add_parser(
        "chat", help="chat with an agent in the terminal",
        description="Chat with an agent, streaming; local runtime, or a server with --url. A tool call "
                    "waiting on `ask` asks allow? [y/N]. Ctrl-C cancels the running turn; Ctrl-C at the "
                    "prompt exits 130, Ctrl-D exits 0. In process, the log (MCP servers' stderr "
                    "included) is $CORRAL_STATE_DIR/chat.log.",
    )
    chat.add_argument("agent", metavar="AGENT", help="agent name, or name@sha256:…")
    chat.add_argument("--url", help="a running Corral server, e.g. http://127.0.0.1:8420")
    chat.add_argument("--dir", default=None, help="definition directory for the local runtime")
    chat.add_argument("--api-key", default=None, help="bearer key for --url (default $CORRAL_API_KEY)")
    chat.set_defaults(func=cmd_chat)


def cmd_chat(args: argparse.Namespace) -> int:
    try:
        return anyio.run(_chat, args)
    except BaseException as exc:  # re-raised as it was, or as the one error it holds
        plain = _plain(exc, args.url)
        if plain is exc:
            raise
        raise plain from None


async def _chat(args: argparse.Namespace) -> int:
    backend: Local | Remote
    if args.url:
        backend = Remote(args.url, args.api_key or os.environ.get("CORRAL_API_KEY"))
    else:
        from .running import settings_from

        backend = Local(settings_from(args))
    async with backend.open(args.agent) as banner:
        keyboard = Keyboard(sys.stdin.fileno())
        chat = Chat(backend, Terminal(sys.stdout, sys.stderr), keyboard, sys.stdin.isatty())
        chat.term.line(f"[{banner}{'; Ctrl-C cancels a turn, Ctrl-D exits' if chat.interactive else ''}]")
        return await chat.run()


def _plain(exc: BaseException, url: str | None) -> BaseException:
    """The one error inside task groups' exception groups; a transport failure as `unreachable`."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, httpx.TransportError):
        reason = _one_line(str(exc)) or type(exc).__name__
        return CorralError(f"cannot reach {url}: {reason}", code="unreachable")
    return exc


# --- where the agent runs ------------------------------------------------------------------------


class Local:
    """The agent in this process: the service's conversations and its permission broker."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.service: Any = None
        self.conversation_id = ""

    @asynccontextmanager
    async def open(self, agent: str) -> AsyncIterator[str]:
        from ..service import open_service

        log_file = _log_to_file(self.settings)
        async with open_service(self.settings) as service:
            self.service = service
            conversation = await service.conversations.create(agent, WHO, {"source": "chat"})
            self.conversation_id = conversation.id
            yield (f"{conversation.agent_name} {conversation.digest[:19]}... conversation {conversation.id}; "
                   f"log {log_file}")

    async def turn(self, text: str, on_event: OnEvent) -> None:
        conversations = self.service.conversations
        turn = await conversations.send(self.conversation_id, text, if_busy="enqueue")
        async for event in conversations.events(self.conversation_id, after=turn.started_seq - 1,
                                                until_turn=turn.id):
            if event is not None:
                await on_event(event.name, event.data)

    async def decide(self, request_id: str, allow: bool) -> str | None:
        """Answer a permission request; a message when it could not be (decided already, expired)."""
        try:
            await self.service.permissions.decide(self.conversation_id, request_id, allow, WHO)
        except RequestError as exc:
            return exc.message
        return None

    async def interrupt(self) -> None:
        await self.service.conversations.interrupt(self.conversation_id)


def _log_to_file(settings: Settings) -> Path:
    """Send the log (MCP servers' stderr included) to the state directory, not to the terminal."""
    path = settings.state_dir / "chat.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    logs.configure(settings.log_level, settings.log_format)
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(path.open("a", encoding="utf-8"))
    return path


class Remote:
    """The agent on a Corral server, through its HTTP API."""

    def __init__(self, url: str, key: str | None):
        self.url = url
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.client: httpx.AsyncClient | None = None
        self.path = ""

    @asynccontextmanager
    async def open(self, agent: str) -> AsyncIterator[str]:
        async with httpx.AsyncClient(base_url=self.url, headers=self.headers,
                                     timeout=REQUEST_TIMEOUT) as client:
            self.client = client
            body = {"agent": agent, "title": WHO, "metadata": {"source": "chat"}}
            created = await self._call("/v1/conversations", body, expect=201)
            self.path = f"/v1/conversations/{created['id']}"
            yield f"{created.get('agent_name', agent)} {str(created.get('digest'))[:19]}... " \
                  f"conversation {created['id']} on {self.url}"

    async def _call(self, path: str, body: dict[str, Any] | None = None, expect: int = 200) -> Any:
        assert self.client is not None
        response = await self.client.post(path, json=body)
        if response.status_code != expect:
            raise refused(response, self.url)
        return response.json()

    async def turn(self, text: str, on_event: OnEvent) -> None:
        assert self.client is not None
        body = {"content": text, "stream": True, "if_busy": "enqueue"}
        async with self.client.stream("POST", f"{self.path}/messages", json=body,
                                      timeout=STREAM_TIMEOUT) as response:
            if response.status_code != 200:
                await response.aread()
                raise refused(response, self.url)
            async for name, data in _sse(response.aiter_lines()):
                await on_event(name, data)

    async def decide(self, request_id: str, allow: bool) -> str | None:
        try:
            await self._call(f"{self.path}/permissions/{request_id}",
                             {"decision": "allow" if allow else "deny"})
        except CorralError as exc:
            if exc.code not in ("conflict", "not_found"):
                raise
            return exc.message
        return None

    async def interrupt(self) -> None:
        await self._call(f"{self.path}/interrupt")


async def _sse(lines: AsyncIterator[str]) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """Server-sent events as (name, data), data parsed as JSON."""
    name, data = "message", []
    async for line in lines:
        if not line:
            if data:
                yield name, json.loads("\n".join(data))
            name, data = "message", []
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[6:] if line.startswith("data: ") else line[5:])


def refused(response: httpx.Response, url: str) -> CorralError:
    """A server's error answer as one line, with the code it carries (the exit status is that code's)."""
    try:
        error = response.json()["error"]
        code, message = str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):  # not Corral's envelope: not a Corral server there
        kind = response.headers.get("content-type", "no content type").split(";")[0]
        code, message = "unreachable", f"not a Corral server? (answered {kind})"
    return CorralError(f"{url}: {response.status_code} {response.reason_phrase}: {_one_line(message)}",
                       code=code)


# --- the terminal ----------------------------------------------------------------------------------


class Keyboard:
    """Lines typed at a file descriptor, read when the event loop says it is readable (cancellable)."""

    def __init__(self, fd: int):
        self.fd = fd
        self.pending = b""
        self.eof = False
        self.pollable = True

    async def line(self) -> str | None:
        """The next line, without its end; None at EOF."""
        while b"\n" not in self.pending and not self.eof:
            await self._readable()
            chunk = os.read(self.fd, 65536)
            self.eof = not chunk
            self.pending += chunk
        if not self.pending:
            return None
        line, _, self.pending = self.pending.partition(b"\n")
        return line.decode("utf-8", "replace").rstrip("\r")

    async def _readable(self) -> None:
        if self.pollable:
            try:
                await anyio.wait_readable(self.fd)
            except OSError:  # a regular file or /dev/null: epoll refuses it, and it never blocks
                self.pollable = False

    def discard(self) -> None:
        """Forget what was read ahead (a Ctrl-C flushes the terminal's input too)."""
        self.pending = b""


class Terminal:
    """Answer text on `out`; status lines, questions and the spinner on `err`."""

    def __init__(self, out: TextIO, err: TextIO):
        self.out, self.err = out, err
        self.tty = err.isatty()
        self.width = shutil.get_terminal_size((100, 24)).columns if self.tty else 1000
        self.mid_text = False  # the answer text stopped mid-line
        self.open_question = False  # a question waits on its line
        self.spinning = False  # a spinner frame is on screen
        self.busy: str | None = None  # what the spinner says
        self.since = 0.0
        self.frame = 0

    def text(self, text: str) -> None:
        if text:
            self._clear()
            self.out.write(text)
            self.out.flush()
            self.mid_text = not text.endswith("\n")

    def line(self, text: str, *, clip: bool = False) -> None:
        """One line of its own on `err` (`clip`: cut to the terminal's width)."""
        self._clear()
        self.end_text()
        if self.open_question:
            self.err.write("\n")
            self.open_question = False
        limit = max(self.width - 1, 20)
        if clip and len(text) > limit:
            text = text[:limit - 3] + "..."
        self.err.write(text + "\n")
        self.err.flush()

    def ask(self, question: str) -> None:
        """A question on a line of its own, the cursor left after it for the answer."""
        self._clear()
        self.end_text()
        if self.open_question:
            self.err.write("\n")
        self.err.write(question)
        self.err.flush()
        self.open_question = True

    def answered(self, answer: str, echoed: bool) -> None:
        """The question has its answer: a terminal echoed it (and its newline), else it is written."""
        if not echoed:
            self.err.write(answer + "\n")
            self.err.flush()
        self.open_question = False

    def interrupted(self) -> None:
        """A Ctrl-C: off with the `^C` the terminal echoed (and the spinner), unless a question is open."""
        if self.tty and not self.open_question:
            self.err.write("\r\x1b[K")
            self.err.flush()
            self.spinning = False

    def prompt(self, text: str) -> None:
        self._clear()
        self.end_text()
        self.out.write(text)
        self.out.flush()

    def end_text(self) -> None:
        if self.mid_text:
            self.out.write("\n")
            self.out.flush()
            self.mid_text = False

    def doing(self, what: str | None) -> None:
        """What the spinner says from now on (None: no spinner)."""
        self._clear()
        self.busy, self.since = what, time.monotonic()

    def tick(self) -> None:
        elapsed = time.monotonic() - self.since
        if not self.tty or self.busy is None or self.mid_text or self.open_question or elapsed < SPIN_AFTER_S:
            return
        self.frame += 1
        self.err.write(f"\r{FRAMES[self.frame % len(FRAMES)]} {self.busy} {elapsed:.1f}s\x1b[K")
        self.err.flush()
        self.spinning = True

    def _clear(self) -> None:
        if self.spinning:
            self.err.write("\r\x1b[K")
            self.err.flush()
            self.spinning = False


# --- the conversation ------------------------------------------------------------------------------


@dataclass
class Turn:
    started: float = field(default_factory=time.monotonic)
    cancelling: bool = False
    streamed: bool = False  # message.delta came (else the answer is printed from turn.completed)
    ended: bool = False

    def elapsed(self) -> str:
        return f"{time.monotonic() - self.started:.1f}s"


class Chat:
    """The prompt, the turns, the permission questions and Ctrl-C, over one backend."""

    def __init__(self, backend: Local | Remote, term: Terminal, keyboard: Keyboard, interactive: bool):
        self.backend, self.term, self.keyboard = backend, term, keyboard
        self.interactive = interactive
        self.turn: Turn | None = None
        self.asking: anyio.CancelScope | None = None
        self.exit_code = 0
        self.tg: Any = None

    async def run(self) -> int:
        async with anyio.create_task_group() as tg:
            self.tg = tg
            with anyio.open_signal_receiver(signal.SIGINT) as signals:
                tg.start_soon(self._on_ctrl_c, signals)
                tg.start_soon(self._spin)
                await self._converse()
                tg.cancel_scope.cancel()
        return self.exit_code

    async def _converse(self) -> None:
        while True:
            if self.interactive:
                self.term.prompt("you> ")
            line = await self.keyboard.line()
            if line is None:  # EOF: a clean exit
                self.term.end_text()
                if self.interactive:
                    self.term.text("\n")
                return
            if line.strip():
                await self._run_turn(line.strip())

    async def _run_turn(self, text: str) -> None:
        self.turn = turn = Turn()
        self.term.doing("thinking")
        try:
            await self.backend.turn(text, self._on_event)
        finally:
            self.turn = None
            self.term.doing(None)
        if not turn.ended:
            self.term.line("[the event stream ended before the turn did]")

    async def _on_event(self, name: str, data: dict[str, Any]) -> None:
        turn = self.turn
        assert turn is not None
        if name == "permission.requested":
            await self._ask(turn, data)
        elif name == "turn.started" and turn.cancelling:  # a Ctrl-C before the turn had begun
            self.tg.start_soon(self._interrupt)
        show = SHOW.get(name)
        if show is not None:
            show(self.term, turn, data)

    async def _ask(self, turn: Turn, data: dict[str, Any]) -> None:
        if turn.cancelling:
            return  # the request ends with the turn
        self.term.doing(None)
        reason = f" ({data['reason']})" if data.get("reason") else ""
        self.term.ask(f"? {data.get('name')} {_json(data.get('arguments'))}{reason} allow? [y/N] ")
        with anyio.CancelScope(deadline=_deadline(data.get("expires_at"))) as scope:
            self.asking = scope
            answer = await self.keyboard.line()
        self.asking = None
        if scope.cancelled_caught:
            if not turn.cancelling:
                self.term.line("[no answer: the permission request expired]")
            return
        self.term.answered(answer or "", self.interactive)
        allow = (answer or "").strip().lower() in ("y", "yes")
        problem = await self.backend.decide(str(data["request_id"]), allow)
        if problem:
            self.term.line(f"[{problem}]")
        self.term.doing(f"running {data.get('name')}" if allow else "thinking")

    async def _on_ctrl_c(self, signals: AsyncIterator[int]) -> None:
        async for _ in signals:
            self.keyboard.discard()
            turn = self.turn
            if turn is None or turn.cancelling:  # at the prompt, or a second Ctrl-C: leave
                self.exit_code = EXIT_CANCELLED
                self.term.text("\n")  # off the line the terminal echoed ^C on
                self.tg.cancel_scope.cancel()
                continue
            self.term.interrupted()
            turn.cancelling = True
            self.term.doing("cancelling")
            if self.asking is not None:
                self.asking.cancel()
            self.tg.start_soon(self._interrupt)

    async def _interrupt(self) -> None:
        try:
            await self.backend.interrupt()
        except (CorralError, TimeoutError) as exc:
            self.term.line(f"[could not cancel the turn: {exc}]")

    async def _spin(self) -> None:
        while True:
            await anyio.sleep(SPIN_EVERY_S)
            self.term.tick()


# --- what each event shows ---------------------------------------------------------------------


def _delta(term: Terminal, turn: Turn, data: dict[str, Any]) -> None:
    turn.streamed = True
    term.text(str(data.get("text", "")))


def _tool_started(term: Terminal, turn: Turn, data: dict[str, Any]) -> None:
    term.line(f"> {data.get('name')} {_json(data.get('arguments'))}", clip=True)
    term.doing(f"running {data.get('name')}")


def _tool_finished(term: Terminal, turn: Turn, data: dict[str, Any]) -> None:
    mark = "! error from" if data.get("is_error") else "<"
    term.line(f"{mark} {data.get('name')}: {_one_line(str(data.get('content', '')))}", clip=True)
    term.doing("cancelling" if turn.cancelling else "thinking")


def _completed(term: Terminal, turn: Turn, data: dict[str, Any]) -> None:
    turn.ended = True
    if not turn.streamed and data.get("output"):
        term.text(str(data["output"]))
    usage = data.get("usage") or {}
    tokens = ""
    if usage.get("input_tokens") or usage.get("output_tokens"):
        tokens = f", {usage.get('input_tokens', 0)} in / {usage.get('output_tokens', 0)} out tokens"
    term.line(f"[done in {turn.elapsed()}{tokens}]")


def _failed(term: Terminal, turn: Turn, data: dict[str, Any]) -> None:
    turn.ended = True
    error = data.get("error") or {}
    term.line(f"[failed: {error.get('code')}: {_one_line(str(error.get('message', '')))}]")


def _cancelled(term: Terminal, turn: Turn, data: dict[str, Any]) -> None:
    turn.ended = True
    term.line(f"[cancelled after {turn.elapsed()}]")


def _noted(what: str) -> Callable[[Terminal, Turn, dict[str, Any]], None]:
    def show(term: Terminal, turn: Turn, data: dict[str, Any]) -> None:
        term.line(f"[{what}]")

    return show


SHOW: dict[str, Callable[[Terminal, Turn, dict[str, Any]], None]] = {
    "message.delta": _delta, "tool.started": _tool_started, "tool.finished": _tool_finished,
    "turn.completed": _completed, "turn.failed": _failed, "turn.cancelled": _cancelled,
    "turn.resumed": _noted("resumed after a restart"), "message.steered": _noted("steered"),
    "context.compacted": _noted("context compacted"),
}


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False) if value is not None else "{}"


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _deadline(expires_at: Any) -> float:
    """The event loop's time at which a permission request expires (never, when unknown)."""
    try:
        expires = datetime.fromisoformat(str(expires_at)).timestamp()
    except ValueError:
        return float("inf")
    return anyio.current_time() + max(expires - time.time(), 0.0)
