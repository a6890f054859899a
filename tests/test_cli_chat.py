"""`corral chat` as a person at a terminal uses it: driven through a pseudo-terminal.

Each chat runs as `python -m server.cli chat AGENT` with the pty as its
controlling terminal, so a typed ^C is the SIGINT a person's Ctrl-C is, and
^D an EOF. In process (`--dir`, a fresh CORRAL_STATE_DIR) or against a real
Corral on loopback (`--url`). Every wait is for text to show up on the
terminal (or a file to say something), bounded.

The scripted model asks for `risky` (`permission: ask`; it writes its
argument to `ran.log`, so whether it ran is read from disk) on "run X", for
`gate` (blocks until a file exists) on "wait PATH", and for the `noisy` MCP
server's echo on "echo X"; `noisy` writes a marker to its stderr first.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.support.servers import REPO, clean_environ, corral_server
from tests.support.trees import open_gate, write_tree

PY = sys.executable
FIXTURE = Path(__file__).resolve().parent / "mcp_fixture_server.py"
MARK = "MCP-STDERR-9f3c1a"
BOUND = 20.0
CANCELLED = 130
# Make the pty the child's controlling terminal (it is a session leader: start_new_session), then be corral.
CONTROLLING_TTY = ("import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
                   "os.execv(sys.executable, [sys.executable, '-m', 'server.cli', *sys.argv[1:]])")
NOT_TEXT = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")  # escape sequences (the spinner's) and carriage returns
RAN_PY = """import pathlib, sys
with (pathlib.Path(sys.argv[1]) / "ran.log").open("a") as log:
    log.write(sys.argv[2] + "\\n")
print("ran: " + sys.argv[2])
"""
HOLD_PY = """import pathlib, sys, time
gate = pathlib.Path(sys.argv[1])
gate.with_name(gate.name + ".entered").write_text("in")
while not gate.exists():
    time.sleep(0.01)
