#!/usr/bin/env python3
"""UserPromptSubmit hook: add project context for the model."""

import json
import sys

data = json.load(sys.stdin)
print(json.dumps({
    "hookSpecificOutput": {
        "hookEventName": "UserPromptSubmit",
        "additionalContext": f"Sprint 42 is in progress (prompt was {len(data['prompt'])} chars).",
    }
}))
