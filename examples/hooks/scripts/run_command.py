"""The Bash tool of this example: a few shell-like commands, in pure Python, in a scratch folder.

Usage: run_command.py "COMMAND ARGS..."   (one argv element: Corral never splits it)

Commands: ls, cat, echo, touch, rm, pwd, date. Everything happens in
<temp dir>/corral-hooks-demo (created with two sample files); paths cannot
leave it. `rm` really deletes there, which is what the block-rm hook stops.
"""

import datetime
import os
import shlex
import sys
import tempfile

SCRATCH = os.path.join(tempfile.gettempdir(), "corral-hooks-demo")
SAMPLES = {"notes.txt": "Remember to write the README.\n", "todo.txt": "1. ship the hooks example\n"}


def inside(name: str) -> str:
    path = os.path.realpath(os.path.join(SCRATCH, name))
    if os.path.commonpath([path, os.path.realpath(SCRATCH)]) != os.path.realpath(SCRATCH):
        raise ValueError(f"{name}: outside the scratch folder")
    return path


def _cat(args: list[str]) -> str:
    out = []
    for a in args:
        with open(inside(a), encoding="utf-8") as f:
            out.append(f.read())
    return "".join(out)


def _touch(args: list[str]) -> str:
    for a in args:
        open(inside(a), "a").close()
    return ""


def _rm(args: list[str]) -> str:
    files = [a for a in args if not a.startswith("-")]
    for a in files:
        os.remove(inside(a))
    return f"removed {len(files)} file(s)"


COMMANDS = {
    "ls": lambda args: "\n".join(sorted(os.listdir(SCRATCH))),
    "cat": _cat,
    "echo": " ".join,
    "touch": _touch,
    "rm": _rm,
    "pwd": lambda args: SCRATCH,
    "date": lambda args: datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
}


def run(program: str, args: list[str]) -> str:
    if program not in COMMANDS:
        raise ValueError(f"{program}: command not found (try {', '.join(COMMANDS)})")
    return COMMANDS[program](args)


def main() -> int:
    if not os.path.isdir(SCRATCH):
        os.makedirs(SCRATCH)
        for name, text in SAMPLES.items():
            with open(os.path.join(SCRATCH, name), "w", encoding="utf-8") as f:
                f.write(text)
    try:
        words = shlex.split(sys.argv[1] if len(sys.argv) > 1 else "")
        if not words:
            raise ValueError("empty command")
        print(run(words[0], words[1:]))
    except (ValueError, OSError) as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