print("open")
"""
NOISY_PY = f"""import os, sys
print({MARK!r}, file=sys.stderr, flush=True)
os.execv(sys.executable, [sys.executable, {str(FIXTURE)!r}])
"""


def tool(name: str, argument: str, argv: list[str], permission: str = "allow") -> dict:
    return {"kind": "Tool", "name": name, "description": f"{name} {argument}", "permission": permission,
            "input_schema": {"type": "object", "properties": {argument: {"type": "string"}},
                             "required": [argument]},
            "command": {"argv": argv, "timeout_s": 30}}


def definitions(root: Path, marker_dir: Path) -> Path:

    def rule(when: str, tool: str, arguments: dict[str, str], reply: str) -> dict:
        return {"when": when, "tool_call": {"name": tool, "arguments": arguments}, "reply": reply}

    script = [
        rule("^run (?P<command>.+)$", "risky", {"command": "{command}"}, "tool said: {tool_result}"),
        rule("^wait (?P<path>\\S+)", "hold", {"path": "{path}"}, "passed the gate"),
        rule("^echo (?P<text>\\w+)", "noisy__echo", {"text": "{text}"}, "mcp said: {tool_result}"),
        # a summary shorter than what it replaces (an echo of it would be longer, and be dropped)
        {"when": "^The conversation to summarize", "reply": "they said one"},
    ]
    documents = [
        {"kind": "Model", "name": "scripted", "provider": "scripted", "script": script,
         "default": "echo: {input}"},
        tool("risky", "command", [PY, "scripts/ran.py", str(marker_dir), "{command}"], permission="ask"),
        tool("hold", "path", [PY, "scripts/hold.py", "{path}"]),
        {"kind": "MCPServer", "name": "noisy", "command": PY, "args": [str(root / "scripts" / "noisy.py")],
         "timeout_s": 10},
        {"kind": "Agent", "name": "careful", "model": "scripted", "tools": ["risky", "hold"]},
        {"kind": "Agent", "name": "plugged", "model": "scripted", "tools": ["noisy"]},
    ]
    scripts = {"scripts/ran.py": RAN_PY, "scripts/hold.py": HOLD_PY, "scripts/noisy.py": NOISY_PY}
    return write_tree(root, {**scripts, "defs.yaml": "\n---\n".join(json.dumps(d) for d in documents)})


class Served:
    def __init__(self, root: Path, url: str):
        self.defs = root / "defs"
        self.markers = root / "markers"
        self.url = url

    def ran(self) -> list[str]:
        log = self.markers / "ran.log"
        return log.read_text().splitlines() if log.exists() else []


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("chat")
    (root / "markers").mkdir()
    definitions(root / "defs", root / "markers")
    with corral_server(root / "defs", root / "server-state", shutdown_grace_s=1) as url:
        yield Served(root, url)


class Terminal:
    """`corral chat ARGS` on a pseudo-terminal: what it shows, read as it comes, and keys typed at it."""

    def __init__(self, args: list[str], env: dict[str, str], *, stderr_apart: bool = False):
        self.master, slave = os.openpty()
        termios.tcsetwinsize(self.master, (40, 200))
        self.proc = subprocess.Popen(
            [PY, "-c", CONTROLLING_TTY, "chat", *args], cwd=REPO, env=env, stdin=slave, stdout=slave,
            stderr=subprocess.PIPE if stderr_apart else slave, start_new_session=True)
        os.close(slave)
        self.raw = bytearray()
        self.seen = 0  # how much of `text` earlier expectations consumed
        self.closed = False
        self.changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 4096)
            except OSError:  # EIO once the chat (every holder of the other end) is gone
                chunk = b""
            with self.changed:
                self.raw += chunk
                self.closed = not chunk
                self.changed.notify_all()
                if not chunk:
                    return

    @property
    def text(self) -> str:
        return NOT_TEXT.sub("", self.raw.decode("utf-8", "replace"))

    def expect(self, wanted: str, bound: float = BOUND) -> str:
        """Wait for `wanted` past what earlier calls consumed; returns the text up to it, and consumes it."""
        with self.changed:
            self.changed.wait_for(lambda: wanted in self.text[self.seen:] or self.closed, bound)
            text = self.text
            at = text.find(wanted, self.seen)
            if at < 0:
                raise AssertionError(f"{wanted!r} did not show within {bound}s; the terminal shows:\n{text}")
            shown, self.seen = text[self.seen:at + len(wanted)], at + len(wanted)
            return shown

    def type(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\r")

    def ctrl_c(self) -> None:
        os.write(self.master, b"\x03")

    def ctrl_d(self) -> None:
        os.write(self.master, b"\x04")

    def exit_status(self, bound: float = BOUND) -> int:
        return self.proc.wait(bound)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        os.close(self.master)


@contextmanager
def chat(mode: str, served: Served, state: Path, agent: str = "careful") -> Iterator[Terminal]:
    where = ["--url", served.url] if mode == "remote" else ["--dir", str(served.defs)]
    term = Terminal([agent, *where], clean_environ({"CORRAL_STATE_DIR": str(state)}))
    try:
        yield term
    finally:
        term.close()


def conversation_id(banner: str) -> str:
    found = re.search(r"conversation (conv_\w+)", banner)
    assert found, banner
    return found.group(1)


MODES = pytest.mark.parametrize("mode", ["local", "remote"])


@MODES
def test_a_permission_prompt_answered_y_runs_the_tool_and_n_refuses_it(mode: str, served: Served,
                                                                        tmp_path: Path) -> None:
    yes, no = f"yes-{mode}", f"no-{mode}"
    with chat(mode, served, tmp_path / "state") as term:
        term.expect("you> ")
        term.type(f"run {yes}")
        asked = term.expect("allow? [y/N] ")
        assert f'risky {{"command": "{yes}"}}' in asked
        term.type("y")
        assert f"tool said: ran: {yes}" in term.expect("you> ")
        assert yes in served.ran()

        term.type(f"run {no}")
        term.expect("allow? [y/N] ")
        term.type("n")
        answer = term.expect("you> ")
        assert "tool said: permission denied for risky: denied by a person" in answer
        assert no not in served.ran()

        term.ctrl_d()
        assert term.exit_status() == 0


def wait_for_file(path: Path, bound: float = BOUND) -> None:
    deadline = time.monotonic() + bound
    while not path.exists():
        assert time.monotonic() < deadline, f"no {path} within {bound}s"
        time.sleep(0.02)


@MODES
def test_ctrl_c_cancels_the_running_turn_and_at_an_empty_prompt_exits_130(mode: str, served: Served,
                                                                          tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    try:
        with chat(mode, served, tmp_path / "state") as term:
            banner = term.expect("you> ")
            term.type(f"wait {gate}")
            wait_for_file(tmp_path / "gate.entered")  # the turn is in the tool, which blocks
            term.ctrl_c()
            cancelled = term.expect("[cancelled after ")
            assert "passed the gate" not in cancelled
            term.expect("you> ")
            term.type("hello again")
            assert "echo: hello again" in term.expect("[done in ")
            term.expect("you> ")
            if mode == "remote":
                turns = httpx.get(f"{served.url}/v1/conversations/{conversation_id(banner)}/turns",
                                  trust_env=False, timeout=10).json()["items"]
                assert [t["status"] for t in turns] == ["cancelled", "completed"]
            term.ctrl_c()  # now at an empty prompt: leave, the shell's prompt on a line of its own
            assert term.exit_status() == CANCELLED
            assert term.expect("\n") == "^C\n"
            assert "Traceback" not in term.text
    finally:
        open_gate(gate)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def not_corral() -> Iterator[str]:
    """An HTTP server that is not Corral: it answers POST 501 with a page of HTML."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def unstartable(case: str, served: Served) -> Iterator[list[str]]:
    """The arguments of a chat that cannot start."""
    if case == "not-corral":
        with not_corral() as url:
            yield ["careful", "--url", url]
    elif case == "closed-port":
        yield ["careful", "--url", f"http://127.0.0.1:{closed_port()}"]
    else:
        yield ["no-such-agent", "--dir", str(served.defs)]


