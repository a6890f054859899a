"""`corral chat`: a conversation with an agent, for a person at a terminal.

The agent runs in this process (`Local`: the service's conversations and
permission broker), or on a server (`Remote`, with `--url`: the HTTP API);
both are in `chat_backends`, the keyboard and the screen in `terminal`.
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
  (`unreachable`); an answer that is not Corral's is one line too;
- a line starting with `/` is a command (`COMMANDS`): `/fork` forks the
  conversation at its end and goes on in the fork, `/compact` compacts its
  context now, `/context` shows how full the context window is, `/help`
  lists them, and an unknown one lists them too; `//text` sends `/text` to
  the agent.

Input is read from the stdin descriptor when the event loop says it is
readable, not by a thread, so a Ctrl-C can abandon a read; the terminal's
own line editing applies. In process, the log goes to
`$CORRAL_STATE_DIR/chat.log`, and with it what MCP servers write to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import anyio
import httpx

from ..errors import EXIT_CANCELLED, CorralError
from .chat_backends import Local, Remote
from .terminal import Keyboard, Terminal, one_line

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
                    "prompt exits 130, Ctrl-D exits 0. Commands: /fork forks the conversation at its end "
                    "and goes on in the fork; /compact compacts its context now; /context shows how "
                    "full the context window is; /help lists the commands. In process, the log (MCP "
                    "servers' stderr included) is $CORRAL_STATE_DIR/chat.log.",
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
    key = args.api_key or os.environ.get("CORRAL_API_KEY")
    if args.url:
        backend = Remote(args.url, key)
    else:
        backend = await _owner_or_local(args, key)
    async with backend.open(args.agent) as banner:
        keyboard = Keyboard(sys.stdin.fileno())
        chat = Chat(backend, Terminal(sys.stdout, sys.stderr), keyboard, sys.stdin.isatty())
        keys = "; Ctrl-C cancels a turn, Ctrl-D exits, /help lists commands"
        chat.term.line(f"[{banner}{keys if chat.interactive else ''}]")
        return await chat.run()


async def _owner_or_local(args: argparse.Namespace, key: str | None) -> Local | Remote:
    """In this process, owning the state directory; or, when a server owns it, on that server (running
    the turns here would take its turns over: CONTRACT §7)."""
    from ..errors import StateOwned
    from ..store.ownership import claim, wait_for_url
    from .running import settings_from

    settings = settings_from(args)
    try:
        owned = claim(settings, "chat")  # held until the process exits (open_service claims it again)
    except StateOwned as exc:
        url = exc.url or await anyio.to_thread.run_sync(wait_for_url, exc)
        if url is None:
            raise  # its owner serves no URL (another chat, `corral mcp`): one line, exit 3
        return Remote(url, key, owner=exc.record.get("pid"))
    return Local(settings, owned)


def _plain(exc: BaseException, url: str | None) -> BaseException:
    """The one error inside task groups' exception groups; a transport failure as `unreachable`."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, httpx.TransportError):
        reason = one_line(str(exc)) or type(exc).__name__
        return CorralError(f"cannot reach {url}: {reason}", code="unreachable")
    return exc


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
            text = line.strip()
            if text.startswith("/") and not text.startswith("//"):
                await self._command(text)
            elif text:
                await self._run_turn(text[1:] if text.startswith("//") else text)

    async def _command(self, text: str) -> None:
        """A `/command` line: run it, or list the commands (`/help`, or one unknown)."""
        name = text.split(maxsplit=1)[0]
        command = COMMANDS.get(name)
        if command is None or command.run is None:
            if command is None:
                self.term.line(f"[unknown command {name}]")
            for known, entry in COMMANDS.items():
                self.term.line(f"[{known}: {entry.does}]")
            return
        try:
            await command.run(self)
        except CorralError as exc:
            if exc.code == "unreachable":
                raise
            self.term.line(f"[{name} failed: {exc.code}: {one_line(exc.message)}]")

    async def _fork(self) -> None:
        source = self.backend.conversation
        forked = await self.backend.fork()
        self.term.line(f"[forked {source} into conversation {forked}; this chat goes on in the fork]")

    async def _compact(self) -> None:
        done = await self.backend.compact()
        if not done.get("compacted"):
            self.term.line("[nothing to compact: no turn older than the ones kept]")
            return
        self.term.line(f"[compacted {done.get('messages')} messages: {done.get('before')} -> "
                       f"{done.get('after')} tokens]")

    async def _context(self) -> None:
        self.term.line(f"[{describe_context(await self.backend.context())}]")

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


@dataclass(frozen=True)
class Command:
    does: str  # one line, for /help
    run: Callable[[Chat], Awaitable[None]] | None = None  # None: list the commands


# The commands a line starting with `/` runs (a small table: add one with a line here).
COMMANDS: dict[str, Command] = {
    "/fork": Command("fork the conversation at its end and go on in the fork", Chat._fork),
    "/compact": Command("compact the conversation's context now (summarize or cut its older part)",
                        Chat._compact),
    "/context": Command("how full the context window is: tokens used, their source, compactions",
                        Chat._context),
    "/help": Command("list the commands"),
}


def describe_context(context: dict[str, Any]) -> str:
    """`GET …/context` in one line: `context: 1200 / 8000 tokens (15%, actual); ...`."""
    window, used = context.get("window"), context.get("used")
    if window:
        share = f"{100 * (used or 0) / window:.0f}%, "
        size = f"{used} / {window} tokens ({share}{context.get('source')})"
        where = f"compacts at {100 * float(context.get('threshold') or 0):.0f}%"
    else:
        size, where = f"{used} tokens ({context.get('source')})", "the model has no context_window"
    return f"context: {size}; {where}; {context.get('compactions', 0)} compaction(s) so far"


# --- what each event shows ---------------------------------------------------------------------


def _delta(term: Terminal, turn: Turn, data: dict[str, Any]) -> None:
    turn.streamed = True
    term.text(str(data.get("text", "")))


def _tool_started(term: Terminal, turn: Turn, data: dict[str, Any]) -> None:
    term.line(f"> {data.get('name')} {_json(data.get('arguments'))}", clip=True)
    term.doing(f"running {data.get('name')}")


def _tool_finished(term: Terminal, turn: Turn, data: dict[str, Any]) -> None:
    mark = "! error from" if data.get("is_error") else "<"
    term.line(f"{mark} {data.get('name')}: {one_line(str(data.get('content', '')))}", clip=True)
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
    term.line(f"[failed: {error.get('code')}: {one_line(str(error.get('message', '')))}]")


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


def _deadline(expires_at: Any) -> float:
    """The event loop's time at which a permission request expires (never, when unknown)."""
    try:
        expires = datetime.fromisoformat(str(expires_at)).timestamp()
    except ValueError:
        return float("inf")
    return anyio.current_time() + max(expires - time.time(), 0.0)
