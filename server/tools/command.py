"""Command tools: run one argv, without a shell, and return what it printed.

Each argv element is a template: a `{param}` value fills exactly its element,
so it can never split into more arguments or reach a shell. An element that
names a file of the definition directory (a key of `files`) runs as the
absolute path under `ctx.root`. `${VAR}` references are resolved in `env`
only, at call time, from `ctx.environ`: argv is readable by every local user
(`ps`), so secrets reach a command through its environment; a `${VAR}` in
argv is passed as written.

The command runs in a session of its own; when it ends, times out, or its
caller is cancelled, the whole process group is killed, so nothing it started
outlives the call. Resolved secret values are redacted from what it prints.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import ByteReceiveStream, Process

from ..definitions import ToolDefinition
from ..messages import ToolSpec
from ..templates import SECRET_REF, MissingSecret, MissingValue, render
from .base import MAX_OUTPUT_BYTES, ToolContext, ToolOutput

STDERR_TAIL_BYTES = 4096
REDACTED = "[redacted]"
_MIN_SECRET_LEN = 4  # shorter values would redact ordinary text; no real secret is that short


class CommandFailed(Exception):
    """A command could not be started; the message is safe to show the model."""


def resolve_tracked(text: str, environ: Mapping[str, str], secrets: set[str]) -> str:
    """Resolve `${VAR}` references like `templates.resolve_secrets`, noting each value taken from
    `environ` in `secrets` so that it can be redacted later (defaults are not secret)."""

    def value(match: Any) -> str:
        name, default = match.group(1), match.group(2)
        if name in environ:
            secrets.add(environ[name])
            return environ[name]
        if default is not None:
            return default
        raise MissingSecret(name)

    return SECRET_REF.sub(value, text)


def redact(text: str, secrets: set[str]) -> str:
    """Replace every secret value in `text`, longest first (one may contain another)."""
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= _MIN_SECRET_LEN:
            text = text.replace(secret, REDACTED)
    return text


@dataclass
class _Capture:
    """What one pipe carried: the first `limit` bytes, the last `tail` bytes, the total."""

    limit: int
    tail: int = 0
    head: bytearray = field(default_factory=bytearray)
    last: bytes = b""
    total: int = 0

    async def drain(self, stream: ByteReceiveStream) -> None:
        # Read to the end even past the cap: a writer blocked on a full pipe would never exit.
        async for chunk in stream:
            self.total += len(chunk)
            if len(self.head) < self.limit:
                self.head += chunk[: self.limit - len(self.head)]
            if self.tail:
                self.last = (self.last + chunk)[-self.tail :]

    def text(self) -> str:
        if self.total <= self.limit:
            return bytes(self.head).decode("utf-8", errors="replace")
        kept = bytes(self.head).decode("utf-8", errors="ignore")
        return kept + f"\n[output truncated: {self.total} bytes, limit {self.limit}]"

    def tail_text(self) -> str:
        cut = "[...]\n" if self.total > len(self.last) else ""
        return cut + self.last.decode("utf-8", errors="replace").strip()


class CommandTool:
    """A `Tool` definition with a `command` action, as a `ToolPort`."""

    def __init__(self, definition: ToolDefinition, *, output_limit: int = MAX_OUTPUT_BYTES):
        if definition.command is None:
            raise ValueError(f"tool {definition.name!r} has no command")
        self.definition = definition
        self.command = definition.command
        self.output_limit = output_limit
        self.spec = ToolSpec(definition.name, definition.description, definition.input_schema)

    async def call(self, arguments: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        secrets: set[str] = set()
        try:
            argv = self._argv(arguments, ctx.root)
            env = self._env(ctx.environ, secrets)
            cwd = self._cwd(ctx.root)
            return await self._run(argv, cwd, env, secrets)
        except MissingValue as exc:
            return ToolOutput(f"missing value for placeholder {{{exc.args[0]}}}", is_error=True)
        except MissingSecret as exc:
            return ToolOutput(f"environment variable {exc.args[0]} is not set", is_error=True)
        except CommandFailed as exc:
            return ToolOutput(str(exc), is_error=True)

    def _argv(self, arguments: Mapping[str, Any], root: Path) -> list[str]:
        files = self.definition.files
        return [
            str(root / item) if item in files else render(item, arguments)
            for item in self.command["argv"]
        ]

    def _env(self, environ: Mapping[str, str], secrets: set[str]) -> dict[str, str]:
        env = dict(os.environ)
        for name, value in self.command.get("env", {}).items():
            env[name] = resolve_tracked(value, environ, secrets)
        return env

    def _cwd(self, root: Path) -> Path:
        cwd = root / self.command["cwd"] if self.command.get("cwd") else root
        if not cwd.is_dir():
            raise CommandFailed(f"working directory not found: {self.command.get('cwd') or '.'}")
        return cwd

    async def _run(self, argv: list[str], cwd: Path, env: dict[str, str], secrets: set[str]) -> ToolOutput:
        timeout = float(self.command.get("timeout_s", 30.0))
        out = _Capture(self.output_limit)
        err = _Capture(self.output_limit, tail=STDERR_TAIL_BYTES)
        process = await _start(argv, cwd, env)
        swept = False
        try:
            with anyio.move_on_after(timeout) as deadline:
                async with anyio.create_task_group() as group:
                    group.start_soon(out.drain, process.stdout)
                    group.start_soon(err.drain, process.stderr)
                    await process.wait()
                    # The leader is done: whatever it left behind in its group goes too,
                    # which also closes pipes a background child still holds.
                    _kill_group(process.pid)
                    swept = True
        finally:
            with anyio.CancelScope(shield=True):
                if not swept:  # timed out or cancelled
                    _kill_group(process.pid)
                await process.aclose()
        if deadline.cancelled_caught:
            return ToolOutput(f"timed out after {timeout:g}s", is_error=True)
        return _outcome(process.returncode, out, err, secrets)


async def _start(argv: list[str], cwd: Path, env: dict[str, str]) -> Process:
    try:
        return await anyio.open_process(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
    except FileNotFoundError:
        raise CommandFailed(f"program not found: {argv[0]}") from None
    except PermissionError:
        raise CommandFailed(f"program is not executable: {argv[0]}") from None
    except OSError as exc:
        raise CommandFailed(f"cannot start {argv[0]}: {exc.strerror or exc}") from None


def _kill_group(pgid: int) -> None:
    # start_new_session made the command a session (and group) leader: its pid is the group id.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _outcome(code: int | None, out: _Capture, err: _Capture, secrets: set[str]) -> ToolOutput:
    if code == 0:
        return ToolOutput(redact(out.text(), secrets))
    status = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
    # stderr says why; a program that reports failures on stdout gets its first lines shown instead.
    detail = err.tail_text() if err.total else out.text()[:STDERR_TAIL_BYTES].strip()
    message = f"command failed ({status})" + (f"\n{detail}" if detail else "")
    return ToolOutput(redact(message, secrets), is_error=True)