@pytest.mark.parametrize(("case", "status"), [("closed-port", 3), ("not-corral", 3), ("unknown-agent", 2)])
def test_a_chat_that_cannot_start_prints_one_line(case: str, status: int, served: Served,
                                                  tmp_path: Path) -> None:
    with unstartable(case, served) as args:
        term = Terminal(args, clean_environ({"CORRAL_STATE_DIR": str(tmp_path / "state")}), stderr_apart=True)
        try:
            _, err = term.proc.communicate(timeout=BOUND)
        finally:
            term.close()
    lines = err.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err.decode()
    assert term.proc.returncode == status
    if case == "closed-port":
        assert lines[0].startswith(f"error: cannot reach {args[2]}: ")


def test_mcp_servers_stderr_goes_to_the_log_not_the_terminal(served: Served, tmp_path: Path) -> None:
    with chat("local", served, tmp_path / "state", agent="plugged") as term:
        term.expect("you> ")
        term.type("echo hi")
        assert "mcp said: hi" in term.expect("you> ")
        log = tmp_path / "state" / "chat.log"
        deadline = time.monotonic() + BOUND
        while not (log.exists() and MARK in log.read_text()):
            assert time.monotonic() < deadline, f"no {MARK} in {log} within {BOUND}s"
            time.sleep(0.02)
        assert MARK not in term.text
        term.ctrl_d()
        assert term.exit_status() == 0
    assert MARK not in term.text


@MODES
def test_fork_goes_on_in_a_fork_and_an_unknown_command_lists_the_commands(mode: str, served: Served,
                                                                         tmp_path: Path) -> None:
    with chat(mode, served, tmp_path / "state") as term:
        source = conversation_id(term.expect("you> "))
        term.type("hello")
        assert "echo: hello" in term.expect("you> ")
        term.type("/fork")
        shown = term.expect("you> ")
        found = re.search(rf"\[forked {source} into conversation (conv_\w+);", shown)
        assert found, shown
        fork = found.group(1)
        term.type("after the fork")
        assert "echo: after the fork" in term.expect("you> ")
        term.type("/nope")
        listed = term.expect("you> ")
        assert "[unknown command /nope]" in listed and "[/fork: " in listed and "[/help: " in listed
        term.type("//fork is text")
        assert "echo: /fork is text" in term.expect("you> ")
        if mode == "remote":
            def read(cid: str, tail: str = "") -> dict:
                url = f"{served.url}/v1/conversations/{cid}{tail}"
                return httpx.get(url, trust_env=False, timeout=10).json()

            def said(cid: str) -> list[str]:
                return [m["content"] for m in read(cid, "/messages")["items"] if m["role"] == "user"]

            assert read(fork)["forked_from"] == {"conversation_id": source, "turn_id": None}
            assert said(fork) == ["hello", "after the fork", "/fork is text"]
            assert said(source) == ["hello"]
        term.ctrl_d()
        assert term.exit_status() == 0


@MODES
def test_compact_and_context_commands(mode: str, served: Served, tmp_path: Path) -> None:
    with chat(mode, served, tmp_path / "state") as term:
        term.expect("you> ")
        term.type("/compact")  # no turn yet: nothing older than the two kept
        assert "[nothing to compact" in term.expect("you> ")
        for text in ("one", "two", "three"):  # long enough that a summary of them is shorter
            term.type(f"{text} {'and so on ' * 60}")
            assert f"echo: {text} and so on" in term.expect("you> ")
        term.type("/compact")  # the first turn is summarized (by the agent's own scripted model)
        assert re.search(r"\[compacted 2 messages: \d+ -> \d+ tokens\]", term.expect("you> "))
        term.type("/context")
        shown = term.expect("you> ")
        assert re.search(r"\[context: \d+ tokens \(estimated\); the model has no context_window; "
                         r"1 compaction\(s\) so far\]", shown), shown
        term.ctrl_d()
        assert term.exit_status() == 0
