"""PreToolUse hook: refuse rm-like commands.

Claude Code's hook protocol, so this script works unchanged under Claude Code
and under Corral (on the Bash tool of this example): one JSON object
on stdin; exit 0 allows; exit 2 blocks, and stderr is the reason given back
to the model.
"""

import json
import re
import sys

# A program that deletes files, at the start of a command or after a
# separator or a wrapper (sudo, xargs, env...), with or without a path.
RM_LIKE = re.compile(
    r"(?:^|[;&|(`]|\$\(|\b(?:sudo|xargs|env|nohup|command|exec)\s)\s*"
    r"(?:\S*/)?(?:rm|rmdir|unlink|shred|srm)(?=\s|$|[;&|)])"
    r"|\bfind\b.*\s-delete\b"
    r"|\bgit\s+clean\b"
)


def main() -> int:
    event = json.load(sys.stdin)
    command = (event.get("tool_input") or {}).get("command")
    if not isinstance(command, str):
        return 0  # not a command-running tool: nothing to check
    if RM_LIKE.search(command):
        print(f"Blocked by the block-rm hook: deleting files is not allowed here ({command!r}).",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
