"""The terminal of `corral chat`: keys read without a thread (so Ctrl-C can abandon a read), and the
lines, questions and spinner it shows. Not responsible for what a turn does.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from typing import TextIO

import anyio

SPIN_AFTER_S = 0.3  # a turn that answers at once shows no spinner
SPIN_EVERY_S = 0.1
FRAMES = "|/-\\"


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


def one_line(text: str) -> str:
    """Text as one line: every run of white space a single space."""
    return re.sub(r"\s+", " ", text).strip()
