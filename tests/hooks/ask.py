#!/usr/bin/env python3
"""PreToolUse hook: ask the user to confirm every call."""

import json
import sys

data = json.load(sys.stdin)
print(json.dumps({
    "hookSpecificOutput": {
        "hookEventName": "PreToolUse",
        "permissionDecision": "ask",
        "permissionDecisionReason": f"{data['tool_name']} needs a human",
    }
}))
