#!/usr/bin/env python3
"""PreToolUse hook: set one tool argument (`rewrite.py KEY VALUE`), allowing the call."""

import json
import sys

data = json.load(sys.stdin)
key, value = sys.argv[1], sys.argv[2]
updated = {**data["tool_input"], key: value}
print(json.dumps({
    "hookSpecificOutput": {
        "hookEventName": "PreToolUse",
        "permissionDecision": "allow",
        "permissionDecisionReason": f"{key} rewritten",
        "updatedInput": updated,
    }
}))
