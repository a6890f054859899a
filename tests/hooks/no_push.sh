#!/bin/sh
# PreToolUse hook for Bash, in plain POSIX shell (no jq): refuse `git push`.
# The hook input is one JSON object on stdin; exit 2 blocks, and stderr is the reason.
input=$(cat)
case "$input" in
  *'"tool_name":"Bash"'* | *'"tool_name": "Bash"'*) ;;
  *) exit 0 ;;
esac
case "$input" in
  *'git push'*)
    echo "Blocked: git push needs a review first." >&2
    exit 2
    ;;
esac
exit 0
