"""Command tools: run one argv, without a shell, and return what it printed.

Each argv element is a template: a `{param}` value fills exactly its element,
so it can never split into more arguments or reach a shell. An element that
names a file of the definition directory (a key of `files`) runs as the
absolute path under `ctx.root`. `${VAR}` references are resolved in `env`
only, at call time, from `ctx.environ`: argv is readable by every local user
(`ps`), so secrets reach a command through its environment; a `${VAR}` in
argv is passed as written.

The command gets the minimal environment of `confinement` plus its own
`env`, never the server's, and `CORRAL_EXECUTION_KEY` when the call has a
key: the same on every attempt of the call, so a script with side effects can
recognize a repeat after a crash. It runs in a session of its own; when it ends,
times out, or its caller is cancelled, the whole process group is killed, so
nothing it started outlives the call. Resolved secret values are redacted
from what it prints (and the guard redacts every other known secret).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..compiler.definitions import ToolDefinition
from ..compiler.templates import SECRET_REF, MissingSecret, MissingValue, render
from ..deployment.vault import FileChanged
from ..messages import ToolSpec
from .base import MAX_OUTPUT_BYTES, ToolContext, ToolOutput
from .confinement import Redactor, child_environment
from .processes import Finished, StartFailed, run_process

STDERR_TAIL_BYTES = 4096


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
    """Replace every secret value resolved for this call in `text` (see `confinement.Redactor`)."""
    return Redactor(secrets).text(text)


class CommandTool:
    """A `Tool` definition with a `command` action, as a `ToolPort`."""

    def __init__(self, definition: ToolDefinition, *, output_limit: int = MAX_OUTPUT_BYTES):
        if definition.command is None:
            raise ValueError(f"tool {definition.name!r} has no command")
        self.definition = definition
        self.command = definition.command
        self.output_limit = output_limit
        self.spec = ToolSpec(definition.name, definition.description, definition.input_schema)
        self.replay_safe = definition.replay_safe

    async def call(self, arguments: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        secrets: set[str] = set()
        try:
            argv = self._argv(arguments, ctx)
            env = self._env(ctx, secrets)
            cwd = self._cwd(ctx.root)
            return await self._run(argv, cwd, env, secrets)
        except MissingValue as exc:
            return ToolOutput(f"missing value for placeholder {{{exc.args[0]}}}", is_error=True)
        except MissingSecret as exc:
            return ToolOutput(f"environment variable {exc.args[0]} is not set", is_error=True)
        except (CommandFailed, FileChanged) as exc:
            return ToolOutput(str(exc), is_error=True)

    def _argv(self, arguments: Mapping[str, Any], ctx: ToolContext) -> list[str]:
        files = self.definition.files
        argv = [
            str(ctx.files.resolve(ctx.root, item, files[item])) if item in files else render(item, arguments)
            for item in self.command["argv"]
        ]
        for index, item in enumerate(argv):
            if "\0" in item:  # the OS cannot pass one: say so rather than cut the argument short
                raise CommandFailed(f"argv[{index}] holds a NUL byte, which a command argument cannot carry")
        return argv

    def _env(self, ctx: ToolContext, secrets: set[str]) -> dict[str, str]:
        return child_environment({name: resolve_tracked(value, ctx.environ, secrets)
                                  for name, value in self.command.get("env", {}).items()},
                                 execution_key=ctx.execution_key)

    def _cwd(self, root: Path) -> Path:
        cwd = root / self.command["cwd"] if self.command.get("cwd") else root
        if not cwd.is_dir():
            raise CommandFailed(f"working directory not found: {self.command.get('cwd') or '.'}")
        return cwd

    async def _run(self, argv: list[str], cwd: Path, env: dict[str, str], secrets: set[str]) -> ToolOutput:
        timeout = float(self.command.get("timeout_s", 30.0))
        try:
            finished = await run_process(argv, cwd=cwd, env=env, timeout_s=timeout,
                                         output_limit=self.output_limit, stderr_tail=STDERR_TAIL_BYTES)
        except StartFailed as exc:
            raise CommandFailed(str(exc)) from None
        if finished.timed_out:
            return ToolOutput(f"timed out after {timeout:g}s", is_error=True)
        return _outcome(finished, secrets)


def _outcome(finished: Finished, secrets: set[str]) -> ToolOutput:
    out, err = finished.stdout, finished.stderr
    if finished.returncode == 0:
        return ToolOutput(redact(out.text(), secrets))
    # stderr says why; a program that reports failures on stdout gets its first lines shown instead.
    detail = err.tail_text() if err.total else out.text()[:STDERR_TAIL_BYTES].strip()
    message = f"command failed ({finished.status})" + (f"\n{detail}" if detail else "")
    return ToolOutput(redact(message, secrets), is_error=True)
